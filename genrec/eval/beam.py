"""Trie-constrained beam search over all users and beams at once.

Scores are S(y|x) = sum_t log_softmax(z^t / tau)[y^t] with the softmax over the FULL vocabulary
(`score="full"`: the trie only decides which tokens may be chosen, as HF generate with a trie
callback does), or over the tokens the trie allows after the prefix (`score="masked"`: the MSL
and BEAR releases' constrained-before-softmax decoding). At step m every user keeps
K_m = min(beam, P_m) prefixes (P_m = distinct m-prefixes in the catalogue): beams are
always real prefixes and every prefix has a child, so each user has at least K_m valid
continuations and no beam is ever empty.

Ties are broken by a stable descending sort over the flattened (beam, code) grid: among
equal scores the lower beam index (= the better-ranked parent) wins, then the lower token
id. The result is deterministic and the same on every device. (Assumes finite logits on
the tokens the trie allows, as any network gives.) Only the T steps loop in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from genrec.sid.trie import Trie
from genrec.models.base import Backbone


@dataclass
class BeamResult:
    cands: torch.Tensor  # [B, beam] candidate ids, best first; -1 pads when C < beam
    scores: torch.Tensor  # [B, beam] S(y|x) of each candidate; -inf on pads
    prefix_ids: list[torch.Tensor]  # step m = 1..T: [B, K_m] trie prefix ids kept at step m


SCORES = ("full", "masked")


def level_logprobs(logits: torch.Tensor, trie: Trie, m: int, allowed: torch.Tensor | None = None,
                   temperature: float = 1.0) -> torch.Tensor:
    """Per-step scores of level m's codes, [..., V] -> [..., size_m]: log_softmax(z / tau) over the
    full vocabulary (`allowed` None), or over the codes `allowed` [..., size_m] only (others -inf)."""
    off = trie.host_offsets[m]
    z = logits.float() if temperature == 1 else logits.float() / temperature
    if allowed is None:
        return torch.log_softmax(z, dim=-1)[..., off : off + trie.sizes[m]]
    return torch.log_softmax(z[..., off : off + trie.sizes[m]].masked_fill(~allowed, float("-inf")), dim=-1)


@torch.no_grad()
def beam_search(backbone: Backbone, enc: Any, trie: Trie, beam: int, score: str = "full",
                temperature: float = 1.0) -> BeamResult:
    """The top-`beam` candidates of each user under trie-constrained beam search (`score`: full |
    masked, see above); with beam >= C it is the exact full ranking."""
    if score not in SCORES:
        raise ValueError(f"eval.score={score!r} must be one of {', '.join(SCORES)}")
    masked = score == "masked"
    B = enc.mask.shape[0]
    device = enc.mask.device
    pid = torch.zeros(B, 1, dtype=torch.long, device=device)  # level-m prefix id of each beam
    score = torch.zeros(B, 1, device=device)
    state = backbone.start(enc)
    logits, state = backbone.step(state, None, None)
    prefix_ids = []
    for m in range(trie.num_levels):
        size = trie.sizes[m]
        child = trie.child[m][pid]  # [B, K, size] id of each continuation, -1 if none
        step = level_logprobs(logits, trie, m, child >= 0 if masked else None, temperature)
        total = (score[..., None] + step).masked_fill(child < 0, float("-inf")).flatten(1)  # [B, K * size]
        k = min(beam, trie.num_prefixes(m + 1))
        score, idx = total.sort(dim=1, descending=True, stable=True)
        score, idx = score[:, :k], idx[:, :k]
        pid = child.flatten(1).gather(1, idx)
        prefix_ids.append(pid)
        if m + 1 < trie.num_levels:
            tokens = idx % size + trie.host_offsets[m]
            logits, state = backbone.step(state, tokens, idx // size)
    pad = beam - pid.shape[1]
    cands = torch.nn.functional.pad(pid, (0, pad), value=-1)
    scores = torch.nn.functional.pad(score, (0, pad), value=float("-inf"))
    return BeamResult(cands, scores, prefix_ids)
