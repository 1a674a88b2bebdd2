"""Same config + seed => the same metrics as the code these were recorded on (a refactor of the
models, objectives or training must not change them). Four short runs on the synthetic data
(`experiment=tiny`, 2 epochs): TIGER and Llama, each with CE and pairwise APAO (dropout, the
hand-written / recomputed candidate backward, beam-search evaluation), through the CLI.

Re-record (only for a change that is meant to alter the numbers, and say so in the commit):

    OMP_NUM_THREADS=1 python tests/test_pinned_metrics.py

Tolerances: 1 and 2 threads gave the same metrics and losses within 2e-7 on the recording machine; another CPU may
round matmuls differently, so losses are compared to 1e-4 and ranking metrics (counts / 300
users) to 1e-6.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run_helpers import reproducible  # noqa: E402

ROOT = Path(__file__).parents[1]
PINNED = Path(__file__).with_name("pinned_metrics.json")
GRID = ["backbone=tiger_tiny,llama_tiny", "objective=ce,apao"]
LOSS_TOL, METRIC_TOL = 1e-4, 1e-6


def run_grid(out: Path) -> dict[str, dict]:
    """metrics.json of each run of the grid, keyed "<backbone>-<objective>", without timings and paths."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "genrec.train", "-m", "experiment=tiny", "trainer.max_epochs=2", *GRID,
           f"hydra.sweep.dir={out / 'runs'}", f"data_dir={out / 'data'}"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {}
    for path in sorted((out / "runs").glob("*/metrics.json")):
        m = reproducible(json.loads(path.read_text()))
        runs[f"{m['backbone']}-{m['objective']}"] = m
    return runs


def _compare(got, want, key: str, errors: list[str]) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (key, sorted(set(got) ^ set(want)))
        for k in want:
            _compare(got[k], want[k], f"{key}/{k}", errors)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), key
        for i, (g, w) in enumerate(zip(got, want)):
            _compare(g, w, f"{key}[{i}]", errors)
    elif isinstance(want, float):
        tol = LOSS_TOL if key.endswith("loss") else METRIC_TOL
        if abs(got - want) > tol:
            errors.append(f"{key}: {got} != pinned {want}")
    elif got != want:
        errors.append(f"{key}: {got!r} != pinned {want!r}")


def test_metrics_match_the_pinned_run(tmp_path):
    got, want = run_grid(tmp_path), json.loads(PINNED.read_text())
    errors: list[str] = []
    _compare(got, want, "", errors)
    assert not errors, "\n".join(errors)


if __name__ == "__main__":  # re-record
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        PINNED.write_text(json.dumps(run_grid(Path(tmp)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINNED}")
