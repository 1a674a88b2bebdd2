"""RecBole atomic files: `<name>.inter` / `<name>.item`, tab-separated, typed headers.

The header names each column with its type, e.g. `user_id:token  item_id:token
rating:float  timestamp:float`. Item metadata fields keep their names without the type
suffix (ml-100k: movie_title, release_year, class). `root: null` means the MovieLens-100K
copy shipped inside the `recbole` wheel (the embedded default dataset; found with
`importlib.util.find_spec`, recbole itself is never imported).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from genrec.data.readers.common import DataError, RawData, ReadReport, find_file, open_text


def embedded_root(name: str = "ml-100k") -> Path:
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the embedded dataset needs the recbole wheel: pip install --no-deps recbole==1.2.1")
    return Path(list(spec.submodule_search_locations)[0]) / "dataset_example" / name


def _rows(path: Path, report: ReadReport, strict: bool):
    """Yield (line number, {field: value}) for each well-formed row of an atomic file."""
    with open_text(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        fields = [h.split(":", 1)[0] for h in header]
        for lineno, line in enumerate(f, 2):
            line = line.rstrip("\n")
            if not line:
                continue
            values = line.split("\t")
            if len(values) != len(fields):
                report.skip(path, lineno, f"expected {len(fields)} tab-separated fields, got {len(values)}", strict)
                continue
            yield lineno, dict(zip(fields, values))


def read(root: str | None, name: str, user: str = "user_id", item: str = "item_id", time: str = "timestamp",
         strict: bool = False) -> RawData:
    base = Path(root) if root else embedded_root(name)
    report = ReadReport()
    inter = find_file(base, f"{name}.inter")
    users, items, times = [], [], []
    for lineno, row in _rows(inter, report, strict):
        try:
            t = float(row.get(time) or 0.0)
        except ValueError:
            report.skip(inter, lineno, f"{time} is not a number", strict)
            continue
        if not row.get(user) or not row.get(item):
            report.skip(inter, lineno, f"missing {user} or {item}", strict)
            continue
        users.append(row[user]), items.append(row[item]), times.append(t)
    meta = {}
    item_file = base / f"{name}.item"
    if item_file.exists() or item_file.with_name(item_file.name + ".gz").exists():
        for _, row in _rows(find_file(base, f"{name}.item"), report, strict):
            meta[row.pop(item, "")] = row
    return RawData(users, items, times, meta, report)
