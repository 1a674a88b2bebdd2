"""Negative samplers for the pairwise / pairwise_printed prefix losses and S-DPO.

Negatives are candidate ids (rows of `SemanticIds.cand_codes`, i.e. distinct codes), never the
target's. Every random draw is a counter-based hash of (seed, epoch // refresh_every, example
index, slot), computed on the device: the negatives of an example do not depend on batch order,
batch size or the number of processes, and change every `refresh_every` epochs.

kinds (config `negatives: {kind: ..., refresh_every: 1, alpha: 1.0, pool: 400}`):
  uniform     uniform over the other candidates, with replacement.
  popularity  proportional to (training-target count + 1) ** alpha over the other candidates.
  hard        the `num` highest-scoring of `pool` uniform draws, scored by the full-item
              log-prob S^T under the current model (no grad, re-using the batch's history
              encoding): one extra teacher-forced pass over `pool` candidates per step, no beam
              search. The pool is redrawn every refresh; the scoring uses the current weights.
  beam        the `num` best items other than the target of the model's own trie-constrained beam
              search (width num + 1, scored as the evaluator scores), no grad, re-using the batch's
              history encoding: the items the beam keeps against the target, searched with the model
              in its training mode (dropout on, as `hard`), so close to but not exactly the test-time
              beam. Drawn anew at every step; uniform draws fill the slots of a catalogue smaller than
              the beam. With `loss=pairwise_printed` the prefix loss is a listwise softmax over the
              beam's own items at every prefix length. Cost: one beam search per step (width num + 1):
              N = 20 costs ~0.9 CE steps more than 20 uniform negatives (benchmarks/objectives.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from genrec.eval.beam import beam_search
from genrec.models.base import Backbone

M32 = 0xFFFFFFFF


def _mul32(a: torch.Tensor | int, c: int) -> torch.Tensor | int:
    """(a * c) mod 2**32 for a in [0, 2**32), in int64 without overflow (16-bit halves)."""
    return ((a & 0xFFFF) * c + ((((a >> 16) * c) & 0xFFFF) << 16)) & M32


def _fmix32(h: torch.Tensor | int) -> torch.Tensor | int:
    """MurmurHash3's 32-bit finaliser."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def hash32(*keys: torch.Tensor | int, device: torch.device | str | None = None) -> torch.Tensor:
    """Well-mixed 32-bit values (int64 in [0, 2**32)) of broadcast integer keys. Python int keys
    are mixed on the host (the same arithmetic): no host-to-device copy per call."""
    h = 0
    for k in keys:
        k = (k.long() if isinstance(k, torch.Tensor) else int(k)) & M32
        h = _fmix32(_mul32(h, 0x01000193) ^ _fmix32(k ^ 0x9E3779B9))
    return torch.as_tensor(h, dtype=torch.long, device=device)


class Negatives(nn.Module):
    def __init__(self, kind: str = "uniform", refresh_every: int = 1, alpha: float = 1.0, pool: int = 400) -> None:
        super().__init__()
        if kind not in ("uniform", "popularity", "hard", "beam"):
            raise ValueError(f"unknown negative sampler {kind!r}")
        self.kind, self.refresh_every, self.alpha, self.pool = kind, refresh_every, alpha, pool
        self.epoch = 0

    def setup(self, ctx) -> None:
        """ctx: a `TrainContext` (catalogue, item counts, seed)."""
        self.seed = int(ctx.seed)
        self.num_candidates = ctx.sids.num_candidates
        if self.num_candidates < 2:
            raise ValueError("negative sampling needs at least 2 distinct item codes")
        self.register_buffer("cand_tokens", ctx.sids.cand_tokens(), persistent=False)
        weight = (torch.as_tensor(ctx.item_counts, dtype=torch.float64) + 1) ** self.alpha
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("cdf", weight.cumsum(0), persistent=False)
        self.trie, self.score, self.temperature = ctx.trie, ctx.eval_score, ctx.eval_temperature

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def draws(self, index: torch.Tensor, num: int) -> torch.Tensor:
        """[B, num] 32-bit draws for the examples `index` [B] in the current refresh period."""
        slot = torch.arange(num, device=index.device)
        return hash32(self.seed, self.epoch // self.refresh_every, index[:, None], slot[None], device=index.device)

    def uniform(self, index: torch.Tensor, target: torch.Tensor, num: int) -> torch.Tensor:
        """Uniform over the C - 1 candidates other than `target` [B] -> [B, num]."""
        r = (self.draws(index, num) * (self.num_candidates - 1)) >> 32
        return r + (r >= target[:, None]).long()

    def popularity(self, index: torch.Tensor, target: torch.Tensor, num: int) -> torch.Tensor:
        """Inverse-CDF sampling with the target's mass cut out of the interval (exact)."""
        cdf, weight = self.cdf.to(index.device), self.weight.to(index.device)
        u = self.draws(index, num).double() / 2.0**32
        w_t = weight[target][:, None]
        x = u * (cdf[-1] - w_t)
        x = x + w_t * (x >= (cdf[target] - weight[target])[:, None])
        neg = torch.searchsorted(cdf, x, right=True).clamp(max=self.num_candidates - 1)
        # Rounding at an interval edge could land on the target: step to its neighbour.
        return torch.where(neg == target[:, None], (neg + 1) % self.num_candidates, neg)

    @torch.no_grad()
    def hard(self, index: torch.Tensor, target: torch.Tensor, num: int, backbone: Backbone, enc: Any) -> torch.Tensor:
        pool = self.uniform(index, target, max(self.pool, num))  # [B, P]
        tokens = self.cand_tokens.to(index.device)[pool]  # [B, P, T]
        score = backbone.prefix_logprobs(enc, tokens[..., :-1], tokens).sum(-1)
        return pool.gather(1, score.topk(num, dim=1).indices)

    @torch.no_grad()
    def beam(self, index: torch.Tensor, target: torch.Tensor, num: int, backbone: Backbone, enc: Any) -> torch.Tensor:
        found = beam_search(backbone, enc, self.trie, num + 1, self.score, self.temperature).cands  # -1: none
        keep = (found >= 0) & (found != target[:, None])
        order = (~keep).to(torch.int8).sort(dim=1, stable=True).indices[:, :num]  # kept first, in beam order
        return torch.where(keep.gather(1, order), found.gather(1, order), self.uniform(index, target, num))

    def sample(self, batch: dict, num: int, backbone: Backbone | None = None, enc: Any = None) -> torch.Tensor:
        """[B, num] negative candidate ids for the batch (`hard` and `beam` need the backbone and `enc`)."""
        index, target = batch["index"], batch["target_cand"]
        if self.kind == "uniform":
            return self.uniform(index, target, num)
        if self.kind == "popularity":
            return self.popularity(index, target, num)
        by_model = self.hard if self.kind == "hard" else self.beam
        return by_model(index, target, num, backbone, enc)

    def with_positive(self, batch: dict, num: int, backbone: Backbone, enc: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(negatives [B, num], tokens [B, 1 + num, T]: the target's first, then the negatives')."""
        target = batch["target"]
        negs = self.sample(batch, num, backbone, enc)
        return negs, torch.cat([target[:, None], self.cand_tokens.to(target.device)[negs]], 1)


def make_negatives(cfg: Negatives | dict | None) -> Negatives:
    """A sampler from a config dict (`kind`, `refresh_every`, ...), an instance, or None (uniform)."""
    return cfg if isinstance(cfg, Negatives) else Negatives(**(cfg or {}))
