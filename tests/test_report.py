"""genrec.report on fake run dirs with known metrics (+ one real tiny multirun end to end)."""

import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from genrec import report as rep
from genrec.report.load import load_runs

ROOT = Path(__file__).parents[1]
METRICS = ["recall@10", "ndcg@10", "recall@20", "ndcg@20"]
SCALE = {"recall@10": 1.0, "ndcg@10": 0.5, "recall@20": 1.4, "ndcg@20": 0.6}
BASE = {("beauty", "tiger"): 0.060, ("beauty", "llama"): 0.050, ("yelp", "tiger"): 0.040, ("yelp", "llama"): 0.030}
OBJECTIVES = {"ce": {"_target_": "genrec.objectives.ce.CE", "temperature": 1.0},
              "pairwise": {"_target_": "genrec.objectives.apao.APAO", "loss": "pairwise", "beta": 0.1, "eta": 1e-5,
                           "weights": "paper", "bear": None},
              "pointwise": {"_target_": "genrec.objectives.apao.APAO", "loss": "pointwise", "beta": 0.1, "eta": 1e-5,
                            "weights": "paper", "bear": None}}
LABEL = {"ce": "CE", "pairwise": "APAO-pairwise", "pointwise": "APAO-pointwise"}
T = 3
OLD = time.time() - 3600


def value(ds: str, bb: str, obj: str, seed: int, metric: str) -> float:
    mult = {"ce": 1.0, "pairwise": 1.05, "pointwise": 1.08 if (ds, bb) == ("beauty", "llama") else 1.02}[obj]
    return BASE[(ds, bb)] * mult * SCALE[metric] + {1: -0.001, 2: 0.0025}[seed] * SCALE[metric]


