"""A synthetic dataset with learnable structure, for tests and debugging without data.

Items form `groups` clusters; each user walks mostly forward through one cluster
(item i -> i + 1 within the cluster with probability `p_next`, else a random item of
the cluster), so the next item is predictable from the history and a model that learns
lowers its validation loss. Item text names the cluster, so text embeddings cluster too.
"""

from __future__ import annotations

import numpy as np

from genrec.data.readers.common import RawData


def read(users: int = 300, items: int = 60, groups: int = 6, min_len: int = 5, max_len: int = 20,
         p_next: float = 0.8, seed: int = 0, strict: bool = False) -> RawData:
    rng = np.random.default_rng(seed)
    per_group = items // groups
    out_u, out_i, out_t = [], [], []
    for u in range(users):
        g = rng.integers(groups)
        pos = int(rng.integers(per_group))
        for t in range(int(rng.integers(min_len, max_len + 1))):
            out_u.append(f"u{u}"), out_i.append(str(g * per_group + pos)), out_t.append(float(t))
            pos = (pos + 1) % per_group if rng.random() < p_next else int(rng.integers(per_group))
    meta = {str(i): {"title": f"item {i}", "group": f"group {i // per_group}"} for i in range(groups * per_group)}
    return RawData(out_u, out_i, out_t, meta)
