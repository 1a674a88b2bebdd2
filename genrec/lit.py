"""The training LightningModule: `EvalModule` (backbone + evaluator, genrec/eval/module.py) plus the
objective, the optimiser and the per-epoch validation history (validation: the `trainer.val_users`
sample if set). `init_from` (a run dir or .ckpt) sets the backbone's starting weights, before the
objective sees it (S-DPO's frozen reference is a copy of it).
"""

from __future__ import annotations

import math
import re
import time

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from genrec.data.readers.common import DataError
from genrec.sid.codes import SemanticIds
from genrec.eval.module import EvalModule
from genrec.objectives.base import TrainContext
from genrec.runs import load_backbone_state


class NonFiniteLoss(FloatingPointError):
    pass


def last_batch_size(monitor: str) -> int | None:
    """B of `trainer.monitor=val/last_batch_loss@B` (the APAO release's model selection), else None."""
    m = re.fullmatch(r"val/last_batch_loss@(\d+)", str(monitor))
    return int(m[1]) if m else None


def updates_per_micro_batch(cfg: DictConfig) -> float | None:
    """protocol.micro_batches / trainer.accumulate: the reproduced recipe's micro-batches in one of ours, over
    all processes (e.g. the release's 8 per step as 2 accumulated x 2 processes x 2 halves: 4), else None."""
    want = (cfg.get("protocol") or {}).get("micro_batches")
    return None if want is None else want / cfg.trainer.accumulate


