"""Exact full-item ranking: S(y|x) for every candidate, re-using the history encoding.

The trie is expanded level by level with `backbone.step`: at level m every user holds all
P_m distinct m-prefixes as beams, and each (m+1)-prefix is its parent's beam plus one
token. The cost is one decoder step per distinct prefix (sum_m P_m), not C * T.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from genrec.eval.beam import level_logprobs
from genrec.eval.trie import Trie
from genrec.models.base import Backbone


def slice_users(enc: Any, sl: slice, batch: int) -> Any:
    """Rows `sl` of a history encoding: tensors whose first dim is the batch, inside
    dataclasses, tuples, lists and dicts; anything else is shared as is."""
    if isinstance(enc, torch.Tensor):
        return enc[sl] if enc.dim() and enc.shape[0] == batch else enc
    if dataclasses.is_dataclass(enc):
        fields = {f.name: slice_users(getattr(enc, f.name), sl, batch) for f in dataclasses.fields(enc) if f.init}
        return dataclasses.replace(enc, **fields)
    if isinstance(enc, (tuple, list)):
        return type(enc)(slice_users(x, sl, batch) for x in enc)
    if isinstance(enc, dict):
        return {k: slice_users(v, sl, batch) for k, v in enc.items()}
    return enc


def trie_edges(trie: Trie, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each (m+1)-prefix id: its parent's m-prefix id and its last code."""
    parent, code = (trie.child[m] >= 0).nonzero(as_tuple=True)
    order = trie.child[m][parent, code].argsort()
    return parent[order], code[order]


@torch.no_grad()
def full_scores(backbone: Backbone, enc: Any, trie: Trie, chunk: int = 64) -> torch.Tensor:
    """S(y|x) [B, C] of every candidate, `chunk` users at a time."""
    B = enc.mask.shape[0]
    edges = [trie_edges(trie, m) for m in range(trie.num_levels)]
    out = []
    for lo in range(0, B, chunk):
        sub = slice_users(enc, slice(lo, lo + chunk), B)
        n = sub.mask.shape[0]
        logits, state = backbone.step(backbone.start(sub), None, None)
        score = logits.new_zeros(n, 1, dtype=torch.float)
        for m, (parent, code) in enumerate(edges):
            logp = level_logprobs(logits, trie, m)  # [n, P_m, size_m]
            score = score[:, parent] + logp[:, parent, code]  # [n, P_{m+1}]
            if m + 1 < trie.num_levels:
                tokens = (code + trie.offsets[m]).expand(n, -1)
                logits, state = backbone.step(state, tokens, parent.expand(n, -1))
        out.append(score)
    return torch.cat(out)


def rank_of(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1-based rank of candidate `target` [B] under `scores` [B, C]. Ties: a lower candidate
    id ranks first (the same order a stable sort of the scores gives)."""
    s = scores.gather(1, target[:, None])
    ids = torch.arange(scores.shape[1], device=scores.device)
    ahead = (scores > s) | ((scores == s) & (ids < target[:, None]))
    return ahead.sum(1) + 1
