"""Exact full-item ranking: S(y|x) for every candidate, re-using the history encoding.

The trie is expanded with `backbone.step`, every distinct prefix once (cost sum_m P_m
decoder positions per user, not C * T): a prefix's children are its beam plus one token.
The expansion is depth-first over blocks of prefixes, all users at once, so that one step
call holds at most about `chunk` (user, prefix) rows whatever the catalogue size; only the
states of the current block's ancestors stay alive.
"""

from __future__ import annotations

from typing import Any

import torch

from genrec.eval.beam import level_logprobs
from genrec.sid.trie import Trie
from genrec.models.base import Backbone


@torch.no_grad()
def full_scores(backbone: Backbone, enc: Any, trie: Trie, chunk: int = 4096, score: str = "full",
                temperature: float = 1.0) -> torch.Tensor:
    """S(y|x) [B, C] of every candidate, scored as beam search scores them (`score`, `temperature`:
    see `genrec.eval.beam`); about `chunk` (user, prefix) rows per step call."""
    masked = score == "masked"
    B = enc.mask.shape[0]
    block = max(1, chunk // B)  # prefixes per step call
    out = torch.empty(B, trie.num_prefixes(trie.num_levels), device=enc.mask.device)

    def expand(state: Any, logits: torch.Tensor, m: int, pids: torch.Tensor, score: torch.Tensor) -> None:
        """The beams of `state` are the level-m prefixes `pids` [P] (the same for every user),
        with next-token logits [B, P, V] and scores S^m [B, P]."""
        kids = trie.child[m][pids]  # [P, size_m]
        pos, code = (kids >= 0).nonzero(as_tuple=True)  # parent's beam, token code of each child
        ids = kids[pos, code]
        step = level_logprobs(logits, trie, m, kids >= 0 if masked else None, temperature)
        score = score[:, pos] + step[:, pos, code]  # S^{m+1} [B, #children]
        if m + 1 == trie.num_levels:
            out[:, ids] = score
            return
        tokens = code + trie.offsets[m]
        for lo in range(0, len(ids), block):
            sl = slice(lo, lo + block)
            lg, st = backbone.step(state, tokens[sl].expand(B, -1), pos[sl].expand(B, -1))
            expand(st, lg, m + 1, ids[sl], score[:, sl])

    logits, state = backbone.step(backbone.start(enc), None, None)
    root = torch.zeros(1, dtype=torch.long, device=out.device)
    expand(state, logits, 0, root, out.new_zeros(B, 1))
    return out


def rank_of(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1-based rank of candidate `target` [B] under `scores` [B, C]. Ties: a lower candidate
    id ranks first (the same order a stable sort of the scores gives)."""
    s = scores.gather(1, target[:, None])
    ids = torch.arange(scores.shape[1], device=scores.device)
    ahead = (scores > s) | ((scores == s) & (ids < target[:, None]))
    return ahead.sum(1) + 1
