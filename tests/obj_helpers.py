"""Shared helpers for the objective tests: fixed-logit and call-counting backbones, contexts,
and brute-force references (explicit loops over the catalogue)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from genrec.sid.codes import SemanticIds
from genrec.sid.trie import Trie
from genrec.models.base import EOS, Backbone
from genrec.objectives.base import TrainContext
from toy import ToyBackbone, random_batch, random_sids


class FixedLogits(Backbone):
    """Returns slices of one logits parameter [B, K, T + 1, V] whatever the prefix, so tests can
    check values and gradients of objectives directly against the raw logits."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.vocab_size = logits.shape[-1]
        self.logits = nn.Parameter(logits.clone())

    def encode(self, history: torch.Tensor, mask: torch.Tensor):
        return SimpleNamespace(mask=mask)

    def prefix_logits(self, enc, prefix: torch.Tensor) -> torch.Tensor:
        return self.logits[:, : prefix.shape[1], : prefix.shape[2] + 1]


class CountingToy(ToyBackbone):
    """ToyBackbone that counts its calls (shared-encoding checks)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.encodes, self.prefix_shapes = 0, []

    def encode(self, history, mask):
        self.encodes += 1
        return super().encode(history, mask)

    def prefix_logits(self, enc, prefix):
        self.prefix_shapes.append(tuple(prefix.shape))
        return super().prefix_logits(enc, prefix)


def make_ctx(sids: SemanticIds, seed: int = 0, eval_beam: int = 3, item_counts=None) -> TrainContext:
    counts = np.zeros(sids.num_candidates, dtype=np.int64) if item_counts is None else item_counts
    return TrainContext(sids=sids, trie=Trie(sids), item_counts=counts, eval_beam=eval_beam, seed=seed)


def case(num_items: int = 20, sizes=(4, 3, 3), batch: int = 6, seed: int = 0):
    assert num_items <= np.prod(sizes), "random_sids would never finish"
    sids = random_sids(num_items, list(sizes), seed=seed)
    return sids, Trie(sids), random_batch(sids, batch, seed=seed + 1)


def allowed_tokens(sids: SemanticIds, prefix_tokens: list[int]) -> list[int]:
    """Brute force: the tokens that continue `prefix_tokens` to some catalogue item (eos after a
    full code)."""
    T = sids.num_levels
    if len(prefix_tokens) == T:
        return [EOS]
    m, codes = len(prefix_tokens), sids.cand_codes + sids.offsets
    return sorted({int(c[m]) for c in codes if list(c[:m]) == list(prefix_tokens)})


__all__ = ["FixedLogits", "CountingToy", "make_ctx", "case", "allowed_tokens", "ToyBackbone", "random_batch",
           "random_sids"]
