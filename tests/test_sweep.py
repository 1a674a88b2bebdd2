"""Hydra multirun sweeps: shared data artefacts, W&B offline logging, failed jobs recorded."""

import json
import subprocess
import sys
from pathlib import Path

from test_wandb import read_run

ROOT = Path(__file__).parents[1]


def test_sweep_logs_wandb_offline_and_records_a_failed_job(tmp_path):
    sweep = tmp_path / "sweep"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}  # no WANDB_API_KEY: offline
    out = subprocess.run(
        [sys.executable, "-m", "genrec.train", "-m", "experiment=tiny", "trainer.max_epochs=1", "logger=wandb",
         "objective=ce,apao_pointwise", "optim.lr=3e-3,1e30", "trainer.gradient_clip=null",
         f"hydra.sweep.dir={sweep}", f"data_dir={tmp_path}/data"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 4, out.stderr[-3000:]
    ok = [j for j in jobs if (j / "metrics.json").exists()]
    failed = [j for j in jobs if (j / "failed.json").exists()]
    # lr=1e30 diverges: those jobs are recorded as failed, the others still ran to the end.
    assert len(ok) == 2 and len(failed) == 2
    assert all("lr: 1.0e+30" in (j / ".hydra" / "config.yaml").read_text() for j in failed)
    assert "non-finite loss" in json.loads((failed[0] / "failed.json").read_text())["error"]
    assert out.returncode != 0  # Hydra reports the failure after all jobs ran
    # One data artefact per stage, shared by all jobs.
    assert len(list((tmp_path / "data" / "sids").glob("[0-9a-f]*[!k]"))) == 1
    # Each job's own W&B run, finished with its job's exit code (0 ok, 1 failed).
    for job in jobs:
        (folder,) = job.glob("wandb/offline-run-*")
        run = read_run(folder)
        assert run["exit_code"] == (0 if job in ok else 1), job.name
        assert run["config"]["optim.lr"] == (1e30 if job in failed else 3e-3)
        if job in ok:
            assert "test/recall@5" in run["summary"] and "final_metrics" in run["tables"]
            assert any("train/loss" in h for h in run["history"]) and any("val/ndcg@5" in h for h in run["history"])
            assert ("train/apao/w1" in str(run["history"])) == ("apao" in job.name)
    # ... and the sweep reports into a table: both objectives' rows, the failed configs not counted.
    rep = subprocess.run([sys.executable, "-m", "genrec.report", f"runs=[{sweep}]", f"out={tmp_path}/report",
                          "metrics=[recall@5,ndcg@5]"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    table = (tmp_path / "report" / "table.md").read_text()
    assert "CE" in table and "APAO-pointwise" in table
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["runs"]["ok"] == 2 and summary["runs"]["failed"] == 2
