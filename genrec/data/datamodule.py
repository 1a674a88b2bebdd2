"""Batches for training and evaluation, read from the data stage's cached artefacts.

Examples are (user, pos) pairs; a batch gathers the up to `max_history` items before pos,
maps them to SID tokens, appends eos and left-pads. Histories vary from 1 to
`max_history` items, so batches group examples of similar length (a seeded shuffle, then
sorting within windows of 50 batches) instead of padding everything to the maximum.
Under DDP the examples, not whole batches, are dealt to the processes (every world-th one of
the epoch's order), so every rank gets the same number of examples and batches however few
there are: evaluation pads with repeats (de-duplicated by index after the gather), training
drops the n % world remainder of its shuffled order. Samplers depend only on (seed, epoch,
rank, world), so a resume replays the same batches.
"""

from __future__ import annotations

import math
from typing import Callable

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from genrec.data.preprocess import SeqData
from genrec.sid.codes import EOS, SemanticIds


class Examples(torch.utils.data.Dataset):
    """One split. Indexed with a list of example ids, returns a whole batch."""

    def __init__(self, seq: SeqData, sids: SemanticIds, split: str, max_history: int) -> None:
        self.pairs = seq.splits[split]
        self.items, self.offsets = seq.items, seq.offsets
        self.tokens = sids.item_tokens()
        self.item_to_cand = torch.from_numpy(sids.item_to_cand)
        self.max_history = max_history
        self.lengths = np.minimum(self.pairs[:, 1], max_history)  # history length in items

    def __len__(self) -> int:
        return len(self.pairs)

    def targets(self) -> np.ndarray:
        return self.items[self.offsets[self.pairs[:, 0]] + self.pairs[:, 1]]

    def __getitem__(self, idx: list[int]) -> dict:
        idx = np.asarray(idx, dtype=np.int64)
        user, pos = self.pairs[idx, 0], self.pairs[idx, 1]
        n = self.lengths[idx]
        width = int(n.max())
        # Left-padded item matrix [B, width]: column j holds item pos - width + j (or padding).
        cols = pos[:, None] - width + np.arange(width)[None, :]
        valid = np.arange(width)[None, :] >= width - n[:, None]
        flat = self.offsets[user][:, None] + np.where(valid, cols, 0)
        hist_items = torch.from_numpy(np.where(valid, self.items[flat], 0))
        valid = torch.from_numpy(valid)
        T = self.tokens.shape[1]
        hist = torch.where(valid[..., None], self.tokens[hist_items], 0).reshape(len(idx), width * T)
        mask = valid[..., None].expand(-1, -1, T).reshape(len(idx), width * T)
        history = torch.cat([hist, torch.full((len(idx), 1), EOS)], 1)
        mask = torch.cat([mask, torch.ones(len(idx), 1, dtype=torch.bool)], 1)
        target = torch.from_numpy(self.items[self.offsets[user] + pos])
        return {"history": history, "mask": mask, "target": self.tokens[target],
                "target_cand": self.item_to_cand[target], "index": torch.from_numpy(idx)}


class LengthBatches(Sampler):
    """Yields lists of example ids: similar history lengths per batch, sharded by rank."""

    def __init__(self, lengths: np.ndarray, batch_size: int, shuffle: bool, seed: int,
                 rank: int = 0, world: int = 1, window: int = 50, epoch: Callable[[], int] = lambda: 0) -> None:
        self.lengths, self.batch_size, self.shuffle, self.seed = lengths, batch_size, shuffle, seed
        self.rank, self.world, self.window = rank, world, window
        self.epoch = epoch  # read at iteration time: the trainer's epoch, also right after a resume

    def share(self) -> int:
        """Examples per rank: all of them once (evaluation, padded with repeats) or the
        n // world of the shuffled order (training; at least one, repeated if n < world)."""
        n = len(self.lengths)
        return math.ceil(n / self.world) if not self.shuffle else max(1, n // self.world)

    def batches(self) -> list[np.ndarray]:
        """This rank's batches."""
        if not self.shuffle:  # evaluation: sort everything by length, keep every example
            order = np.argsort(self.lengths, kind="stable")
            mine = np.resize(order, self.share() * self.world)[self.rank :: self.world]
            return [mine[i : i + self.batch_size] for i in range(0, len(mine), self.batch_size)]
        rng = np.random.default_rng([self.seed, self.epoch()])  # the same draws on every rank
        mine = np.resize(rng.permutation(len(self.lengths)), self.share() * self.world)[self.rank :: self.world]
        span = self.batch_size * self.window
        chunks = [mine[i : i + span] for i in range(0, len(mine), span)]
        chunks = [c[np.argsort(self.lengths[c], kind="stable")] for c in chunks]
        out = [c[i : i + self.batch_size] for c in chunks for i in range(0, len(c), self.batch_size)]
        return [out[i] for i in rng.permutation(len(out))]

    def __iter__(self):
        # A generator: the order is drawn at the first batch, once the trainer's epoch is final.
        for b in self.batches():
            yield b.tolist()

    def __len__(self) -> int:
        return math.ceil(self.share() / self.batch_size)


class SeqDataModule(L.LightningDataModule):
    def __init__(self, seq: SeqData, sids: SemanticIds, max_history: int, batch_size: int,
                 eval_batch_size: int, seed: int, num_workers: int = 0, pin_memory: bool = False,
                 val_users: int | None = None, length_window: int = 50) -> None:
        """`val_users`: validate on this many examples (users, under leave-one-out), one seeded sample
        kept for every epoch (cheaper model selection); None: all of them. Test always covers all.
        `length_window`: training batches group similar history lengths within windows of this many
        batches (`LengthBatches`); 1: every batch is a uniformly random slice of the shuffled order."""
        super().__init__()
        self.seq, self.sids, self.seed = seq, sids, seed
        self.max_history, self.batch_size, self.eval_batch_size = max_history, batch_size, eval_batch_size
        self.num_workers, self.pin_memory = num_workers, pin_memory and torch.cuda.is_available()
        self.length_window = length_window
        self.splits = {s: Examples(seq, sids, s, max_history) for s in ("train", "valid", "test")}
        valid = self.splits["valid"]
        if val_users is not None and val_users < len(valid):
            keep = np.sort(np.random.default_rng([seed, len(valid)]).choice(len(valid), val_users, replace=False))
            valid.pairs, valid.lengths = valid.pairs[keep], valid.lengths[keep]

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        ds = self.splits[split]
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        sampler = LengthBatches(ds.lengths, self.batch_size if shuffle else self.eval_batch_size, shuffle,
                                self.seed, rank, world, window=self.length_window,
                                epoch=lambda: self.trainer.current_epoch if self.trainer else 0)
        # Its own generator: creating an iterator must not consume the global RNG (dropout's).
        return DataLoader(ds, sampler=sampler, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory,
                          persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)

    def item_counts(self) -> np.ndarray:
        """Training-target frequency per candidate (popularity negatives)."""
        cands = self.sids.item_to_cand[self.splits["train"].targets()]
        return np.bincount(cands, minlength=self.sids.num_candidates)
