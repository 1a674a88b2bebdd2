"""Content-addressed, atomic, lock-protected cache of data-stage artefacts.

`cached(root, stage, config, build)` returns `root/<stage>/<hash>/`, where the hash covers
the config that produced the artefact and the stage's code version. The first caller
builds it into a temporary folder and renames it into place (atomic on one file system),
under a file lock so concurrent sweep jobs build it once; everyone else waits and reads.
`meta.json` inside records the config, the code version and the build time.
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

# Bump a stage's version when its output format or semantics change: old entries are ignored.
STAGE_VERSIONS = {"sequences": 1, "embeddings": 1, "sids": 1}


def config_hash(stage: str, config: dict) -> str:
    blob = json.dumps({"stage": stage, "version": STAGE_VERSIONS[stage], "config": config}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached(root: Path | str, stage: str, config: dict, build: Callable[[Path], dict | None]) -> tuple[Path, bool]:
    """Return (artefact folder, whether it was already there). `build(tmp)` writes the
    artefact's files into `tmp` and may return extra facts to record in meta.json."""
    final = Path(root) / stage / config_hash(stage, config)
    if (final / "meta.json").exists():
        return final, True
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / "meta.json").exists():  # built by another process while we waited
            return final, True
        tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            start = time.time()
            facts = build(tmp) or {}
            meta = {"stage": stage, "config": config, "code_version": genrec.__version__,
                    "stage_version": STAGE_VERSIONS[stage], "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "build_seconds": round(time.time() - start, 3), **facts}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
            if final.exists():  # a half-built folder from a crash before meta.json: replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final, False


def read_meta(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text())
