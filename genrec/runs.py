"""Files of a run dir (and of the data cache), written atomically: a crash or kill -9 never leaves a
half-written config.yaml, metrics.json, failed.json or cache index that a report or a resume would trust."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    """Write to a temp file beside `path`, then rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj: dict) -> None:
    write_text(path, json.dumps(obj, indent=1, default=float))