def write_run(path: Path, ds: str, bb: str, objective: dict, seed: int, metrics: dict | None, old: bool = False,
              logs: list[dict] | None = None, evals: dict[int, dict] | None = None, extra: dict | None = None) -> Path:
    path.mkdir(parents=True)
    cfg = {"dataset": {"name": ds}, "backbone": {"_target_": f"genrec.models.{bb}.{bb.title()}", "d_model": 8},
           "objective": objective, "eval": {"beam": 20, "ks": [5, 10, 20]},
           "trainer": {"monitor": "val/ndcg@10", "devices": 1}, "seed": seed, "run_dir": str(path), **(extra or {})}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    if metrics is not None:
        (path / "metrics.json").write_text(json.dumps({**metrics, "backbone": bb, "dataset": ds, "seed": seed}))
    if logs:
        (path / "logs").mkdir()
        keys = sorted({k for r in logs for k in r})
        with (path / "logs" / "metrics.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, keys)
            w.writeheader()
            w.writerows(logs)
    for beam, e in (evals or {}).items():
        (path / "eval").mkdir(exist_ok=True)
        (path / "eval" / f"test-beam{beam}.json").write_text(json.dumps({**e, "beam": beam, "full_rank": False}))
    if old:
        for p in path.rglob("*"):
            os.utime(p, (OLD, OLD))
    return path


def fake_metrics(ds, bb, obj, seed) -> dict:
    m = {f"test/{k}": value(ds, bb, obj, seed, k) for k in METRICS}
    m.update({f"val/{k}": 0.9 * value(ds, bb, obj, seed, k) for k in METRICS})
    m.update({f"test/prefix_recall@{t}": 0.5 / t + 0.01 * seed for t in range(1, T + 1)})
    m.update({f"test/pruning_rate@{k}": 0.1 * k / 20 + 0.01 * len(obj) for k in (5, 10, 20)})
    m["history"] = [{"epoch": e, "loss": 3.0 - 0.1 * e, "ndcg@10": 0.01 * (e + 1) + 0.001 * seed} for e in range(3)]
    return m


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """2 datasets × 2 backbones × {ce, apao-pairwise, apao-pointwise} × 2 seeds; (yelp, llama, pointwise) failed
    on both seeds; a failed earlier attempt duplicating (beauty, tiger, ce, seed 1) that a rerun replaced."""
    root = tmp_path_factory.mktemp("runs")
    for ds, bb in BASE:
        for obj in OBJECTIVES:
            for seed in (1, 2):
                failed = (ds, bb, obj) == ("yelp", "llama", "pointwise")
                logs = [{"epoch": e, "step": 10 * e + s, "train/loss": 4.0 - e - 0.1 * s,
                         **({f"train/apao/w{m}": (m + e) / 10 for m in range(1, T + 1)} if obj != "ce" else {})}
                        for e in range(3) for s in range(2)]
                evals = {b: {f"test/{k}": value(ds, bb, obj, seed, k) * b / 20 for k in METRICS} for b in (5, 10)}
                write_run(root / "multirun" / f"{ds}-{bb}-{obj}-{seed}", ds, bb, OBJECTIVES[obj], seed,
                          None if failed else fake_metrics(ds, bb, obj, seed), old=failed, logs=logs, evals=evals)
    write_run(root / "outputs" / "attempt0", "beauty", "tiger", OBJECTIVES["ce"], 1, None, old=True)
    (root / "outputs" / "notarun").mkdir()
    (root / "outputs" / "notarun" / "config.yaml").write_text("lr: 1\n")
    out = root / "report"
    summary = rep.report([root / "multirun", root / "outputs"], out, METRICS, baseline="ce", split="test")
    return root, out, summary


def expected_cells() -> dict:
    """Reference: explicit loops over the seeds, sample std, gain over the CE mean, best per backbone block."""
    exp = {}
    for (ds, bb) in BASE:
        for obj in OBJECTIVES:
            for m in METRICS:
                if (ds, bb, obj) == ("yelp", "llama", "pointwise"):
                    exp[(bb, LABEL[obj], ds, m)] = {"status": "failed", "mean": None}
                    continue
                xs = [value(ds, bb, obj, s, m) for s in (1, 2)]
                mean = sum(xs) / len(xs)
                std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
                exp[(bb, LABEL[obj], ds, m)] = {"status": "ok", "mean": mean, "std": std}
    for (bb, lab, ds, m), c in exp.items():
        ce = exp[(bb, "CE", ds, m)]["mean"]
        c["gain"] = None if lab == "CE" or c["mean"] is None else (c["mean"] - ce) / ce * 100
        block = [exp[(bb, l2, ds, m)]["mean"] for l2 in LABEL.values() if exp[(bb, l2, ds, m)]["mean"] is not None]
        c["best"] = c["mean"] is not None and all(c["mean"] >= x for x in block)
    return exp


def test_table_cells_match_reference(grid):
    _, out, summary = grid
    exp = expected_cells()
    cells = {(c["backbone"], c["objective"], c["dataset"], c["metric"]): c for c in summary["cells"]}
    assert set(cells) == set(exp)
    for key, e in exp.items():
        c = cells[key]
        assert c["status"] == e["status"], key
        if e["mean"] is None:
            assert c["mean"] is None and c["text"] == "failed" and not c["best"]
            continue
        assert c["n"] == 2 and c["seeds"] == [1, 2]
        assert c["mean"] == pytest.approx(e["mean"], rel=1e-12) and c["std"] == pytest.approx(e["std"], rel=1e-9)
        assert (c["gain"] is None) == (e["gain"] is None) and (e["gain"] is None or c["gain"] == pytest.approx(e["gain"]))
        assert c["best"] == e["best"], key
    # the reference picks the winners the fake numbers were built to have
    assert cells[("tiger", "APAO-pairwise", "beauty", "ndcg@10")]["best"]
    assert cells[("llama", "APAO-pointwise", "beauty", "recall@20")]["best"]
    assert cells[("llama", "APAO-pairwise", "yelp", "recall@10")]["best"]  # pointwise failed there
    assert summary["runs"] == {"ok": 22, "failed": 3, "running": 0}
    assert [r["objective"] for r in summary["rows"]][:3] == ["CE", "APAO-pointwise", "APAO-pairwise"]


def test_markdown_latex_csv_written_and_parseable(grid):
    _, out, summary = grid
    exp = expected_cells()
    rows = [(r["backbone"], r["objective"]) for r in summary["rows"]]
    cols = [(c["dataset"], c["metric"]) for c in summary["columns"]]
    assert cols == [(d, m) for d in ("beauty", "yelp") for m in METRICS]

    md = (out / "table.md").read_text().strip().splitlines()
    table = [[x.strip() for x in line.strip("|").split("|")] for line in md]
    assert table[0] == ["Backbone", "Objective", "Seeds"] + [f"{d} {m}" for d, m in cols] and len(table) == 2 + len(rows)
    for (bb, lab), line in zip(rows, table[2:]):
        assert line[:3] == [rep.BACKBONE_NAMES[bb], lab, "2"]
        for (d, m), text in zip(cols, line[3:]):
            e = exp[(bb, lab, d, m)]
            if e["mean"] is None:
                assert text == "failed"
                continue
            want = f"{e['mean']:.4f}"
            want = f"**{want}**" if e["best"] else want
            want += f" ± {e['std']:.4f}" + (f" ({e['gain']:+.2f}%)" if e["gain"] is not None else "")
            assert text == want

    with (out / "table.csv").open() as f:
        wide = list(csv.reader(f))
    assert wide[0] == table[0] and [r for r in wide[1:]] == [[x.replace("**", "") for x in r] for r in table[2:]]
    with (out / "cells.csv").open() as f:
        long = list(csv.DictReader(f))
    assert len(long) == len(rows) * len(cols)
    for r in long:
        e = exp[(r["backbone"], r["objective"], r["dataset"], r["metric"])]
        assert r["status"] == e["status"] and (e["mean"] is None or float(r["mean"]) == pytest.approx(e["mean"]))
        assert (r["best"] == "True") == e["best"]

    tex = (out / "table.tex").read_text()
    body = [ln for ln in tex.splitlines() if ln.endswith(r"\\")]
    assert tex.startswith(r"\begin{tabular}{lll" + "r" * len(cols) + "}") and tex.strip().endswith(r"\end{tabular}")
    assert all(ln.count("&") == len(cols) + 2 for ln in body[1:])  # body[0] is the multicolumn dataset row
    assert tex.count(r"\textbf{") == sum(e["best"] for e in exp.values()) and r"$\pm$" in tex and r"\%" in tex
    assert tex.count(r"\midrule") == 2  # header rule + between the backbone blocks


def test_plots_written_and_nonempty(grid):
    _, out, summary = grid
    pngs = [f for f in summary["files"] if f.endswith(".png")]
    for ds, bb in BASE:
        for kind in ("prefix_recall", "pruning_rate", "beam_width", "training_curves"):
            assert f"{kind}_{ds}_{bb}.png" in pngs
        if (ds, bb) != ("yelp", "llama"):
            assert f"apao_weights_{ds}_{bb}_APAO-pointwise.png" in pngs
        assert f"apao_weights_{ds}_{bb}_APAO-pairwise.png" in pngs
    assert not any(f.startswith(("heatmap", "sensitivity")) for f in pngs)  # no sweeps in this grid
    assert sorted(p.name for p in out.glob("*.png")) == sorted(pngs)
    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024


def test_running_vs_failed_and_missing_cells(tmp_path):
    write_run(tmp_path / "a", "beauty", "tiger", OBJECTIVES["ce"], 1, fake_metrics("beauty", "tiger", "ce", 1))
    b = write_run(tmp_path / "b", "beauty", "tiger", OBJECTIVES["pairwise"], 1, None)  # just started
    write_run(tmp_path / "c", "yelp", "tiger", OBJECTIVES["ce"], 1, fake_metrics("yelp", "tiger", "ce", 1))
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10"])
    text = {(c["objective"], c["dataset"]): c["text"] for c in s["cells"]}
    assert text == {("CE", "beauty"): f"**{value('beauty', 'tiger', 'ce', 1, 'recall@10'):.4f}**",
                    ("CE", "yelp"): f"**{value('yelp', 'tiger', 'ce', 1, 'recall@10'):.4f}**",
                    ("APAO-pairwise", "beauty"): "running", ("APAO-pairwise", "yelp"): "—"}
    for p in b.rglob("*"):
        os.utime(p, (OLD, OLD))
    s = rep.report([tmp_path], tmp_path / "out2", ["recall@10"], stale_minutes=30)
    assert {c["text"] for c in s["cells"] if c["objective"] == "APAO-pairwise"} == {"failed", "—"}
    # train.py's failed.json marks a fresh run dir failed at once, with its error in the notes
    d = write_run(tmp_path / "d", "yelp", "tiger", OBJECTIVES["pointwise"], 3, None)
    (d / "failed.json").write_text(json.dumps({"error": "NonFiniteLoss: non-finite loss at epoch 0"}))
    s = rep.report([tmp_path], tmp_path / "out3", ["recall@10"])
    cell = next(c for c in s["cells"] if (c["objective"], c["dataset"]) == ("APAO-pointwise", "yelp"))
    assert cell["text"] == "failed" and cell["failed"] == [str(d.resolve())]
    assert f"failed: yelp/tiger/APAO-pointwise seed 3: {d.resolve()} (NonFiniteLoss: non-finite loss at epoch 0)" \
        in s["notes"]


def test_beta_eta_sweep_selects_on_validation_and_draws_heatmap(tmp_path, monkeypatch):
    betas, etas = [0.1, 0.2, 0.4], [5e-6, 1e-4]
    val = {(b, e): 0.02 + b * 0.01 + (0.005 if e == 1e-4 else 0.0) - (0.02 if b == 0.4 else 0.0)
           for b in betas for e in etas}
    test = {(b, e): 0.05 + b * 0.02 - e * 100 for b in betas for e in etas}  # val and test disagree on purpose
    for (b, e) in val:
        for seed in (1, 2):
            m = {"test/recall@10": test[(b, e)] + seed * 1e-3, "test/ndcg@10": test[(b, e)] / 2,
                 "val/ndcg@10": val[(b, e)] + seed * 1e-4, "history": []}
            write_run(tmp_path / f"b{b}-e{e}-s{seed}", "beauty", "tiger", {**OBJECTIVES["pairwise"], "beta": b,
                                                                           "eta": e}, seed, m)
    write_run(tmp_path / "ce", "beauty", "tiger", OBJECTIVES["ce"], 1, {"test/recall@10": 0.05, "test/ndcg@10": 0.02,
                                                                       "val/ndcg@10": 0.01, "history": []})
    bear = {"_target_": "genrec.objectives.bear.BEAR", "form": "reweight", "xi": 2.75}
    for lam in (0.5, 0.1, 0.25):  # a one-parameter sweep: a line plot
        write_run(tmp_path / f"bear{lam}", "beauty", "tiger", {**bear, "lam": lam}, 1,
                  {"test/recall@10": lam, "val/ndcg@10": -abs(lam - 0.25), "history": []})
    for lr in (1e-3, 2e-3):  # configs differing outside the objective: no sensitivity plot, a note
        write_run(tmp_path / f"msl{lr}", "beauty", "tiger", {"_target_": "genrec.objectives.msl.MSL"}, 1,
                  {"test/recall@10": lr, "val/ndcg@10": lr, "history": []}, extra={"optim": {"lr": lr}})
    seen = []
    real = rep.plots.heatmaps
    monkeypatch.setattr(rep.plots, "heatmaps", lambda path, panels, *a: (seen.append((panels, *a)), real(path, panels, *a))[1])
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10", "ndcg@10"])

    best = max(val, key=val.get)
    assert best == (0.2, 1e-4)
    sel = next(x for x in s["selected"] if x["objective"] == "APAO-pairwise")
    assert (sel["objective_params"]["objective.beta"], sel["objective_params"]["objective.eta"]) == best
    assert sel["variants"] == 6 and len(sel["runs"]) == 2
    assert "beauty/tiger/APAO-pairwise: best of 6 configs on val/ndcg@10: objective.beta=0.2, objective.eta=0.0001" \
        in s["notes"]
    cell = next(c for c in s["cells"] if c["objective"] == "APAO-pairwise" and c["metric"] == "recall@10")
    assert cell["mean"] == pytest.approx(test[best] + 1.5e-3)
    assert cell["gain"] == pytest.approx((test[best] + 1.5e-3 - 0.05) / 0.05 * 100)

    assert len(seen) == 1
    panels, rows, cols, ylabel, xlabel, _ = seen[0]
    assert (rows, cols, ylabel, xlabel) == (betas, etas, "beta", "eta")
    name, g = panels[0]
    assert name == "recall@10"
    for i, b in enumerate(betas):
        for j, e in enumerate(etas):
            assert g[i][j] == pytest.approx(test[(b, e)] + 1.5e-3)
    for name in ("heatmap_beauty_tiger_APAO-pairwise_betaxeta.png", "sensitivity_beauty_tiger_BEAR_lam.png"):
        png = tmp_path / "out" / name
        assert name in s["files"] and png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 1024
    assert sum(f.startswith(("heatmap", "sensitivity")) for f in s["files"]) == 2
    assert "no sensitivity plot for beauty/tiger/MSL: the runs differ in optim.lr" in s["notes"]
    cells = {(c["objective"], c["metric"]): c for c in s["cells"]}
    assert cells[("BEAR", "recall@10")]["mean"] == 0.25 and cells[("MSL", "recall@10")]["mean"] == 2e-3
    assert cells[("BEAR", "ndcg@10")]["text"] == "—"


def test_labels_variants_and_ablations():
    assert rep.objective_label({"_target_": "genrec.objectives.sdpo.SDPO", "bear": True}) == "S-DPO+BEAR"
    assert rep.objective_label({"_target_": "genrec.objectives.bear.BEAR", "form": "reweight"}) == "BEAR"
    assert rep.objective_label({"_target_": "genrec.objectives.apao.APAO", "loss": "pairwise", "weights": "uniform",
                                "bear": {"lam": 0.1}}) == "APAO-pairwise+BEAR (weights=uniform)"
    assert rep.objective_label({"_target_": "genrec.objectives.msl.MSL"}) == "MSL"
    assert rep.objective_label({"_target_": "genrec.objectives.gone.Renamed", "x": 1}) == "Renamed"  # not importable


def test_pruning_rate_column_bolds_the_lowest(grid):
    """PR@k is minimised: its best cell per backbone block is the lowest mean (CE's in the fake grid)."""
    root, _, _ = grid
    s = rep.report([root / "multirun"], root / "pr", ["pruning_rate@10", "recall@10"])
    best = {(c["backbone"], c["dataset"], c["metric"]): c["objective"] for c in s["cells"] if c["best"]}
    assert len(best) == 8 and all(lab == "CE" for (_, _, m), lab in best.items() if m == "pruning_rate@10")
    assert all(lab != "CE" for (_, _, m), lab in best.items() if m == "recall@10")


def test_real_runs_then_report_cli(tmp_path):
    """Two real tiny training runs (CE, APAO) through genrec.train.run, then `python -m genrec.report`."""
    from hydra import compose, initialize_config_dir

    from genrec.train import run

    sweep = tmp_path / "sweep"
    for i, obj in enumerate(["ce", "apao"]):
        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=["experiment=tiny", f"objective={obj}", "trainer.max_epochs=1",
                                               "trainer.limit_train_batches=10",
                                               f"run_dir={sweep}/{i}_{obj}", f"data_dir={tmp_path / 'data'}"])
        run(cfg)
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "genrec.report", f"runs=[{sweep}]", f"out={out}",
                           "metrics=[recall@5,ndcg@5]"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    runs = {json.loads(p.read_text())["objective"]: json.loads(p.read_text()) for p in sweep.glob("*/metrics.json")}
    cells = {(c["objective"], c["metric"]): c for c in s["cells"]}
    for m in ("recall@5", "ndcg@5"):
        ce, apao = runs["ce"][f"test/{m}"], runs["apao"][f"test/{m}"]
        assert cells[("CE", m)]["mean"] == ce and cells[("APAO-pairwise", m)]["mean"] == apao
        assert cells[("APAO-pairwise", m)]["gain"] == pytest.approx((apao / ce - 1) * 100)
    assert s["runs"] == {"ok": 2, "failed": 0, "running": 0} and [r["backbone"] for r in s["rows"]] == ["tiger"] * 2
    assert {"prefix_recall_synthetic_tiger.png", "training_curves_synthetic_tiger.png",
            "apao_weights_synthetic_tiger_APAO-pairwise.png"} <= set(s["files"])
    shown = [[x.strip() for x in ln.strip("|").split("|")] for ln in proc.stdout.splitlines() if ln.startswith("|")]
    assert shown[2][:3] == ["TIGER", "CE", "1"] and (out / "table.tex").exists()
    bad = subprocess.run([sys.executable, "-m", "genrec.report", f"runs=[{tmp_path / 'nothing'}]",
                          f"out={tmp_path / 'empty'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no run dirs" in bad.stderr


def test_sweep_monitored_on_a_loss_selects_the_lowest(tmp_path):
    """Runs selecting on a validation loss (`trainer.monitor_mode: min`, e.g. experiment=apao_release):
    the report keeps the configuration with the LOWEST mean validation loss."""
    loss = {0.1: 3.0, 0.2: 2.5, 0.3: 2.8}
    for beta, v in loss.items():
        write_run(tmp_path / f"b{beta}", "beauty", "tiger", {**OBJECTIVES["pointwise"], "beta": beta}, 1,
                  {"test/recall@10": beta, "val/objective_loss": v, "val/ndcg@10": beta / 10, "history": []},
                  extra={"trainer": {"monitor": "val/objective_loss", "monitor_mode": "min", "devices": 1}})
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10"])
    sel = next(x for x in s["selected"] if x["objective"] == "APAO-pointwise")
    assert sel["objective_params"]["objective.beta"] == 0.2
    cell = next(c for c in s["cells"] if c["objective"] == "APAO-pointwise" and c["metric"] == "recall@10")
    assert cell["mean"] == 0.2
    s = rep.report([tmp_path], tmp_path / "by_ndcg", ["recall@10"], select="val/ndcg@10")  # maximised
    sel = next(x for x in s["selected"] if x["objective"] == "APAO-pointwise")
    assert sel["objective_params"]["objective.beta"] == 0.3


def test_paper_reference_columns_and_gains(tmp_path):
    """`paper=` reference numbers: a "paper <metric>" column per metric that has one, its gain over the
    reference's own CE row; our cells unchanged; a malformed file is refused naming the file and key."""
    for obj in ("ce", "pointwise"):
        for seed in (1, 2):
            write_run(tmp_path / "runs" / f"{obj}{seed}", "office", "tiger", OBJECTIVES[obj], seed,
                      fake_metrics("beauty", "tiger", obj, seed))
    ref = {"office": {"tiger": {"CE": {"recall@10": 0.0608}, "APAO-pointwise": {"recall@10": 0.0667},
                                "APAO-pairwise": {"recall@10": 0.0671}}}}
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(ref))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "genrec.report", f"runs=[{tmp_path / 'runs'}]", f"out={out}",
                           "metrics=[recall@10,ndcg@10]", f"paper={tmp_path / 'paper.yaml'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    md = [[x.strip() for x in ln.strip("|").split("|")] for ln in (out / "table.md").read_text().splitlines()]
    assert md[0] == ["Backbone", "Objective", "Seeds", "office recall@10", "office ndcg@10", "office paper recall@10"]
    ours = {lab: [value("beauty", "tiger", obj, s, "recall@10") for s in (1, 2)]
            for obj, lab in (("ce", "CE"), ("pointwise", "APAO-pointwise"))}
    mean = {lab: sum(v) / 2 for lab, v in ours.items()}
    assert md[2][:3] == ["TIGER", "CE", "2"] and md[2][5] == "0.0608"
    assert md[3][:2] == ["TIGER", "APAO-pointwise"] and md[3][5] == f"0.0667 ({(0.0667 / 0.0608 - 1) * 100:+.2f}%)"
    assert md[3][3].endswith(f"({(mean['APAO-pointwise'] / mean['CE'] - 1) * 100:+.2f}%)") and len(md) == 4
    with (out / "cells.csv").open() as f:
        long = {(r["objective"], r["metric"]): r for r in csv.DictReader(f)}
    assert float(long[("APAO-pointwise", "recall@10")]["paper"]) == 0.0667
    assert float(long[("APAO-pointwise", "recall@10")]["paper_gain"]) == pytest.approx((0.0667 / 0.0608 - 1) * 100)
    assert long[("CE", "ndcg@10")]["paper"] == "" and long[("CE", "recall@10")]["paper_gain"] == ""
    assert r"\multicolumn{3}{c}{office}" in (out / "table.tex").read_text()

    (tmp_path / "bad.yaml").write_text("office:\n  tiger:\n    CE: {recall@10: high}\n")
    bad = subprocess.run([sys.executable, "-m", "genrec.report", f"runs=[{tmp_path / 'runs'}]",
                          f"out={tmp_path / 'out2'}", f"paper={tmp_path / 'bad.yaml'}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and f"paper={tmp_path / 'bad.yaml'}" in bad.stderr
    assert "office.tiger.CE.recall@10" in bad.stderr and not (tmp_path / "out2").exists()  # no report dir left


def test_seed_count_column_shows_a_range_when_cells_differ(tmp_path):
    """3 seeds report recall@10, one of them lacks ndcg@10: the row's seed count reads "2–3"."""
    for seed in (1, 2, 3):
        m = {"test/recall@10": 0.1 * seed, **({"test/ndcg@10": 0.05} if seed < 3 else {})}
        write_run(tmp_path / f"s{seed}", "beauty", "tiger", OBJECTIVES["ce"], seed, m)
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10", "ndcg@10"])
    md = [[x.strip() for x in ln.strip("|").split("|")] for ln in (tmp_path / "out" / "table.md").read_text().splitlines()]
    assert md[2][:3] == ["TIGER", "CE", "2–3"]
    assert [c["n"] for c in s["cells"]] == [3, 2]


def test_a_run_started_from_another_is_its_own_two_stage_row(tmp_path):
    """CE -> APAO-pairwise fine-tuning (init_from or stage1) is not averaged with one-stage APAO-pairwise;
    S-DPO, which always starts from a trained run, keeps its plain label."""
    sdpo = {"_target_": "genrec.objectives.sdpo.SDPO", "beta_dpo": 1.0, "bear": None}
    write_run(tmp_path / "one", "beauty", "tiger", OBJECTIVES["pairwise"], 1, {"test/recall@10": 0.1})
    write_run(tmp_path / "ft", "beauty", "tiger", OBJECTIVES["pairwise"], 1, {"test/recall@10": 0.3},
              extra={"init_from": "outputs/ce"})
    write_run(tmp_path / "st", "beauty", "tiger", OBJECTIVES["pairwise"], 2, {"test/recall@10": 0.5},
              extra={"stage1": "ce"})
    write_run(tmp_path / "sdpo", "beauty", "tiger", sdpo, 1, {"test/recall@10": 0.2}, extra={"init_from": "outputs/ce"})
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10"])
    cells = {c["objective"]: c for c in s["cells"]}
    assert set(cells) == {"APAO-pairwise", "APAO-pairwise (two-stage)", "S-DPO"}
    assert cells["APAO-pairwise"]["mean"] == 0.1 and cells["S-DPO"]["mean"] == 0.2
    assert {r.label for r in load_runs([tmp_path / "ft", tmp_path / "st"])} == {"APAO-pairwise (two-stage)"}


def test_seeds_run_on_other_hardware_share_a_cell(tmp_path):
    """The saved config repeats the hardware keys under trainer.lightning (the Trainer's node): runs that differ
    only there are seeds of one configuration."""
    for seed, devices in ((1, 1), (2, 2)):
        lightning = {"_target_": "lightning.pytorch.Trainer", "devices": devices, "accelerator": "cpu",
                     "strategy": "ddp" if devices > 1 else "auto", "max_epochs": 3}
        write_run(tmp_path / f"s{seed}", "beauty", "tiger", OBJECTIVES["ce"], seed, {"test/recall@10": 0.1 * seed},
                  extra={"trainer": {"monitor": "val/ndcg@10", "devices": devices, "lightning": lightning}})
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10"])
    assert [c["n"] for c in s["cells"]] == [2]


def test_runs_of_another_preset_are_their_own_row(tmp_path):
    """office_cpu CE (2 seeds) + APAO and one apao_release CE + APAO: the release runs are rows of their own,
    "CE [apao_release]" right after CE, with the paper's numbers; gains are within a recipe (APAO [apao_release]
    over CE [apao_release], which is a baseline itself); a report of one recipe only has no suffix."""
    office, release = {"tags": ["office_cpu"]}, {"tags": ["apao_release"]}
    for seed, r10 in ((1, 0.04), (2, 0.05)):
        write_run(tmp_path / "runs" / f"ce{seed}", "office", "tiger", OBJECTIVES["ce"], seed, {"test/recall@10": r10},
                  extra=office)
    write_run(tmp_path / "runs" / "apao", "office", "tiger", OBJECTIVES["pointwise"], 1, {"test/recall@10": 0.06},
              extra=office)
    write_run(tmp_path / "release" / "ce", "office", "tiger", OBJECTIVES["ce"], 1, {"test/recall@10": 0.0612},
              extra=release)
    write_run(tmp_path / "release" / "apao", "office", "tiger", OBJECTIVES["pointwise"], 1, {"test/recall@10": 0.07},
              extra=release)
    paper = {"office": {"tiger": {"CE": {"recall@10": 0.0608}, "APAO-pointwise": {"recall@10": 0.0667}}}}
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10"], paper=paper)
    cells = {c["objective"]: c for c in s["cells"]}
    assert [r["objective"] for r in s["rows"]] == ["CE", "CE [apao_release]", "APAO-pointwise",
                                                   "APAO-pointwise [apao_release]"]
    assert cells["CE"]["n"] == 2 and cells["CE [apao_release]"]["n"] == 1
    assert cells["CE"]["paper"] == cells["CE [apao_release]"]["paper"] == 0.0608
    assert cells["CE [apao_release]"]["paper_gain"] is None and cells["CE"]["gain"] is None
    assert cells["CE [apao_release]"]["gain"] is None  # a baseline: the recipes are not compared
    assert cells["APAO-pointwise"]["gain"] == pytest.approx((0.06 / 0.045 - 1) * 100)
    assert cells["APAO-pointwise [apao_release]"]["gain"] == pytest.approx((0.07 / 0.0612 - 1) * 100)
    for apao in ("APAO-pointwise", "APAO-pointwise [apao_release]"):
        assert cells[apao]["paper_gain"] == pytest.approx((0.0667 / 0.0608 - 1) * 100)
    s = rep.report([tmp_path / "release"], tmp_path / "one", ["recall@10"], paper=paper)
    assert [(c["objective"], c["mean"], c["paper"]) for c in s["cells"]] == [("CE", 0.0612, 0.0608),
                                                                             ("APAO-pointwise", 0.07, 0.0667)]


def write_eval(run: Path, beam: int, full: bool, metrics: dict, score: str = "full", temperature: float = 1.0,
               own: tuple[str, float] = ("full", 1.0)) -> None:
    """eval/<split>-beam<K>[-<score>-t<temperature>][-full].json as genrec.evaluate writes it (`own`: the run's
    scoring, which the file name leaves out)."""
    (run / "eval").mkdir(exist_ok=True)
    scoring = "" if (score, temperature) == own else f"-{score}-t{temperature:g}"
    name = f"test-beam{beam}{scoring}{'-full' if full else ''}.json"
    (run / "eval" / name).write_text(json.dumps({**metrics, "beam": beam, "full_rank": full, "eval_score": score,
                                                 "eval_temperature": temperature,
                                                 "checkpoint": str(run / "best.ckpt")}))


def test_full_rank_reevaluation_supplies_the_metrics_a_run_lacks(tmp_path):
    """PR@k from eval/test-beam20-full.json (the run's own beam and scoring) fills the cells metrics.json
    lacks; metrics.json wins where both have a key; other beams, scorings, checkpoints and beam-only evals do not
    count."""
    run = write_run(tmp_path / "apao", "office", "tiger", OBJECTIVES["pointwise"], 1,
                    {"test/recall@10": 0.06, "eval_score": "full"})
    write_eval(run, 20, True, {"test/pruning_rate@5": 0.2, "test/pruning_rate@10": 0.3, "test/recall@10": 0.9})
    write_eval(run, 10, True, {"test/pruning_rate@20": 0.5})  # another beam
    write_eval(run, 20, True, {"test/pruning_rate@20": 0.6}, score="masked")  # another scoring
    write_eval(run, 20, True, {"test/pruning_rate@20": 0.65}, temperature=2.0)  # another temperature
    write_eval(run, 20, False, {"test/ndcg@10": 0.7})  # not full ranking
    (run / "eval" / "test-beam20-full-last.json").write_text(json.dumps(  # another checkpoint of the run
        {"test/pruning_rate@20": 0.8, "beam": 20, "full_rank": True, "eval_score": "full", "checkpoint": "x/last.ckpt"}))
    ce = write_run(tmp_path / "ce", "office", "tiger", OBJECTIVES["ce"], 1,
                   {"test/recall@10": 0.05, "test/pruning_rate@5": 0.4})
    write_eval(ce, 20, True, {"test/pruning_rate@5": 0.1, "test/pruning_rate@10": 0.5})  # no eval_score in metrics
    metrics = ["recall@10", "ndcg@10", "pruning_rate@5", "pruning_rate@10", "pruning_rate@20"]
    s = rep.report([tmp_path], tmp_path / "out", metrics)
    mean = {(c["objective"], c["metric"]): c["mean"] for c in s["cells"]}
    assert mean == {("CE", "recall@10"): 0.05, ("CE", "ndcg@10"): None, ("CE", "pruning_rate@5"): 0.4,
                    ("CE", "pruning_rate@10"): 0.5, ("CE", "pruning_rate@20"): None,
                    ("APAO-pointwise", "recall@10"): 0.06, ("APAO-pointwise", "ndcg@10"): None,
                    ("APAO-pointwise", "pruning_rate@5"): 0.2, ("APAO-pointwise", "pruning_rate@10"): 0.3,
                    ("APAO-pointwise", "pruning_rate@20"): None}
    assert "pruning_rate_office_tiger.png" in s["files"]


def test_validation_reevaluations_fill_the_val_report_old_valid_files_too(tmp_path):
    """`genrec.report split=val` reads genrec.evaluate's validation re-evaluations (eval/val-beam20-full.json) as it
    reads the test ones, and those written before the split was named `val` (eval/valid-beam20-full.json, `valid/`
    keys); metrics.json's best-epoch validation metrics still win."""
    def val_eval(run, name, prefix, pr):
        (run / "eval").mkdir(exist_ok=True)
        (run / "eval" / name).write_text(json.dumps({f"{prefix}/pruning_rate@10": pr, f"{prefix}/recall@10": 0.9,
                                                     "beam": 20, "full_rank": True, "eval_score": "full",
                                                     "eval_temperature": 1.0, "checkpoint": str(run / "best.ckpt")}))
    ce = write_run(tmp_path / "ce", "office", "tiger", OBJECTIVES["ce"], 1, {"val/recall@10": 0.05})
    val_eval(ce, "val-beam20-full.json", "val", 0.25)
    apao = write_run(tmp_path / "apao", "office", "tiger", OBJECTIVES["pointwise"], 1, {"val/recall@10": 0.06})
    val_eval(apao, "valid-beam20-full.json", "valid", 0.15)
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10", "pruning_rate@10"], split="val")
    mean = {(c["objective"], c["metric"]): c["mean"] for c in s["cells"]}
    assert mean == {("CE", "recall@10"): 0.05, ("CE", "pruning_rate@10"): 0.25,
                    ("APAO-pointwise", "recall@10"): 0.06, ("APAO-pointwise", "pruning_rate@10"): 0.15}
    assert {c["metric"]: c["mean"] for c in rep.report([tmp_path], tmp_path / "t", ["pruning_rate@10"])["cells"]} \
        == {"pruning_rate@10": None}  # the test report: validation files are not test files


def test_a_metric_the_runs_never_logged_is_named_in_the_notes(tmp_path):
    """Finished runs evaluated at other ks (e.g. experiment=tiny's [1, 5]) give "—" cells: the notes say why."""
    m = fake_metrics("beauty", "tiger", "ce", 1)
    write_run(tmp_path / "a", "beauty", "tiger", OBJECTIVES["ce"], 1, {k: v for k, v in m.items() if "@20" not in k})
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10", "recall@20"])
    assert {c["metric"]: c["text"] for c in s["cells"]}["recall@20"] == "—"
    assert "beauty/tiger/CE: its 1 finished run(s) log no test/recall@20 (eval.ks [5, 10, 20])" in s["notes"]


def test_a_baseline_no_row_has_is_named_in_the_notes(tmp_path):
    """baseline=<an objective these runs lack>: no gain column can be computed; the notes say so instead of a
    table without gains."""
    for obj in ("ce", "pointwise"):
        write_run(tmp_path / obj, "beauty", "tiger", OBJECTIVES[obj], 1, fake_metrics("beauty", "tiger", obj, 1))
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10"], baseline="msl")
    assert "baseline=msl: no row of that objective (rows: APAO-pointwise, CE): no gains" in s["notes"]
    assert all(c["gain"] is None for c in s["cells"])
    assert not any("baseline=" in n for n in rep.report([tmp_path], tmp_path / "out2", ["recall@10"])["notes"])


def test_a_baseline_no_objective_has_is_refused_before_writing(tmp_path):
    """baseline=<typo> (no shipped objective's label, nor a variant of one): refused, naming the key and the
    labels, with nothing written; variants and recipe rows of a shipped label pass."""
    for obj in ("ce", "pointwise"):
        write_run(tmp_path / obj, "beauty", "tiger", OBJECTIVES[obj], 1, fake_metrics("beauty", "tiger", obj, 1))
    with pytest.raises(rep.UnknownBaseline, match=r"baseline=cee: no objective has that row label \(objectives: "
                       r"APAO-pairwise, APAO-pointwise, BEAR, CE, MSL.*rows here: APAO-pointwise, CE\)"):
        rep.report([tmp_path], tmp_path / "out", ["recall@10"], baseline="cee")
    assert not (tmp_path / "out").exists()
    for ok in ("BEAR (form=regularizer)", "CE [apao_release]", "s-dpo+bear"):
        assert f"baseline={ok}: no row" in " ".join(rep.report([tmp_path], tmp_path / "o", ["recall@10"], baseline=ok)["notes"])


def test_a_sweep_compares_configs_on_the_seeds_they_share(tmp_path):
    """A config run on 3 seeds against a grid point run on seed 1 alone: the report compares them on seed 1
    (a 3-seed mean against one seed would favour the noisier single run), then shows the chosen config with
    all its seeds."""
    val = {(0.3, 1): 0.046, (0.3, 2): 0.040, (0.3, 3): 0.040, (0.1, 1): 0.044}  # 0.3: mean 0.042, seed 1 0.046
    for (beta, seed), v in val.items():
        write_run(tmp_path / f"b{beta}-s{seed}", "beauty", "tiger", {**OBJECTIVES["pointwise"], "beta": beta}, seed,
                  {"test/recall@10": beta + seed / 100, "val/ndcg@10": v, "history": []})
    s = rep.report([tmp_path], tmp_path / "out", ["recall@10"])
    sel = next(x for x in s["selected"] if x["objective"] == "APAO-pointwise")
    assert sel["objective_params"]["objective.beta"] == 0.3 and len(sel["runs"]) == 3
    assert sel["score"] == pytest.approx(0.046)
    cell = next(c for c in s["cells"] if c["objective"] == "APAO-pointwise")
    assert cell["mean"] == pytest.approx(0.3 + 0.02) and cell["n"] == 3
    assert ("beauty/tiger/APAO-pointwise: best of 2 configs on val/ndcg@10 over seed 1, the seeds they share: "
            "objective.beta=0.3") in s["notes"]

    write_run(tmp_path / "b0.1-s2", "beauty", "tiger", {**OBJECTIVES["pointwise"], "beta": 0.1}, 2,
              {"test/recall@10": 0.12, "val/ndcg@10": 0.043, "history": []})  # seeds 1-2: 0.1 ahead (0.0435 > 0.043)
    s = rep.report([tmp_path], tmp_path / "out2", ["recall@10"])
    sel = next(x for x in s["selected"] if x["objective"] == "APAO-pointwise")
    assert sel["objective_params"]["objective.beta"] == 0.1 and len(sel["runs"]) == 2

    write_run(tmp_path / "b0.5-s4", "beauty", "tiger", {**OBJECTIVES["pointwise"], "beta": 0.5}, 4,
              {"test/recall@10": 0.5, "val/ndcg@10": 0.0425, "history": []})  # no seed in common: all seeds' means
    s = rep.report([tmp_path], tmp_path / "out3", ["recall@10"])
    sel = next(x for x in s["selected"] if x["objective"] == "APAO-pointwise")
    assert sel["objective_params"]["objective.beta"] == 0.1 and sel["score"] == pytest.approx(0.0435)
    assert "beauty/tiger/APAO-pointwise: best of 3 configs on val/ndcg@10: objective.beta=0.1" in s["notes"]
