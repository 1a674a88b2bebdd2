"""The LC-Rec / APAO processed format.

`<name>.inter.json`: {user: [item, ...]} in chronological order (no timestamps: the list
position is the time). `<name>.item.json` (optional): {item: {title, description, brand,
categories}}. `<name>.index.<tag>.json` (optional): precomputed SIDs, read by the
`precomputed` tokenizer, not here.
"""

from __future__ import annotations

import json
from pathlib import Path

from genrec.data.readers.common import DataError, RawData, ReadReport, find_file, load_json


def read(root: str, name: str, strict: bool = False) -> RawData:
    path = find_file(root, f"{name}.inter.json")
    inter = load_json(path)
    if not isinstance(inter, dict):
        raise DataError(f"{path}: expected an object {{user: [items]}}, got {type(inter).__name__}")
    report = ReadReport()
    users, items, times = [], [], []
    for user, seq in inter.items():
        if not isinstance(seq, list):
            report.skip(path, None, f"user {user!r}: item list expected", strict)
            continue
        for pos, item in enumerate(seq):
            if not is_id(item):
                report.skip(path, None, f"user {user!r}: item {pos + 1} of {len(seq)} is {json.dumps(item)}, "
                                        "not an item id (a string or an integer)", strict)
                continue
            users.append(str(user)), items.append(str(item)), times.append(float(pos))
    meta = {}
    item_path = Path(root) / f"{name}.item.json"
    if item_path.exists() or item_path.with_name(item_path.name + ".gz").exists():
        item_path = find_file(root, f"{name}.item.json")
        raw = load_json(item_path)
        if not isinstance(raw, dict):
            raise DataError(f"{item_path}: expected an object {{item: {{title, ...}}}}, got {type(raw).__name__}")
        for k, rec in raw.items():
            if isinstance(rec, dict):
                meta[str(k)] = {f: text(v) for f, v in rec.items()}
            else:
                report.skip(item_path, None, f"item {k!r}: metadata object expected", strict)
    return RawData(users, items, times, meta, report)


def is_id(value: object) -> bool:
    """A non-empty string or an integer (JSON's null, true, 1.5, [..] are not: str() would make them ids)."""
    return isinstance(value, str) and value != "" or isinstance(value, int) and not isinstance(value, bool)


def text(value: object) -> str:
    """A metadata field as text: a list (e.g. categories) joined by ", "."""
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)
