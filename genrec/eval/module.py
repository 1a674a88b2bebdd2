"""The evaluation LightningModule: backbone + evaluator, no objective (what `genrec.evaluate`
builds; `genrec.lit.GenRec` adds the objective and the training loop on top).

Validation and test run the evaluator (constrained beam search, optionally full ranking) on every
held-out example exactly once: each DDP rank evaluates its shard, the per-example rows are gathered,
de-duplicated by example index and only then summarised.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from genrec.data.datamodule import Examples
from genrec.runs import write_text
from genrec.sid.codes import SemanticIds
from genrec.sid.trie import Trie

# Every rank logs metrics summarised from the rows gathered over all ranks (_eval_epoch_end), so Lightning's
# advice to reduce them again (sync_dist=True) is a false alarm, printed once per metric under DDP.
warnings.filterwarnings("ignore", message=r".*sync_dist=True.* when logging on epoch level", category=UserWarning)


class EvalModule(L.LightningModule):
    def __init__(self, cfg: DictConfig, sids: SemanticIds) -> None:
        super().__init__()
        self.cfg, self.sids = cfg, sids
        T = sids.num_levels
        self.backbone = instantiate(cfg.backbone, vocab_size=sids.vocab_size,
                                    max_positions=cfg.dataset.max_history * T + T + 2)
        self.evaluator = instantiate(cfg.eval)
        self._trie = Trie(sids)
        self._rows: list[dict] = []
        self.last_metrics: dict[str, dict] = {}
        self.last_rows: dict[str, dict[str, torch.Tensor]] = {}  # per example, gathered: write_ranks

    @property
    def trie(self) -> Trie:
        if self._trie.offsets.device != self.device:
            self._trie = Trie(self.sids, self.device)
        return self._trie

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._rows.append(self.evaluator.per_example(self.backbone, self.trie, batch))

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._rows.append(self.evaluator.per_example(self.backbone, self.trie, batch))

    def _gather_rows(self) -> dict[str, torch.Tensor]:
        rows = {k: torch.cat([r[k] for r in self._rows]) for k in self._rows[0]} if self._rows else {}
        self._rows = []
        if self.trainer.world_size > 1:
            n = int(self.all_gather(torch.tensor(len(rows["index"]), device=self.device)).max())
            padded = {}
            for k, v in rows.items():
                v = v.long() if v.dtype == torch.bool else v  # gloo gathers no bools
                pad = torch.full((n - len(v), *v.shape[1:]), -1, dtype=v.dtype, device=v.device)
                padded[k] = self.all_gather(torch.cat([v, pad])).flatten(0, 1)
                padded[k] = padded[k].bool() if rows[k].dtype == torch.bool else padded[k]
            keep = padded["index"] >= 0
            rows = {k: v[keep] for k, v in padded.items()}
        _, first = unique_first(rows["index"])
        return {k: v[first].cpu() for k, v in rows.items()}

    def _eval_epoch_end(self, prefix: str, extra: dict[str, float] | None = None) -> dict[str, float]:
        """Summarise the gathered rows, plus `extra` values every rank computed alike; log them."""
        rows = self._gather_rows()
        metrics = self.evaluator.summarize(rows)
        metrics["users"] = float(len(rows["index"]))
        metrics.update(extra or {})
        # Every rank holds the same gathered rows, so no further reduction is needed.
        self.log_dict({f"{prefix}/{k}": float(v) for k, v in metrics.items()}, sync_dist=False)
        self.last_metrics[prefix] = metrics
        self.last_rows[prefix] = rows
        return metrics

    def write_ranks(self, path: Path, examples: Examples, prefix: str = "test") -> None:
        """The last `prefix` evaluation of `examples` (the split it scored) per example, as CSV (atomically):
        `example` (its index), `user`, `item` (the held-out target), `rank` (the target's 1-based rank in the
        beam list, 0 = not returned) and with full ranking `full_rank`: what a paired comparison of two runs
        over the same users needs (genrec.report.paired)."""
        rows = self.last_rows[prefix]
        index = rows["index"].long().numpy()
        cols = {"example": index, "user": examples.pairs[index, 0], "item": examples.targets()[index],
                **{k: rows[k].long().numpy() for k in ("rank", "full_rank") if k in rows}}
        write_text(path, pd.DataFrame(cols).sort_values("example").to_csv(index=False))

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")


def unique_first(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique values of `index` and the position of each one's first occurrence."""
    uniq, inv = torch.unique(index, return_inverse=True)
    pos = torch.arange(len(index), device=index.device)
    first = torch.full((len(uniq),), len(index), dtype=torch.long, device=index.device).scatter_reduce(
        0, inv, pos, reduce="amin")
    return uniq, first
