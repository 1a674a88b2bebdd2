"""Exact full-item ranking: S(y|x) for every candidate, re-using the history encoding.

`full_scores`: the trie is expanded with `backbone.step`, every distinct prefix once (cost sum_m P_m
decoder positions per user, not C * T): a prefix's children are its beam plus one token.
The expansion is depth-first over blocks of prefixes, all users at once, so that one step
call holds at most about `chunk` (user, prefix) rows whatever the catalogue size; only the
states of the current block's ancestors stay alive.

`top_rank`: the target's exact rank where it is within the top `cap`, at a fraction of that cost.
Every step adds a log-probability <= 0, so a prefix's score bounds the scores of all its items: given
a score `floor` that at least `cap` items reach (beam search's cap-th best), only prefixes scoring
>= floor can hold an item of the exact top `cap`, and each user expands only those.
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


TOLERANCE = 0.05  # floor slack: the same prefix scored in another batch shape (bf16 hidden states) may differ


@torch.no_grad()
def top_rank(backbone: Backbone, enc: Any, trie: Trie, target: torch.Tensor, floor: torch.Tensor, cap: int,
             chunk: int = 4096, score: str = "full", temperature: float = 1.0) -> torch.Tensor:
    """1-based rank [B] of candidate `target` [B] under exact full ranking (as `rank_of(full_scores(...))`)
    where it is <= `cap`, else cap + 1. `floor` [B]: a score at least `cap` candidates reach (-inf: none
    known, every prefix is expanded). Checked: a user whose target was not found and for whom fewer than
    `cap` candidates reached floor - TOLERANCE in this search is searched again without a floor."""
    floor = floor - TOLERANCE
    ids, scores = _above(backbone, enc, trie, floor, chunk, score, temperature)
    hit = ids == target[:, None]
    unsure = ~hit.any(1) & ((ids >= 0).sum(1) < cap)
    if unsure.any():
        ids, scores = _above(backbone, enc, trie, floor.masked_fill(unsure, float("-inf")), chunk, score, temperature)
        hit = ids == target[:, None]
    s_t = scores.masked_fill(~hit, float("-inf")).amax(1, keepdim=True)  # the target's score, if found
    ahead = (scores > s_t) | ((scores == s_t) & (ids >= 0) & (ids < target[:, None]))
    rank = (ahead.sum(1) + 1).clamp(max=cap + 1)
    return torch.where(hit.any(1), rank, cap + 1)  # not found: below the floor, so below >= cap items


def _above(backbone: Backbone, enc: Any, trie: Trie, floor: torch.Tensor, chunk: int, score: str,
           temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Every candidate scoring >= floor [B], per user: ids [B, N] (-1 pads) and their scores [B, N]
    (-inf pads), by a depth-first expansion of only the prefixes scoring >= floor."""
    masked = score == "masked"
    B = floor.shape[0]
    block = max(1, chunk // B)
    found_ids, found_scores = [], []

    def expand(state: Any, logits: torch.Tensor, m: int, pid: torch.Tensor, s: torch.Tensor) -> None:
        """Each user's level-m prefixes `pid` [B, P] (-1: padding) with scores `s` [B, P] and next-token
        logits [B, P, V]: keep the children scoring >= floor, expand them block by block."""
        kids = trie.child[m][pid.clamp(min=0)].masked_fill(pid[..., None] < 0, -1)  # [B, P, size]
        step = level_logprobs(logits, trie, m, kids >= 0 if masked else None, temperature)
        total = (s[..., None] + step).masked_fill(kids < 0, float("-inf")).flatten(1)  # [B, P * size]
        keep = (total > float("-inf")) & (total >= floor[:, None])
        width = int(keep.sum(1).max())
        if width == 0:
            return
        order = torch.argsort((~keep).to(torch.uint8), dim=1, stable=True)[:, :width]  # each user's kept first
        kept = keep.gather(1, order)
        s = total.gather(1, order).masked_fill(~kept, float("-inf"))
        pid = kids.flatten(1).gather(1, order).masked_fill(~kept, -1)
        if m + 1 == trie.num_levels:
            found_ids.append(pid)
            found_scores.append(s)
            return
        size = trie.sizes[m]
        tokens, parents = order % size + trie.host_offsets[m], order // size
        for lo in range(0, width, block):
            sl = slice(lo, lo + block)
            lg, st = backbone.step(state, tokens[:, sl], parents[:, sl])
            expand(st, lg, m + 1, pid[:, sl], s[:, sl])

    logits, state = backbone.step(backbone.start(enc), None, None)
    zeros = torch.zeros(B, 1, dtype=torch.long, device=floor.device)
    expand(state, logits, 0, zeros, zeros.float())
    if not found_ids:
        return zeros - 1, zeros.float() - float("inf")
    return torch.cat(found_ids, 1), torch.cat(found_scores, 1)
