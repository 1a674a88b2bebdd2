"""genrec.report from a W&B project (runs=[wandb:<entity>/<project>[/<group>]]): the runs genrec logged (flat
config, final metrics as summary values) give the same table as their run dirs. The W&B API is replaced by
objects shaped as `wandb.Api().runs(...)` returns them (config unwrapped, summary_metrics a dict, state,
job_type, id)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from genrec import report as rep
from genrec.loggers import flat
from genrec.report.wandb_runs import resolve, run_group, unflatten

ROOT = Path(__file__).parents[1]
RUNS = ROOT / "docs" / "results" / "runs" / "office_cpu"
ROWS = ["tiger-ce-s42", "tiger-ce-s43", "tiger-ce-s44", "tiger-apao_pointwise-s42", "tiger-msl-s42"]


class FakeApi:
    """`wandb.Api()` for one project: runs(path, filters) -> the runs (group filter as W&B applies it)."""

    def __init__(self, project: str, runs: list) -> None:
        self.project, self.all, self.calls = project, runs, []

    def runs(self, path, filters=None):
        self.calls.append((path, filters))
        if path != self.project:
            raise ValueError(f"Could not find project {path}")
        return [r for r in self.all if not filters or r.group == filters["group"]]


def as_wandb(run_dir: Path, state: str = "finished", group: str = "sweep-1") -> SimpleNamespace:
    """The W&B run genrec's logger makes of a run dir: flat config and its command line (+ W&B's own _wandb),
    summary = the scalar final metrics (+ W&B's _step / _runtime, a logged table)."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    summary = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}  # genrec.loggers.log_final
    summary |= {"_step": 9, "_runtime": 1.5, "final_metrics": {"_type": "table-file"},  # W&B's own, a table
                "epoch": 41, "train/loss": 1.7, "lr-AdamW": 1e-6, "trainer/global_step": 2000}  # Lightning's last
    command = yaml.safe_load((run_dir / "overrides.yaml").read_text())
    return SimpleNamespace(id=run_dir.name, config={**flat(cfg), "command": command, "_wandb": {"cli_version": "0.2"}},
                           summary_metrics=summary, state=state, job_type="apao_office/tiger/x", group=group)


def test_unflatten_inverts_the_loggers_flat():
    cfg = {"objective": {"beta": 0.3, "bear": {"lam": 0.0, "widths": None}, "negatives": {}}, "tags": ["a"], "seed": 1}
    assert unflatten(flat(cfg)) == cfg


@pytest.mark.skipif(not RUNS.is_dir(), reason="no committed runs")
def test_report_from_a_wandb_project_matches_the_run_dirs(tmp_path):
    fakes = [as_wandb(RUNS / r) for r in ROWS]
    fakes += [SimpleNamespace(**{**vars(as_wandb(RUNS / "tiger-bear-s42")), "id": "crashed1", "state": "crashed"}),
              SimpleNamespace(id="rep1", config={"split": "test", "metrics": ["recall@10"]}, summary_metrics={},
                              state="finished", job_type="report", group="sweep-1")]
    api = FakeApi("me/genrec", fakes)
    dirs = rep.report([str(RUNS / r) for r in ROWS], tmp_path / "dirs", paper=None)
    runs = resolve(["wandb:me/genrec"], tmp_path / "wb", api)
    assert api.calls == [("me/genrec", None)]
    fetched = rep.report(runs, tmp_path / "wb")
    table = (tmp_path / "wb" / "table.md").read_text().splitlines()
    assert [line for line in table if "BEAR" not in line] == (tmp_path / "dirs" / "table.md").read_text().splitlines()
    assert [[c.strip() for c in line.split("|")[3:5]] for line in table if "BEAR" in line] == [["0", "failed"]]  # crashed
    assert fetched["runs"] == {"ok": len(ROWS), "failed": 1, "running": 0} and dirs["runs"]["ok"] == len(ROWS)
    assert sorted(p.name for p in (tmp_path / "wb" / "wandb_runs" / "0").iterdir()) == sorted(ROWS + ["crashed1"])
    # a group (a -m sweep's dir name) narrows it; W&B's filter does the narrowing
    api.all[0].group = "other"
    runs = resolve(["wandb:me/genrec/other"], tmp_path / "wb2", api)
    assert api.calls[-1] == ("me/genrec", {"group": "other"})
    assert [p.name for p in Path(runs[0]).iterdir()] == [ROWS[0]]


def test_the_report_run_joins_the_sources_group():
    assert run_group("wandb:me/genrec/sweep-1") == "sweep-1" and run_group("wandb:me/genrec") is None
    assert run_group("multirun/2026-12-06_10-00-00") == "2026-12-06_10-00-00"


def test_a_bad_wandb_source_is_one_line(tmp_path):
    api = FakeApi("me/genrec", [])
    with pytest.raises(ValueError, match=r"runs=wandb:me: expected wandb:<entity>/<project>\[/<group>\]"):
        resolve(["wandb:me"], tmp_path, api)
    with pytest.raises(ValueError, match="runs=wandb:me/nope: W&B: Could not find project me/nope"):
        resolve(["wandb:me/nope"], tmp_path, api)
    out = subprocess.run([sys.executable, "-m", "genrec.report", "runs=[wandb:me]", f"out={tmp_path}/r"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1] == (
        "error: runs=wandb:me: expected wandb:<entity>/<project>[/<group>]")
