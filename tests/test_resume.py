"""kill -9 at named points (tests/killpoint.py), resume, and get exactly the uninterrupted run.

Each test chains its kills: the run is killed, resumed and killed again at the next point, and
so on, and the last resume must finish with the metrics (and CSV log) of a run never killed.
Tiny runs: 3 epochs of 6 steps, a row logged every 2 steps.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from run_helpers import reproducible

ROOT = Path(__file__).parents[1]
TINY = ["experiment=tiny", "trainer.max_epochs=3", "trainer.limit_train_batches=6", "trainer.log_every_n_steps=2"]


def train(run_dir: Path, data_dir: Path, *extra: str, kill: tuple[str, int] | None = None):
    entry = [str(ROOT / "tests" / "killpoint.py"), kill[0], str(kill[1])] if kill else ["-m", "genrec.train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    return subprocess.run([sys.executable, *entry, *TINY, f"hydra.run.dir={run_dir}", f"data_dir={data_dir}", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def stable(run_dir: Path) -> dict:
    return reproducible(json.loads((run_dir / "metrics.json").read_text()))


def kill_chain(tmp_path: Path, points: list[tuple[str, int]], *extra: str) -> tuple[Path, Path]:
    """An uninterrupted run, and a run killed at each point in turn and then resumed to the end."""
    full, killed = tmp_path / "full" / "run", tmp_path / "killed" / "run"  # no sibling to resume from
    out = train(full, tmp_path / "data", *extra)
    assert out.returncode == 0, out.stderr[-3000:]
    for i, point in enumerate(points):
        out = train(killed, tmp_path / "data", *extra, *(["resume=true"] if i else []), kill=point)
        assert out.returncode == -9, f"{point}: not killed there (rc {out.returncode}) {out.stderr[-3000:]}"
        assert not (killed / "metrics.json").exists()
        if point[0] == "ckpt":  # died half-way through writing a checkpoint: that is a temporary file
            half = list((killed / "checkpoints").glob(".*.ckpt.tmp"))
            assert half, "the checkpoint write was not interrupted"
            for ckpt in (killed / "checkpoints").glob("*.ckpt"):
                torch.load(ckpt, map_location="cpu", weights_only=False)  # whole, loadable
    out = train(killed, tmp_path / "data", *extra, "resume=true")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    return full, killed


def test_csv_logger_resumes_after_kills_anywhere(tmp_path):
    points = [
        ("train", 1),  # epoch 0, before the first row is logged (no checkpoint yet: starts over)
        ("train", 7),  # epoch 1, first step: last.ckpt of epoch 0, no row of epoch 1 logged yet
        ("train", 10),  # epoch 1, after two rows of epoch 1 were logged
        ("val", 1),  # inside validation of epoch 1
        ("ckpt", 2),  # half-way through writing its second checkpoint file (epoch 1 or 2)
        ("test", 0),  # inside the final test
    ]
    full, killed = kill_chain(tmp_path, points)
    assert stable(killed) == stable(full)
    # The log reads as if the run was never killed: rows up to each checkpoint kept, none twice.
    assert (killed / "logs" / "metrics.csv").read_text() == (full / "logs" / "metrics.csv").read_text()


def test_resume_with_weight_averaging_continues_both_the_average_and_the_raw_weights(tmp_path):
    """callbacks=[default,ema]: a checkpoint's state_dict holds the average, the raw weights ride beside it; killed
    mid-epoch, inside validation (the average swapped in) and in the test, the run ends as if never killed."""
    full, killed = kill_chain(tmp_path, [("train", 7), ("val", 1), ("test", 0)], "callbacks=[default,ema]",
                              "callbacks.ema.decay=0.9")
    assert stable(killed) == stable(full)


def test_resume_after_early_stopping_does_not_train_on(tmp_path):
    # val/users never improves after epoch 0: with patience 1 the run stops after epoch 1 of 3.
    full, killed = kill_chain(tmp_path, [("test", 0)], "trainer.monitor=val/users", "trainer.patience=1")
    assert stable(full)["epochs"] == 2
    assert stable(killed) == stable(full)


def test_wandb_logger_resumes_after_kills(tmp_path):
    full, killed = kill_chain(tmp_path, [("train", 10)], "logger=wandb")
    assert stable(killed) == stable(full)
    runs = sorted(killed.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 2  # the killed process's and the resumed one's ...
    assert len({p.name for p in runs}) == 1  # ... logging into one W&B run (same id: run-<id>.wandb)


@pytest.mark.parametrize("legacy", [False, True])
def test_wall_time_counts_the_processes_before_a_resume(tmp_path, legacy):
    """metrics.json's `seconds` (and `train_seconds`) cover the whole run, not just its last process: the
    killed process's time is in last.ckpt; set it to 3 hours so no timing noise can hide a dropped part.
    legacy: a checkpoint from before genrec counted training seconds; their total is then unknown (None)."""
    run = tmp_path / "run"
    out = train(run, tmp_path / "data", kill=("train", 7))  # epoch 1: last.ckpt holds epoch 0
    assert out.returncode == -9, out.stderr[-3000:]
    last = run / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert 0 < ckpt["elapsed"] < 600 and 0 < ckpt["train_elapsed"] <= ckpt["elapsed"]
    ckpt["elapsed"], ckpt["train_elapsed"] = 3 * 3600.0, 2 * 3600.0
    if legacy:
        del ckpt["train_elapsed"]
    torch.save(ckpt, last)
    out = train(run, tmp_path / "data", "resume=true")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resume: continuing {run} after epoch 0 (checkpoints/last.ckpt)" in out.stdout  # the log says so
    m = json.loads((run / "metrics.json").read_text())
    assert 3 * 3600 < m["seconds"] < 3 * 3600 + 600
    assert m["train_seconds"] is None if legacy else 2 * 3600 < m["train_seconds"] < 2 * 3600 + 600
    assert [h["seconds"] > 3 * 3600 for h in m["history"]] == [False, True, True]  # epoch 0 ran before the kill
    assert m["peak_rss_gb"] > 0.1 and m["processes"] == 1


def test_resume_with_another_config_is_one_clear_error_and_touches_nothing(tmp_path):
    """A run dir continues only under the config it ran: another lr or seed would go on from its checkpoint
    under another recipe, and its config.yaml would claim the new one. Where and how it runs may change."""
    run_dir, data = tmp_path / "run", tmp_path / "data"
    out = train(run_dir, data)
    assert out.returncode == 0, out.stderr[-3000:]
    first = yaml.safe_load((run_dir / "overrides.yaml").read_text())  # the command line of the run's first start
    assert first == [*TINY, f"data_dir={data}"]
    # genrec's files; Hydra itself rewrites .hydra/*.yaml before any genrec code runs
    files = sorted(p for p in run_dir.rglob("*") if p.is_file() and ".hydra" not in p.parts)
    before = {p: p.read_bytes() for p in files}
    out = train(run_dir, data, "resume=true", "optim.lr=0.002", "seed=7")
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-3000:]
    assert "optim.lr: 0.003 -> 0.002" in errors[0] and "seed: 42 -> 7" in errors[0]
    assert "Traceback" not in out.stderr
    assert sorted(p for p in run_dir.rglob("*") if p.is_file() and ".hydra" not in p.parts) == files
    assert all(p.read_bytes() == b for p, b in before.items())
    out = train(run_dir, data, "resume=true", "trainer.eval_batch_size=7",
                "trainer.progress_bar=true")
    assert out.returncode == 0, out.stderr[-3000:]
    assert yaml.safe_load((run_dir / "overrides.yaml").read_text()) == first  # what reruns the run: never rewritten
