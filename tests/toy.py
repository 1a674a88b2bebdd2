"""A tiny backbone implementing the `Backbone` contract with plain tensor ops.

Its encoding is a masked mean of history embeddings; the logits after a prefix depend on
the history and on every prefix token (through a cumulative sum), so prefix effects are
real. It uses the reference `step` of `Backbone`. Tests use it where the math under test
is the objective or the search, not the network.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from genrec.sid.codes import SemanticIds
from genrec.models.base import Backbone


@dataclass
class ToyEncoding:
    mask: torch.Tensor  # [B, L]
    h: torch.Tensor  # [B, d]


class ToyBackbone(Backbone):
    def __init__(self, vocab_size: int, dim: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.vocab_size = vocab_size
        self.emb = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.randn(8, dim))
        self.out = nn.Linear(dim, vocab_size)

    def encode(self, history: torch.Tensor, mask: torch.Tensor) -> ToyEncoding:
        e = self.emb(history) * mask[..., None]
        return ToyEncoding(mask, e.sum(1) / mask.sum(1, keepdim=True).clamp(min=1))

    def prefix_logits(self, enc: ToyEncoding, prefix: torch.Tensor) -> torch.Tensor:
        B, N, m = prefix.shape
        steps = torch.zeros(B, N, m + 1, self.emb.embedding_dim, device=prefix.device)
        if m:
            steps[:, :, 1:] = torch.tanh(self.emb(prefix)).cumsum(2)
        hidden = torch.tanh(enc.h[:, None, None] + steps + self.pos[: m + 1])
        return 3 * self.out(hidden)


def random_sids(num_items: int, sizes: list[int], seed: int = 0) -> SemanticIds:
    """Distinct random codes (like a real catalogue, prefixes are shared)."""
    rng = np.random.default_rng(seed)
    seen: set[tuple] = set()
    while len(seen) < num_items:
        seen.add(tuple(int(rng.integers(s)) for s in sizes))
    codes = np.array(sorted(seen))[rng.permutation(num_items)]
    return SemanticIds(codes, sizes)


def random_batch(sids: SemanticIds, batch: int, hist_items: int = 3, seed: int = 0) -> dict:
    """A batch in the training format: left-padded histories, targets, candidate ids."""
    g = torch.Generator().manual_seed(seed)
    tok = sids.item_tokens()
    T = sids.num_levels
    L = hist_items * T + 1
    history = torch.zeros(batch, L, dtype=torch.long)
    mask = torch.zeros(batch, L, dtype=torch.bool)
    for b in range(batch):
        n = int(torch.randint(1, hist_items + 1, (1,), generator=g))
        items = torch.randint(len(tok), (n,), generator=g)
        seq = torch.cat([tok[items].reshape(-1), torch.tensor([1])])
        history[b, L - len(seq) :] = seq
        mask[b, L - len(seq) :] = True
    target_item = torch.randint(len(tok), (batch,), generator=g)
    return {
        "history": history,
        "mask": mask,
        "target": tok[target_item],
        "target_cand": torch.from_numpy(sids.item_to_cand)[target_item],
        "index": torch.arange(batch),
    }