class GenRec(EvalModule):
    def __init__(self, cfg: DictConfig, sids: SemanticIds, item_counts, steps_per_epoch: int | None = None) -> None:
        """`steps_per_epoch`: only for use without a Trainer (benchmarks); under one, the schedule
        spans Lightning's `estimated_stepping_batches` (world size, accumulation, limits)."""
        super().__init__(cfg, sids)
        self.steps_per_epoch = steps_per_epoch
        if cfg.get("init_from"):
            try:
                self.backbone.load_state_dict(load_backbone_state(cfg.init_from))
            except RuntimeError as e:  # torch lists every missing, unexpected and mis-shaped weight, one per line
                first = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e))
                raise DataError(f"init_from={cfg.init_from}: its weights do not fit this model ({first[:300]}); "
                                f"it was trained with another backbone, tokenizer or catalogue") from None
        self.objective = instantiate(cfg.objective)
        ctx = TrainContext(sids, self._trie, item_counts, self.evaluator.beam, cfg.seed, updates_per_micro_batch(cfg),
                           self.evaluator.score, self.evaluator.temperature)
        self.objective.setup(ctx, self.backbone)
        self._finite: torch.Tensor | None = None  # per loss term: finite at every step since the last check
        self.history: list[dict] = []  # validation metrics per epoch (checkpointed)
        self.clock = (time.time(), 0.0)  # (this process's start, seconds its earlier processes ran: a resume's)
        # wall seconds in training epochs (validation excluded), over a resume's processes; None: not known (a
        # resume from a checkpoint written before genrec counted them)
        self.train_seconds: float | None = 0.0
        self._epoch_start: float | None = None
        self._last_batch_loss = float("nan")  # val/last_batch_loss@B, set by validation_step

    # ---- training -------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        self.objective.on_epoch_start(self.current_epoch)
        self._epoch_start = time.time()

    def _stop_epoch_clock(self) -> None:
        """Add the training part of this epoch (up to its validation or its end) to `train_seconds`."""
        if self._epoch_start is not None and self.train_seconds is not None:
            self.train_seconds += time.time() - self._epoch_start
            self._epoch_start = None

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        # Dropout depends only on (seed, epoch, batch, rank): a resumed run replays it exactly.
        torch.manual_seed(hash((int(self.cfg.seed), self.current_epoch, batch_idx, self.global_rank)) % 2**63)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, terms = self.objective(batch, self.backbone)
        self._terms = ["loss", *terms]
        finite = torch.stack([torch.isfinite(v).all() for v in (loss, *terms.values())])
        self._finite = finite if self._finite is None else self._finite & finite
        # Reading the flags waits for the device: on an accelerator only every log_every_n_steps.
        if self.device.type == "cpu" or (batch_idx + 1) % self.cfg.trainer.log_every_n_steps == 0:
            self._check_finite(f"batch {batch_idx}")
        bs = batch["target"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        self.log_dict({f"train/{k}": v.float() for k, v in terms.items()}, batch_size=bs)
        return loss

    def on_train_epoch_end(self) -> None:
        self._stop_epoch_clock()
        self._check_finite("epoch end")

    def _check_finite(self, where: str) -> None:
        """Raise if a loss term was non-finite at a step since the last check, on any process: every rank
        checks at the same steps and raises together (one rank stopping alone leaves the others waiting in
        the next gradient all-reduce)."""
        finite, self._finite = self._finite, None
        if finite is not None and self.trainer.world_size > 1:
            finite = self.trainer.strategy.reduce(finite.float(), reduce_op="min").bool()
        if finite is None or bool(finite.all()):
            return
        bad = [k for k, ok in zip(self._terms, finite.tolist()) if not ok]
        raise NonFiniteLoss(f"non-finite loss at epoch {self.current_epoch}, by step {self.global_step} ({where}): "
                            f"term(s) {', '.join(bad)}; try a lower optim.lr or trainer.gradient_clip")

    # ---- evaluation (EvalModule's, plus the training loss and the history) ------------
    def on_validation_start(self) -> None:
        self._stop_epoch_clock()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        if self.cfg.trainer.validate == "loss":  # the release's per-epoch evaluation: its loss, no beam search
            self._rows.append(self.evaluator.losses(self.backbone, batch))
        else:
            super().validation_step(batch, batch_idx)
        if self.cfg.trainer.monitor == "val/objective_loss":  # the APAO release selects on its training loss
            loss, _ = self.objective(batch, self.backbone)
            self._rows[-1]["objective_loss"] = loss.detach().float().expand(len(batch["index"]))
        if batch_idx == 0 and (size := last_batch_size(self.cfg.trainer.monitor)):
            self._last_batch_loss = self._loss_of_last_batch(size)

    def _loss_of_last_batch(self, size: int) -> float:
        """The objective's loss on ONE batch: the validation examples (in file order) that a sequential loader
        of `size` per batch puts last. The APAO release selects and stops early on that value (its
        CustomTrainer reads `model.total_loss` after the evaluation loop: the last forward's, e.g. the last 41
        of 4905 users at per_device_eval_batch_size=128). Every DDP rank computes the same value."""
        valid = self.trainer.datamodule.splits["valid"]
        n = len(valid)
        batch = valid[list(range((n - 1) // size * size, n))]
        loss, _ = self.objective({k: v.to(self.device) for k, v in batch.items()}, self.backbone)
        return float(loss)

    def on_validation_epoch_end(self) -> None:
        extra = {}
        if size := last_batch_size(self.cfg.trainer.monitor):
            extra[f"last_batch_loss@{size}"] = self._last_batch_loss
        metrics = self._eval_epoch_end("val", extra)
        if not self.trainer.sanity_checking:
            self.history.append({"epoch": self.current_epoch, **metrics, "seconds": round(self.elapsed(), 1)})

    def elapsed(self) -> float:
        """Wall seconds of the run so far, summed over the processes of a resumed run (each from its
        start, data stage included; what a kill threw away after the last checkpoint is not counted)."""
        return self.clock[1] + time.time() - self.clock[0]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["val_history"] = self.history
        checkpoint["elapsed"] = self.elapsed()
        checkpoint["train_elapsed"] = self.train_seconds

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A resume restores the history and the clocks; testing the best checkpoint keeps this run's."""
        if self._trainer is not None and self.trainer.state.fn != "fit":
            return
        self.history = checkpoint.get("val_history", [])
        self.clock = (self.clock[0], checkpoint.get("elapsed", 0.0))
        self.train_seconds = checkpoint.get("train_elapsed")

    # ---- optimisation ---------------------------------------------------------------
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """`trainer.clip_on: sum` reproduces the APAO release (HF Trainer 4.51 with a `**kwargs` forward never
        divides the loss by the accumulation count): the optimizer steps on, and clipping bounds, the SUM of the
        micro-batch gradients; Lightning's default (`mean`) divides by it."""
        if self.cfg.trainer.get("clip_on", "mean") == "sum":
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.trainer.accumulate_grad_batches)
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        o = self.cfg.optim
        params = [p for p in self.parameters() if p.requires_grad]  # S-DPO's reference is frozen
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=o.lr, betas=tuple(o.betas),
                                eps=o.eps)
        if self._trainer is not None:
            self.total_steps = int(self.trainer.estimated_stepping_batches)
        else:
            self.total_steps = self.steps_per_epoch * self.cfg.trainer.max_epochs
        total = max(1, self.total_steps)
        warmup = int(o.warmup * total)
        cooldown = o.cooldown * max(1, total - warmup)  # the cosine spans the last `cooldown` share
        start = total - cooldown

        def schedule(step: int) -> float:  # linear warm-up, flat, cosine from 1 to min_lr_ratio
            if step < warmup:
                return (step + 1) / (warmup + 1)
            progress = min(1.0, max(0.0, (step - start) / cooldown))
            return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

