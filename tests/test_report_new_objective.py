"""Adding an objective is one Python file and one YAML: trained through genrec.train and shown by
genrec.report under the label, order and ablation rule its class declares (nothing in genrec changes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

SMOOTHED = '''
"""CE with label smoothing: (1 - eps) * NLL + eps * mean over the vocabulary of -log p."""
import torch

from genrec.objectives.ce import CE


class Smoothed(CE):
    label = "CE-smoothed"  # its row in genrec.report
    order = 0.5  # between CE (0) and MSL (1)
    ablations = {"uniform_over": "vocab"}  # another value: its own row

    def __init__(self, eps: float = 0.1, uniform_over: str = "vocab", temperature: float = 1.0,
                 end_token: bool = False) -> None:
        super().__init__(temperature, end_token)
        self.eps = eps

    def forward(self, batch, backbone):
        _, logits = self.teacher_forced(batch, backbone)
        logp = torch.log_softmax(logits / self.temperature, -1)
        nll = -logp.gather(-1, self.scored(batch["target"])[..., None]).squeeze(-1)
        loss = ((1 - self.eps) * nll - self.eps * logp.mean(-1)).mean()
        return loss, {"nll": nll.mean().detach()}
'''
YAML = """# CE with label smoothing (a user's objective, outside genrec).
_target_: smoothed_objective.Smoothed
eps: 0.1
uniform_over: vocab
temperature: 1.0
"""


@pytest.fixture
def user_objective(tmp_path, monkeypatch):
    """smoothed_objective.py on the import path and conf/objective/smoothed.yaml on Hydra's search path."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "smoothed_objective.py").write_text(SMOOTHED)
    (tmp_path / "conf" / "objective").mkdir(parents=True)
    (tmp_path / "conf" / "objective" / "smoothed.yaml").write_text(YAML)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    return tmp_path


def test_new_objective_trains_and_reports_under_its_label(user_objective):
    from hydra import compose, initialize_config_dir

    from genrec.train import run

    tmp = user_objective
    sweep = tmp / "sweep"
    for obj, extra in [("ce", []), ("smoothed", []), ("smoothed", ["objective.uniform_over=targets"])]:
        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=[f"hydra.searchpath=[file://{tmp / 'conf'}]", "experiment=tiny",
                                               f"objective={obj}", "trainer.max_epochs=1",
                                               "trainer.limit_train_batches=5", *extra,
                                               f"run_dir={sweep}/{obj}{len(extra)}", f"data_dir={tmp / 'data'}"])
        run(cfg)
    metrics = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/metrics.json")}
    assert set(metrics) == {"ce0", "smoothed0", "smoothed1"}

    out = tmp / "report"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{tmp / 'pkg'}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-m", "genrec.report", f"runs=[{sweep}]", f"out={out}",
                           "metrics=[recall@5]"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert [r["objective"] for r in s["rows"]] == ["CE", "CE-smoothed", "CE-smoothed (uniform_over=targets)"]
    cells = {c["objective"]: c for c in s["cells"]}
    for name, lab in [("ce0", "CE"), ("smoothed0", "CE-smoothed"), ("smoothed1", "CE-smoothed (uniform_over=targets)")]:
        assert cells[lab]["mean"] == metrics[name]["test/recall@5"] and cells[lab]["n"] == 1
    shown = [[x.strip() for x in ln.strip("|").split("|")] for ln in proc.stdout.splitlines() if ln.startswith("|")]
    assert shown[3][:3] == ["TIGER", "CE-smoothed", "1"]
