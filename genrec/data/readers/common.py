"""What every reader returns, and the line-level plumbing they share.

A reader turns one source's raw files into `RawData`: interaction triples (user, item,
time) in file order, and per-item metadata dicts whose fields the dataset's text
template uses. Bad lines are counted in a `ReadReport` (file, line numbers of the first
few) instead of crashing; with `strict=True` the first one is an error.
"""

from __future__ import annotations

import gzip
import inspect
import io
import json
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol


class DataError(Exception):
    """A problem with the input data, phrased for the user (no traceback needed)."""


@dataclass
class ReadReport:
    bad: dict[str, int] = field(default_factory=dict)  # file -> number of skipped records
    examples: list[str] = field(default_factory=list)  # "file:line: reason" (first few)

    def skip(self, path: Path | str, line: int | None, reason: str, strict: bool) -> None:
        """`line` None: a whole-file JSON record (the reason names its key)."""
        where = f"{path}:{line}: {reason}" if line is not None else f"{path}: {reason}"
        if strict:
            raise DataError(f"{where} (dataset.strict=true; set it to false to skip bad records)")
        self.bad[str(path)] = self.bad.get(str(path), 0) + 1
        if len(self.examples) < 5:
            self.examples.append(where)

    @property
    def total(self) -> int:
        return sum(self.bad.values())

    def summary(self) -> str:
        if not self.total:
            return "no bad records"
        files = ", ".join(f"{Path(f).name}: {n}" for f, n in self.bad.items())
        return f"skipped {self.total} bad records ({files}); first: " + "; ".join(self.examples)


@dataclass
class RawData:
    users: list[str]
    items: list[str]
    times: list[float]  # any monotone unit; ties keep file order
    meta: dict[str, dict] = field(default_factory=dict)  # item -> metadata fields
    report: ReadReport = field(default_factory=ReadReport)


class Reader(Protocol):
    """What `dataset.reader._target_` names: called with the dataset YAML's `reader` keys and `strict`
    (bad records: an error if true, else counted in the `RawData.report`). Every raw file must be read
    through `open_text` (or `load_json` / `iter_records`, which use it): the data cache keys the result
    on the files opened there, so a file read another way is not noticed when it changes."""

    def __call__(self, *, strict: bool = False, **keys) -> RawData: ...


def is_reader(fn: object) -> bool:
    """Callable with a `strict` keyword (the part of `Reader` a config check can see)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "strict" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def find_file(root: Path | str, name: str) -> Path:
    """`root/name`, or its gzipped / un-gzipped twin; a clear error if neither exists."""
    path = Path(root) / name
    twin = path.with_suffix("") if path.suffix == ".gz" else path.with_name(path.name + ".gz")
    for p in (path, twin):
        if p.exists():
            return p
    raise DataError(
        f"missing data file {path} (nor {twin.name}); set dataset.root or run "
        f"`python -m genrec.download dataset=<name>`"
    )


_inputs: list[list[Path]] = []  # open recorders (`recording_inputs`), innermost last


@contextmanager
def recording_inputs() -> Iterator[list[Path]]:
    """The raw files opened (by `open_text`) inside the block, in order: the data cache puts
    their sizes and modification times into an artefact's key (`genrec.data.store.cached`)."""
    files: list[Path] = []
    _inputs.append(files)
    try:
        yield files
    finally:
        _inputs.remove(files)


@contextmanager
def open_text(path: Path) -> Iterator[io.TextIOBase]:
    """Every raw file is read through here (plain or gzipped UTF-8 text): `with open_text(p) as f`.
    A file that cannot be opened, decompressed or decoded is a one-line DataError naming it."""
    for files in _inputs:
        files.append(Path(path))
    try:
        with (io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8") if Path(path).suffix == ".gz"
              else open(path, encoding="utf-8")) as f:
            yield f
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason}: byte {e.object[e.start:e.start + 1]!r})") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # not gzip, truncated, corrupt
        raise DataError(f"{path}: bad gzip file ({e})") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None


def iter_records(
    path: Path, parse: Callable[[str], object], required: tuple[str, ...], report: ReadReport, strict: bool
) -> Iterator[dict]:
    """Parse one record per non-empty line; count (or, if strict, raise on) bad ones."""
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = parse(line)
            except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
                report.skip(path, lineno, f"malformed record ({type(e).__name__})", strict)
                continue
            if not isinstance(rec, dict):
                report.skip(path, lineno, "record is not an object", strict)
                continue
            missing = [k for k in required if rec.get(k) in (None, "")]
            if missing:
                report.skip(path, lineno, f"missing {', '.join(missing)}", strict)
                continue
            yield rec


def load_json(path: Path) -> object:
    with open_text(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
