"""Raw interactions -> per-user chronological sequences -> k-core -> train/valid/test examples.

A split example is (user, pos): the target is `seq[user][pos]` and the history the up to
`max_history` items before it. Sequences are stored flat (`items`, `offsets`), so the
artefact is a few arrays whatever the dataset size.
"""

from __future__ import annotations

import difflib
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genrec.data.readers.common import DataError, RawData


@dataclass
class SeqData:
    user_ids: list[str]  # raw user id per user index
    item_ids: list[str]  # raw item id per item index
    item_text: list[str]
    items: np.ndarray  # [num_interactions] item index, user by user, chronological
    offsets: np.ndarray  # [num_users + 1] user u's items are items[offsets[u]:offsets[u+1]]
    splits: dict[str, np.ndarray]  # split -> [n, 2] (user, pos)

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    def stats(self) -> dict:
        n = len(self.items)
        return {
            "users": self.num_users,
            "items": self.num_items,
            "interactions": n,
            "density": n / max(1, self.num_users * self.num_items),
            **{f"{k}_examples": len(v) for k, v in self.splits.items()},
        }

    def save(self, path: Path) -> None:
        np.savez(path / "seq.npz", items=self.items, offsets=self.offsets,
                 **{f"split_{k}": v for k, v in self.splits.items()})
        (path / "ids.json").write_text(json.dumps(
            {"users": self.user_ids, "items": self.item_ids, "text": self.item_text}))

    @classmethod
    def load(cls, path: Path) -> "SeqData":
        z = np.load(path / "seq.npz")
        ids = json.loads((path / "ids.json").read_text())
        splits = {k[len("split_"):]: z[k] for k in z.files if k.startswith("split_")}
        return cls(ids["users"], ids["items"], ids["text"], z["items"], z["offsets"], splits)


def _natural_order(ids: np.ndarray) -> np.ndarray:
    """Unique ids in numeric order if they are all integers, else lexicographic."""
    uniq = np.unique(ids)
    if all(s.lstrip("-").isdigit() for s in uniq):
        return uniq[np.argsort(uniq.astype(np.int64), kind="stable")]
    return uniq


def kcore(user: np.ndarray, item: np.ndarray, k: int) -> np.ndarray:
    """Boolean mask of the interactions that survive iterative k-core filtering."""
    keep = np.ones(len(user), dtype=bool)
    while True:
        uc = np.bincount(user[keep], minlength=user.max() + 1 if len(user) else 0)
        ic = np.bincount(item[keep], minlength=item.max() + 1 if len(item) else 0)
        new = keep & (uc[user] >= k) & (ic[item] >= k)
        if new.sum() == keep.sum():
            return new
        keep = new


def build_sequences(raw: RawData, k: int, where: str = "dataset") -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Chronological, de-duplicated, k-core-filtered sequences.

    Sort per user by time with ties kept in input order; drop exact duplicates (same user,
    item and time); filter to the k-core. Returns (user ids, item ids, flat items, flat
    times, offsets).
    """
    if not raw.users:
        raise DataError(f"{where}: the reader found no interactions")
    users = np.asarray(raw.users, dtype=object).astype(str)
    items = np.asarray(raw.items, dtype=object).astype(str)
    times = np.asarray(raw.times, dtype=np.float64)
    _, u = np.unique(users, return_inverse=True)
    _, i = np.unique(items, return_inverse=True)
    order = np.lexsort((np.arange(len(u)), times, u))  # by user, then time, then input order
    u, i, times = u[order], i[order], times[order]
    dup = np.zeros(len(u), dtype=bool)
    key = np.stack([u, i, times.view(np.int64)], 1)
    _, first = np.unique(key, axis=0, return_index=True)
    dup[:] = True
    dup[first] = False
    u, i, times = u[~dup], i[~dup], times[~dup]
    keep = kcore(u, i, k)
    if not keep.any():
        raise DataError(f"{where}: no interactions left after {k}-core filtering; lower dataset.kcore")
    u, i, times = u[keep], i[keep], times[keep]
    user_names, item_names = np.unique(users), np.unique(items)
    # Re-index survivors in natural id order (LC-Rec's "0".."N-1" stay in order).
    kept_users = _natural_order(user_names[np.unique(u)])
    kept_items = _natural_order(item_names[np.unique(i)])
    umap = {s: n for n, s in enumerate(kept_users)}
    imap = {s: n for n, s in enumerate(kept_items)}
    u_new = np.array([umap.get(s, -1) for s in user_names])[u]
    i_new = np.array([imap.get(s, -1) for s in item_names])[i]
    order = np.argsort(u_new, kind="stable")  # keep chronological order within a user
    flat = i_new[order].astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(u_new, minlength=len(kept_users)))]).astype(np.int64)
    return kept_users.tolist(), kept_items.tolist(), flat, times[order], offsets


def leave_one_out(offsets: np.ndarray) -> dict[str, np.ndarray]:
    """Last item = test, second-to-last = validation, every earlier position = training."""
    out = {"train": [], "valid": [], "test": []}
    for user in range(len(offsets) - 1):
        n = int(offsets[user + 1] - offsets[user])
        out["train"] += [(user, p) for p in range(1, n - 2)]
        if n >= 3:
            out["valid"].append((user, n - 2))
        if n >= 2:
            out["test"].append((user, n - 1))
    return {k: np.asarray(v, dtype=np.int64).reshape(-1, 2) for k, v in out.items()}


def sliding_window(offsets: np.ndarray, times: np.ndarray,
                   ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> dict[str, np.ndarray]:
    """BEAR protocol: every position of every user is an example (its history the window of
    the `max_history` previous items); examples are sorted by the target's timestamp (ties:
    user, then position) and cut chronologically 8:1:1 into train / valid / test."""
    ex = [(user, p) for user in range(len(offsets) - 1) for p in range(1, int(offsets[user + 1] - offsets[user]))]
    ex = np.asarray(ex, dtype=np.int64).reshape(-1, 2)
    ex = ex[np.argsort(times[offsets[ex[:, 0]] + ex[:, 1]], kind="stable")]
    a = int(len(ex) * ratios[0])
    b = a + int(len(ex) * ratios[1])
    return {"train": ex[:a], "valid": ex[a:b], "test": ex[b:]}


class _Blank(string.Formatter):
    def get_value(self, key, args, kwargs):
        return kwargs.get(key, "")


def template_fields(template: str) -> list[str]:
    """The fields `template` names ("{title!r:>9}", "{title.upper}": title); malformed: a DataError."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise DataError(f"dataset.text_template={template!r}: {e}") from None
    return [re.match(r"[^.\[]*", name).group() for name in names]


def item_texts(item_ids: list[str], meta: dict[str, dict], template: str) -> list[str]:
    """Fill the text template per item; a field an item lacks becomes an empty string (metadata is sparse),
    a field no item has is a DataError (a misspelling would blank every item's text)."""
    fields = set().union(*meta.values())
    for name in template_fields(template) if fields else []:  # no metadata at all: every text is the bare template
        if name not in fields:
            near = difflib.get_close_matches(name, sorted(fields), n=1)
            hint = f" (did you mean {{{near[0]}}}?)" if near else ""
            raise DataError(f"dataset.text_template={template!r}: no item has a field {{{name}}}{hint}; "
                            f"the items' fields: {', '.join(sorted(fields))}")
    fmt = _Blank()
    return [" ".join(fmt.format(template, **meta.get(i, {})).split()) for i in item_ids]
