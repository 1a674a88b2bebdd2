"""The objective interface: batch + backbone -> (loss, named terms to log).

A training batch is a dict of tensors (see `genrec.data.datamodule.collate`):
  history [B, L] long   flattened SID tokens of the history + eos, left-padded with 0
  mask    [B, L] bool   True on real history tokens
  target  [B, T] long   the target item's SID tokens (level-offset ids)
  target_cand [B] long  the target's candidate index (row of `SemanticIds.cand_codes`)
  index   [B] long      the example's index in the training split (seeded per-example
                        randomness, e.g. negatives, uses it so results do not depend on
                        batch order or the number of processes)

Objectives are `nn.Module`s: training state (e.g. APAO's adaptive weights) lives in
buffers, so it is checkpointed and restored with the LightningModule. To add one: one
file here with a subclass, one YAML under `conf/objective/` with its `_target_`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from genrec.sid.codes import SemanticIds
from genrec.sid.trie import Trie
from genrec.models.base import Backbone


@dataclass
class TrainContext:
    """What the training loop hands an objective once, before the first step."""

    sids: SemanticIds
    trie: Trie
    item_counts: np.ndarray  # [num_candidates] training-target frequency (popularity negatives)
    eval_beam: int  # the evaluator's beam width (BEAR's default B)
    seed: int
    # A reproduced recipe's micro-batches inside one of ours, over all processes (protocol.micro_batches /
    # trainer.accumulate): what an objective sets once per micro-batch there (APAO's prefix weights: a state's
    # step, or weights from that micro-batch's losses) it sets that often here. None: no recipe counts them.
    updates_per_micro_batch: float | None = None
    eval_score: str = "full"  # how the evaluator scores each step (the beam negatives search as it does)
    eval_temperature: float = 1.0


class Objective(nn.Module):
    # How `genrec.report` shows runs of this objective (it imports the class a run's objective._target_ names):
    label: ClassVar[str] = ""  # the table row's name; "" = the class name
    order: ClassVar[float] = 100.0  # rows sort by (order, label)
    ablations: ClassVar[dict[str, Any]] = {}  # config key -> default: another value gets its own row "label (key=value)"
    axes: ClassVar[tuple[tuple[str, str], ...]] = ()  # (rows, cols) of a sweep's heatmap when both keys vary
    fine_tunes: ClassVar[bool] = False  # always starts from a trained run (S-DPO); others: init_from = "(two-stage)"

    @classmethod
    def report_row(cls, cfg: dict) -> tuple[float, str]:
        """(order, label) of a run with objective config `cfg` in the report's table."""
        return cls.order, cls.label or cls.__name__

    @classmethod
    def ablation_defaults(cls, protocol: dict) -> dict[str, Any]:
        """`ablations` under a preset's `protocol` node (a preset may ask for another default)."""
        return cls.ablations

    @classmethod
    def state_per_micro_batch(cls, cfg: dict) -> str | None:
        """What this objective (config `cfg`) sets once per micro-batch, None if nothing (config_check: a preset
        reproducing another code's steps must then keep its micro-batches per step)."""
        return None

    def setup(self, ctx: TrainContext, backbone: Backbone) -> None:
        """Called once before training (and before a checkpoint is restored)."""
        self.ctx = ctx

    def on_epoch_start(self, epoch: int) -> None:
        """Called at the start of every training epoch (e.g. to resample negatives)."""

    def forward(self, batch: dict, backbone: Backbone) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError
