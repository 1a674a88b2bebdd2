"""Amazon review dumps (McAuley lab): the 2014, 2018 and 2023 releases.

Each release is a reviews file (one record per line: user, item, time) plus an optional
metadata file (one record per item). Both are streamed; metadata is kept only for items
that occur in the reviews, as flat strings (lists joined, HTML entities unescaped), with
"" for a missing field, so text templates never meet a missing key.

2014 metadata (and, per the spec, reviews) are python literals (single quotes): each line is
tried as JSON, then `ast.literal_eval`, never `eval`: a downloaded file is untrusted input.
"""

from __future__ import annotations

import ast
import html
import json
import math
import re
import sys
from typing import Callable

from genrec.data.readers.common import RawData, ReadReport, find_file, iter_records

# output field -> (source key, separator used when the value is a list)
Fields = dict[str, tuple[str, str]]


def literal(line: str) -> object:
    """A JSON or python-literal record; anything else (calls, names, ...) is a ValueError."""
    try:
        return json.loads(line)
    except ValueError:
        pass
    try:
        return ast.literal_eval(line.strip())
    except TypeError as e:  # e.g. {[1]: 2}: an unhashable key
        raise ValueError(str(e)) from None


def seconds(value: object) -> float:
    """A finite numeric timestamp, else ValueError (counted as a malformed record)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"time {value!r} is not a number")
    try:
        t = float(value)
    except OverflowError:
        t = math.inf
    if not math.isfinite(t):
        raise ValueError(f"time {value!r} is not finite")
    return t


def timed(loads: Callable[[str], object], key: str, to_time: Callable[[object], float]) -> Callable[[str], object]:
    """`loads`, then convert record[key] to a number inside the parse (so errors get a line number)."""

    def parse(line: str) -> object:
        rec = loads(line)
        if isinstance(rec, dict) and rec.get(key) not in (None, ""):
            rec[key] = to_time(rec[key])
        return rec

    return parse


def text(value: object, sep: str = ", ") -> str:
    """A metadata value as one string: nested lists flattened, de-duplicated, joined by `sep`."""
    if isinstance(value, (list, tuple)):
        return sep.join(dict.fromkeys(p for p in map(text, flatten(value)) if p))
    return "" if value is None else html.unescape(str(value)).strip()


def flatten(value: list | tuple) -> list:
    """Leaves of a nested list in order (iterative: a hostile file can nest ~1000 deep)."""
    out, stack = [], [iter(value)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, (list, tuple)):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def only(known: set[str], key: str, parse: Callable[[str], object]) -> Callable[[str], object]:
    """`parse`, except that a line whose `key` (found by a quick regex) names an unknown item
    becomes the stub {key: item} unparsed: most metadata lines are for items never reviewed
    in a 5-core file, and `literal_eval` costs ~0.1 ms a line."""
    pattern = re.compile(rf"""["']{key}["']\s*:\s*["']([^"']+)["']""")

    def parse_known(line: str) -> object:
        m = pattern.search(line)
        return {key: m.group(1)} if m and m.group(1) not in known else parse(line)

    return parse_known


def read_lines(root: str, reviews: str, meta: str | None, parse: Callable[[str], object],
               user: str, item: str, time: str, meta_item: str, fields: Fields, strict: bool) -> RawData:
    """Stream a line-per-record reviews file and (optionally) its metadata file."""
    report = ReadReport()
    users, items, times = [], [], []
    for rec in iter_records(find_file(root, reviews), parse, (user, item, time), report, strict):
        users.append(sys.intern(str(rec[user])))
        items.append(sys.intern(str(rec[item])))
        times.append(rec[time])
    out: dict[str, dict] = {}
    if meta:
        known = set(items)
        for rec in iter_records(find_file(root, meta), only(known, meta_item, parse), (meta_item,), report, strict):
            i = str(rec[meta_item])
            if i in known and i not in out:
                out[i] = {name: text(rec.get(src), sep) for name, (src, sep) in fields.items()}
    return RawData(users, items, times, out, report)


def read_amazon2014(root: str, reviews: str, meta: str | None = None, strict: bool = False) -> RawData:
    """`reviews_<Cat>_5.json.gz` + `meta_<Cat>.json.gz` (python literals); time in seconds."""
    fields = {"title": ("title", " "), "brand": ("brand", " "), "categories": ("categories", ", "),
              "price": ("price", " "), "description": ("description", " ")}
    return read_lines(root, reviews, meta, timed(literal, "unixReviewTime", seconds),
                      "reviewerID", "asin", "unixReviewTime", "asin", fields, strict)


def read_amazon2018(root: str, reviews: str, meta: str | None = None, strict: bool = False) -> RawData:
    """`<Cat>_5.json.gz` + `meta_<Cat>.json.gz` (JSON lines); time in seconds."""
    fields = {"title": ("title", " "), "brand": ("brand", " "), "categories": ("category", ", "),
              "price": ("price", " "), "description": ("description", " ")}
    return read_lines(root, reviews, meta, timed(json.loads, "unixReviewTime", seconds),
                      "reviewerID", "asin", "unixReviewTime", "asin", fields, strict)


def read_amazon2023(root: str, reviews: str, meta: str | None = None, strict: bool = False) -> RawData:
    """`<Cat>.jsonl.gz` + `meta_<Cat>.jsonl.gz`; the millisecond timestamps become seconds."""
    fields = {"title": ("title", " "), "store": ("store", " "), "categories": ("categories", ", "),
              "features": ("features", " "), "price": ("price", " "), "description": ("description", " ")}
    return read_lines(root, reviews, meta, timed(json.loads, "timestamp", lambda v: seconds(v) / 1000.0),
                      "user_id", "parent_asin", "timestamp", "parent_asin", fields, strict)
