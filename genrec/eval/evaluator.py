"""Beam-search evaluation (plus optional exact full ranking) of one batch, and the metrics.

`per_example` returns per-example rows so the training loop can gather them from every
DDP rank, drop duplicated `index`es (padding of the distributed sampler) and only then
`summarize`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from genrec.eval import metrics
from genrec.eval.beam import SCORES, beam_search
from genrec.eval.fullrank import full_scores, rank_of, top_rank
from genrec.sid.trie import Trie
from genrec.models.base import Backbone


class Evaluator:
    def __init__(
        self, beam: int = 20, ks: Sequence[int] = (5, 10, 20), full_rank: bool = False, chunk: int = 4096,
        score: str = "full", temperature: float = 1.0,
    ) -> None:
        if score not in SCORES:
            raise ValueError(f"eval.score={score!r} must be one of {', '.join(SCORES)}")
        if not temperature > 0:
            raise ValueError(f"eval.temperature={temperature} must be positive")
        self.score, self.temperature = score, float(temperature)  # per-step scoring (genrec.eval.beam)
        self.beam = beam
        self.ks = [int(k) for k in ks]
        self.full_rank = full_rank
        self.chunk = chunk  # (user, prefix) rows per full-ranking decoder call (bounds its memory)

    @torch.no_grad()
    def per_example(self, backbone: Backbone, trie: Trie, batch: dict) -> dict[str, torch.Tensor]:
        """index [B]; rank [B] (target's 1-based rank in the beam list, 0 = not returned);
        prefix_hit [B, T] (target's m-prefix kept at step m); full_rank [B] if enabled: the exact rank, or
        max(ks) + 1 for any rank beyond max(ks) when beam >= max(ks) (see `genrec.eval.fullrank.top_rank`)."""
        enc = backbone.encode(batch["history"], batch["mask"])
        res = beam_search(backbone, enc, trie, self.beam, self.score, self.temperature)
        target = batch["target_cand"]
        hit = res.cands == target[:, None]
        rank = torch.where(hit.any(1), hit.int().argmax(1) + 1, 0)
        target_pid = trie.cand_prefix_id[target]  # [B, T + 1]
        kept = res.prefix_ids  # step m: [B, K_m]
        prefix_hit = torch.stack([(p == target_pid[:, m + 1, None]).any(1) for m, p in enumerate(kept)], 1)
        rows = {**self.losses(backbone, batch, enc), "rank": rank, "prefix_hit": prefix_hit}
        if self.full_rank:
            cap = max(self.ks)  # metrics only ask whether the exact rank is <= k
            if self.beam >= cap:  # at least `cap` items reach the beam's cap-th score: search above it only
                rows["full_rank"] = top_rank(backbone, enc, trie, target, res.scores[:, cap - 1], cap, self.chunk,
                                             self.score, self.temperature)
            else:
                scores = full_scores(backbone, enc, trie, self.chunk, self.score, self.temperature)
                rows["full_rank"] = rank_of(scores, target)
        return rows

    @torch.no_grad()
    def losses(self, backbone: Backbone, batch: dict, enc=None) -> dict[str, torch.Tensor]:
        """index [B]; loss [B]: the teacher-forced CE of each held-out target (no beam search)."""
        enc = backbone.encode(batch["history"], batch["mask"]) if enc is None else enc
        target_tokens = batch["target"][:, None]
        loss = -backbone.prefix_logprobs(enc, target_tokens[..., :-1], target_tokens)[:, 0].mean(-1)
        return {"index": batch["index"], "loss": loss}

    def summarize(self, rows: dict[str, torch.Tensor]) -> dict[str, float]:
        """The metrics of the rows present: beam metrics only where the rows hold ranks (`losses` alone: none)."""
        out = {}
        if "rank" in rows:
            rank = rows["rank"]
            for k in self.ks:
                out[f"recall@{k}"] = metrics.recall(rank, k)
                out[f"ndcg@{k}"] = metrics.ndcg(rank, k)
            for m, r in enumerate(metrics.prefix_recall(rows["prefix_hit"]), 1):
                out[f"prefix_recall@{m}"] = r
        if "full_rank" in rows:
            full = rows["full_rank"]
            for k in self.ks:
                out[f"full/recall@{k}"] = metrics.recall(full, k)
                out[f"full/ndcg@{k}"] = metrics.ndcg(full, k)
                out[f"pruning_rate@{k}"] = metrics.pruning_rate(full, rank, k)
        if "loss" in rows:
            out["loss"] = float(rows["loss"].float().mean())  # teacher-forced CE of the held-out targets
        if "objective_loss" in rows:  # the training objective's loss on validation batches (see GenRec)
            out["objective_loss"] = float(rows["objective_loss"].float().mean())
        return out
