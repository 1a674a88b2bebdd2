"""Content-addressed, atomic, lock-protected cache of data-stage artefacts.

`cached(root, stage, config, build)` returns `root/<stage>/<hash>/`, where the hash covers
the config that produced the artefact and the stage's code version, and for stages that read
raw files (`inputs=True`) also the size and modification time of every file the build read: an
edited or replaced raw file makes a new artefact (and so new downstream ones, whose keys name
it). Which files a config reads is learnt from its last build (`<stage>/.<config hash>.inputs.json`).
The first caller builds the artefact into a temporary folder and renames it into place (atomic on
one file system), under a file lock so concurrent sweep jobs build it once; everyone else waits
and reads. The temp folder of a build that was killed (`.tmp-<hash>-<pid>`, its pid gone) is removed by the next
build of the same artefact. `meta.json` inside records the config, the inputs, the code version and the build time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from filelock import FileLock

import genrec
from genrec.data.readers.common import recording_inputs
from genrec.runs import write_text

# Bump a stage's version when its output format or semantics change: old entries are ignored.
STAGE_VERSIONS = {"sequences": 2, "embeddings": 1, "sids": 1}  # sequences 2: LC-Rec list fields as "a, b" text


def config_hash(stage: str, config: dict) -> str:
    blob = json.dumps({"stage": stage, "version": STAGE_VERSIONS[stage], "config": config}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def file_stats(paths: list[str]) -> dict[str, list[int] | None]:
    """path -> [size, mtime_ns], None for a missing file."""
    stats = {}
    for p in paths:
        try:
            st = os.stat(p)
            stats[p] = [st.st_size, st.st_mtime_ns]
        except FileNotFoundError:
            stats[p] = None
    return stats


def alive(pid: int) -> bool:
    """Whether process `pid` exists (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def cached(root: Path | str, stage: str, config: dict, build: Callable[[Path], dict | None],
           inputs: bool = False) -> tuple[Path, bool]:
    """Return (artefact folder, whether it was already there). `build(tmp)` writes the
    artefact's files into `tmp` and may return extra facts to record in meta.json. `inputs`:
    the raw files `build` opens (through `genrec.data.readers.common.open_text`) are part of the key."""
    folder, name = Path(root) / stage, config_hash(stage, config)
    index = folder / f".{name}.inputs.json"

    def final_for(stats: dict) -> Path:
        return folder / (config_hash(stage, {**config, "inputs": stats}) if inputs else name)

    def existing() -> Path | None:
        """The artefact for the inputs as they are now, if built (its inputs known from the index)."""
        if inputs and not index.exists():
            return None
        final = final_for(file_stats(json.loads(index.read_text())) if inputs else {})
        return final if (final / "meta.json").exists() else None

    if found := existing():
        return found, True
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / name) + ".lock"):
        if found := existing():  # built by another process while we waited
            return found, True
        for stale in folder.glob(f".tmp-{name}-*"):  # a killed build's (a live one would hold the lock)
            pid = stale.name.rsplit("-", 1)[1]
            if pid.isdigit() and not alive(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = folder / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            start = time.time()
            with recording_inputs() as opened:
                facts = build(tmp) or {}
            files = list(dict.fromkeys(os.path.abspath(p) for p in opened))
            stats = file_stats(files)
            final = final_for(stats)
            meta = {"stage": stage, "config": config, "code_version": genrec.__version__,
                    "stage_version": STAGE_VERSIONS[stage], "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "build_seconds": round(time.time() - start, 3), **({"inputs": stats} if inputs else {}), **facts}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
            if final.exists():  # a half-built folder from a crash before meta.json (or a lost index): replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
            if inputs:
                write_text(index, json.dumps(files))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final, False


def read_meta(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text())
