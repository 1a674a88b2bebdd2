"""Semantic-ID tokenizers: RQ-K-means over item embeddings, or precomputed index files.

Both return a `SemanticIds` whose code tuples are unique per item (a disambiguation level
0, 1, 2, ... among items that collide), except under `collision=merge`, where colliding
items stay one candidate as the APAO release's evaluation treats them.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np

from genrec.data.readers.common import DataError, find_file, load_json
from genrec.sid.codes import SemanticIds


def collisions(codes: np.ndarray) -> dict:
    """Collision facts of codes before disambiguation."""
    _, counts = np.unique(codes, axis=0, return_counts=True)
    return {"unique_codes_before": int(len(counts)), "max_collision_before": int(counts.max())}


def disambiguate(codes: np.ndarray) -> np.ndarray:
    """Append one level: the rank (0, 1, 2, ...) of each item among items with the same code."""
    _, inv = np.unique(codes, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    order = np.argsort(inv, kind="stable")
    first = np.searchsorted(inv[order], inv[order], side="left")
    rank = np.empty(len(codes), dtype=np.int64)
    rank[order] = np.arange(len(codes)) - first
    return np.concatenate([codes, rank[:, None]], axis=1)


class RQKMeans:
    """Residual K-means (faiss): level 1 clusters the embeddings, each next level the residuals."""

    needs_embeddings = True

    def __init__(self, levels: int = 3, codebook_size: int = 256, iters: int = 20, seed: int = 42,
                 disambiguate: bool = True) -> None:
        self.levels, self.codebook_size, self.iters, self.seed = levels, codebook_size, iters, seed
        self.disambiguate = disambiguate
        self.errors: list[float] = []  # mean squared residual norm after each level
        self.facts: dict = {}

    def __call__(self, emb: np.ndarray, item_ids: list[str]) -> SemanticIds:
        import faiss  # noqa: F401  (imported lazily: it is slow to load)

        n = len(emb)
        if self.codebook_size > n:
            raise DataError(f"tokenizer.codebook_size={self.codebook_size} is larger than the number of items ({n}); "
                            f"lower it")
        residual = np.ascontiguousarray(emb, dtype=np.float32).copy()
        codes, self.errors = [], []
        for level in range(self.levels):
            km = faiss.Kmeans(residual.shape[1], self.codebook_size, niter=self.iters, seed=self.seed + level,
                              verbose=False, min_points_per_centroid=1, max_points_per_centroid=max(256, n))
            km.train(residual)
            _, assign = km.index.search(residual, 1)
            assign = assign[:, 0].astype(np.int64)
            residual = residual - km.centroids[assign]
            codes.append(assign)
            self.errors.append(float((residual**2).sum(1).mean()))
        codes = np.stack(codes, 1)
        sizes = [self.codebook_size] * self.levels
        self.facts = {"reconstruction_error": self.errors, **collisions(codes)}
        if self.disambiguate:
            codes = disambiguate(codes)
            sizes.append(int(codes[:, -1].max()) + 1)
        return SemanticIds(codes, sizes)


logging.getLogger("faiss.loader").setLevel(logging.WARNING)

_TOKEN = re.compile(r"<([a-z])_(\d+)>")


class Precomputed:
    """SIDs from an index file `{item: ["<a_12>", "<b_7>", ...]}` (LC-Rec / APAO release).

    collision: `extra_token` appends a disambiguation level when codes collide; `merge`
    keeps colliding items as one candidate."""

    needs_embeddings = False

    def __init__(self, path: str, collision: str = "extra_token") -> None:
        self.facts: dict = {}
        if collision not in ("extra_token", "merge"):
            raise ValueError(f"tokenizer.collision must be extra_token or merge, got {collision!r}")
        self.path, self.collision = Path(path), collision

    def __call__(self, emb: np.ndarray | None, item_ids: list[str]) -> SemanticIds:
        path = find_file(self.path.parent, self.path.name)
        index = load_json(path)
        rows = []
        for item in item_ids:
            if item not in index:
                raise DataError(f"{path}: no semantic ID for item {item!r} (the index and the dataset disagree)")
            toks = [_TOKEN.fullmatch(t) for t in index[item]]
            if not toks or not all(toks):
                raise DataError(f"{path}: item {item!r}: tokens must look like <a_12>, got {index[item]}")
            levels = [ord(m.group(1)) - ord("a") for m in toks]
            if levels != list(range(len(levels))):
                raise DataError(f"{path}: item {item!r}: levels out of order {index[item]}")
            rows.append([int(m.group(2)) for m in toks])
        lengths = Counter(len(r) for r in rows)
        if len(lengths) > 1:  # name the first item whose length is not the most common one, and one that is
            common = lengths.most_common(1)[0][0]
            odd, n = next((i, len(r)) for i, r in zip(item_ids, rows) if len(r) != common)
            usual = next(i for i, r in zip(item_ids, rows) if len(r) == common)
            raise DataError(f"{path}: item {odd!r} has {n} codes, item {usual!r} {common} "
                            "(items have codes of different lengths)")
        codes = np.asarray(rows, dtype=np.int64)
        self.facts = collisions(codes)
        if self.collision == "extra_token" and len(np.unique(codes, axis=0)) < len(codes):
            codes = disambiguate(codes)
        return SemanticIds(codes, (codes.max(0) + 1).tolist())
