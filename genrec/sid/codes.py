"""Semantic IDs of a catalogue and their token ids.

`codes[i]` is item i's code tuple (per-level code indices, 0-based within each level).
Token ids are level-offset: code c at level l has token id `SPECIAL + offsets[l] + c`,
after the special tokens pad (0), eos (1), bos (2). Items sharing a code tuple (possible
under the `merge` collision policy) are one candidate: beam search and the metrics work on
distinct codes ("candidates"), and `item_to_cand` maps each item to its candidate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAD, EOS, BOS = 0, 1, 2
SPECIAL = 3  # number of special tokens before the codebooks


@dataclass
class SemanticIds:
    codes: np.ndarray  # [num_items, T] int64
    sizes: list[int]  # codebook size per level, len T

    def __post_init__(self) -> None:
        self.codes = np.asarray(self.codes, dtype=np.int64)
        self.sizes = [int(s) for s in self.sizes]
        if self.codes.ndim != 2 or self.codes.shape[1] != len(self.sizes):
            raise ValueError(f"codes {self.codes.shape} do not match {len(self.sizes)} levels")
        if (self.codes < 0).any() or (self.codes >= np.array(self.sizes)).any():
            raise ValueError("a code is outside its level's codebook")
        cands, self.item_to_cand = np.unique(self.codes, axis=0, return_inverse=True)
        self.item_to_cand = self.item_to_cand.reshape(-1)
        self.cand_codes = cands  # [C, T], sorted lexicographically

    @property
    def num_levels(self) -> int:
        return len(self.sizes)

    @property
    def offsets(self) -> np.ndarray:
        return SPECIAL + np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    @property
    def vocab_size(self) -> int:
        return SPECIAL + sum(self.sizes)

    @property
    def num_candidates(self) -> int:
        return len(self.cand_codes)

    def item_tokens(self) -> "torch.Tensor":
        """[num_items, T] token ids."""
        import torch  # lazily: the data stage alone never needs torch

        return torch.from_numpy(self.codes + self.offsets)

    def cand_tokens(self) -> "torch.Tensor":
        """[C, T] token ids of the distinct codes, in candidate order."""
        import torch

        return torch.from_numpy(self.cand_codes + self.offsets)

    def stats(self) -> dict:
        counts = np.bincount(self.item_to_cand)
        used = [len(np.unique(self.codes[:, l])) for l in range(self.num_levels)]
        return {
            "levels": self.num_levels,
            "codebook_sizes": self.sizes,
            "codebook_usage": [u / s for u, s in zip(used, self.sizes)],
            "unique_codes": int(self.num_candidates),
            "collision_rate": float(1 - self.num_candidates / len(self.codes)),
            "max_collision": int(counts.max()),
        }

    def save(self, path: Path) -> None:
        np.save(path / "codes.npy", self.codes)
        (path / "sizes.json").write_text(json.dumps(self.sizes))

    @classmethod
    def load(cls, path: Path) -> "SemanticIds":
        return cls(np.load(path / "codes.npy"), json.loads((path / "sizes.json").read_text()))
