"""The results page (`page=`): fake run dirs with known metrics, costs and overrides -> the page's sections."""

import csv
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from genrec import report as rep
from genrec.report.page import rebuild_command
from test_report import OBJECTIVES, ROOT, write_eval, write_run

OFFICE, RELEASE = {"tags": ["office_cpu"]}, {"tags": ["apao_release"]}
R10 = {("ce", 42): 0.050, ("ce", 43): 0.054, ("pointwise", 42): 0.058, ("release", 42): 0.061}
PR = {("ce", 42): (0.30, 0.20), ("ce", 43): (0.34, 0.22), ("pointwise", 42): (0.27, 0.15)}  # PR@5, PR@10
POINTWISE = {**OBJECTIVES["pointwise"], "weights": "released"}  # as office_cpu runs APAO: its plain row
PREFIX = {1: lambda r10: 0.3 + r10, 2: lambda r10: 0.1 + r10 / 2}  # prefix recall at step m from a run's R@10
COST = {("ce", 42): (600.0, 400.0, 10), ("ce", 43): (660.0, 450.0, 9), ("pointwise", 42): (1500.0, 1200.0, 10),
        ("release", 42): (4000.0, None, 30)}  # seconds, train_seconds, epochs


def pages(root: Path) -> Path:
    """CE seeds 42/43 (office_cpu, PR@k in metrics.json, overrides.yaml), APAO-pointwise seed 42 (PR@k only in its
    full-rank re-evaluation, .hydra/overrides.yaml) and a failed seed 43, one apao_release CE (no overrides)."""
    runs = root / "runs"
    for (obj, seed), r10 in R10.items():
        wall, train, epochs = COST[(obj, seed)]
        m = {"test/recall@10": r10, "test/ndcg@10": r10 / 2, **{f"test/prefix_recall@{s}": f(r10) for s, f in PREFIX.items()},
             "seconds": wall, "train_seconds": train, "epochs": epochs, "best_epoch": epochs - 2, "processes": 1,
             "peak_rss_gb": 2.5 + seed / 100, "eval_score": "full"}
        if obj == "ce":
            m.update({"test/pruning_rate@5": PR[(obj, seed)][0], "test/pruning_rate@10": PR[(obj, seed)][1]})
        objective = POINTWISE if obj == "pointwise" else OBJECTIVES["ce" if obj == "release" else obj]
        d = write_run(runs / f"{obj}-{seed}", "office", "tiger", objective, seed, m,
                      extra=RELEASE if obj == "release" else OFFICE)
        overrides = ["experiment=office_cpu", f"objective={'apao' if obj == 'pointwise' else 'ce'}", f"seed={seed}"]
        if obj == "ce":
            (d / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        if obj == "pointwise":
            (d / ".hydra").mkdir()
            (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides + ["objective.loss=pointwise"]))
            write_eval(d, 20, True, {"test/pruning_rate@5": PR[(obj, seed)][0], "test/pruning_rate@10": PR[(obj, seed)][1]})
    failed = write_run(runs / "pointwise-43", "office", "tiger", POINTWISE, 43, None, extra=OFFICE)
    (failed / "failed.json").write_text(json.dumps({"error": "NonFiniteLoss: non-finite loss at epoch 0"}))
    (failed / ".hydra").mkdir()  # as Hydra writes it when the job starts
    (failed / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(
        ["experiment=office_cpu", "objective=apao", "seed=43", "objective.loss=pointwise"]))
    return runs


def section(page: str, title: str) -> str:
    return page.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def table(text: str) -> list[dict]:
    """The first markdown table in `text` as dicts."""
    lines = text[text.index("\n|") + 1:].split("\n\n")[0].splitlines()
    rows = [[x.strip() for x in ln.strip("|").split("|")] for ln in lines]
    return [dict(zip(rows[0], r)) for r in rows[2:]]


PAPER = {"office": {"tiger": {"CE": {"recall@10": 0.0608}, "APAO-pointwise": {"recall@10": 0.0667}}}}


def test_results_page_sections(tmp_path):
    runs = pages(tmp_path)
    (tmp_path / "intro.md").write_text("Office, **reproduced**.\n\n- checked: the eval.score mode\n")
    out, page = tmp_path / "docs" / "office", tmp_path / "docs" / "office.md"
    s = rep.report([runs], out, ["recall@10", "ndcg@10"], paper=PAPER, page=page, page_intro=tmp_path / "intro.md",
                   rebuild="python -m genrec.report runs=[docs/results/runs]")
    text = page.read_text()
    assert s["page"] == str(page) and text.startswith("# Results: office\n\nOffice, **reproduced**.\n\n- checked: the")

    # (a) the table: table.md itself, its values those of cells.csv, the release recipe its own row
    main = section(text, "Table")
    assert (out / "table.md").read_text() in main
    with (out / "cells.csv").open() as f:
        long = {(r["objective"], r["metric"]): r for r in csv.DictReader(f)}
    rows = table(main)
    assert [r["Objective"] for r in rows] == ["CE", "CE [apao_release]", "APAO-pointwise"]
    for r in rows:
        for m in ("recall@10", "ndcg@10"):
            c = long[(r["Objective"], m)]
            assert r[f"office {m}"].replace("**", "").startswith(f"{float(c['mean']):.4f}"), (r, m)
        assert r["office paper recall@10"].startswith({"APAO-pointwise": "0.0667"}.get(r["Objective"], "0.0608"))
    assert [r["Seeds"] for r in rows] == ["2", "1", "1"]

    # (b) pruning rate: mean over seeds, change vs CE; no full-rank evaluation: —
    pr = {r["Objective"]: r for r in table(section(text, "Pruning rate"))}
    for i, k in enumerate((5, 10)):
        ce = statistics.fmean([PR[("ce", 42)][i], PR[("ce", 43)][i]])
        ce_std = statistics.stdev([PR[("ce", 42)][i], PR[("ce", 43)][i]])
        apao = PR[("pointwise", 42)][i]
        assert pr["CE"][f"office pruning_rate@{k}"] == f"{ce:.4f} ± {ce_std:.4f}"
        assert pr["APAO-pointwise"][f"office pruning_rate@{k}"] == f"**{apao:.4f}** ({(apao / ce - 1) * 100:+.2f}%)"
        assert pr["CE [apao_release]"][f"office pruning_rate@{k}"] == "—"

    # (b') prefix recall per beam step: mean over seeds at each step, in brackets the change vs CE at that step
    prefix = {r["Objective"]: r for r in table(section(text, "Prefix recall per beam step"))}
    for step, f in PREFIX.items():
        ce = [f(R10[("ce", 42)]), f(R10[("ce", 43)])]
        apao, col = f(R10[("pointwise", 42)]), f"office prefix_recall@{step}"
        assert prefix["CE"][col] == f"{statistics.fmean(ce):.4f} ± {statistics.stdev(ce):.4f}"
        assert prefix["APAO-pointwise"][col] == f"{apao:.4f} ({(apao / statistics.fmean(ce) - 1) * 100:+.2f}%)"
        assert prefix["CE [apao_release]"][col] == f"**{f(R10[('release', 42)]):.4f}**"

    # (c) figures: links relative to the page's folder, to the PNGs the report drew
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", section(text, "Figures"))
    assert links == ["office/prefix_recall_office_tiger.png", "office/pruning_rate_office_tiger.png"]
    assert all((page.parent / x).is_file() and Path(x).name in s["files"] for x in links)

    # (d) cost: one line per run, and per row training seconds per epoch relative to CE (mean over seeds)
    cost = section(text, "Cost")
    per_run = table(cost)
    assert [(r["Objective"], r["Seed"]) for r in per_run] == [("CE", "42"), ("CE", "43"), ("CE [apao_release]", "42"),
                                                              ("APAO-pointwise", "42")]
    for r in per_run:
        wall, train, epochs = COST[({"CE": "ce", "CE [apao_release]": "release"}.get(r["Objective"], "pointwise"),
                                    int(r["Seed"]))]
        assert r["Wall (min)"] == f"{wall / 60:.1f}" and r["Epochs"] == str(epochs)
        assert r["Best epoch"] == str(epochs - 2) and r["Processes"] == "1"
        assert r["Train s/epoch"] == ("—" if train is None else f"{train / epochs:.1f}")
        assert r["Peak RSS (GB)"] == f"{2.5 + int(r['Seed']) / 100:.2f}"
    per_row = {r["Objective"]: r for r in table(cost.split("Per row:", 1)[1])}
    ce = statistics.fmean([400.0 / 10, 450.0 / 9])
    assert per_row["CE"]["Train s/epoch (mean)"] == f"{ce:.1f}" and per_row["CE"]["vs CE"] == "×1.00"
    assert per_row["APAO-pointwise"]["vs CE"] == f"×{1200.0 / 10 / ce:.2f}"
    assert per_row["CE [apao_release]"]["vs CE"] == "—"  # no train_seconds, and its own recipe's CE

    # (e) rerun: each run's overrides, the failed one too; the rebuild command
    rerun = section(text, "Rerun")
    assert "# office · TIGER · CE · seed 43\npython -m genrec.train experiment=office_cpu objective=ce seed=43\n" in rerun
    assert ("# office · TIGER · APAO-pointwise · seed 42\npython -m genrec.train experiment=office_cpu objective=apao "
            "seed=42 objective.loss=pointwise\n") in rerun
    assert ("# office · TIGER · APAO-pointwise · seed 43 (failed)\npython -m genrec.train experiment=office_cpu "
            "objective=apao seed=43 objective.loss=pointwise\n") in rerun
    assert "# office · TIGER · CE [apao_release] · seed 42\n# no overrides.yaml: its full config is release-42/" in rerun
    assert "```bash\npython -m genrec.report runs=[docs/results/runs]\n```" in rerun

    # (f) notes
    assert f"- failed: office/tiger/APAO-pointwise seed 43: {(runs / 'pointwise-43').resolve()} (NonFiniteLoss" \
        in section(text, "Notes")


def test_no_page_unless_asked_and_a_missing_intro_is_refused_first(tmp_path):
    runs = pages(tmp_path)
    s = rep.report([runs], tmp_path / "out", ["recall@10"])
    assert "page" not in s and [p.name for p in tmp_path.glob("**/*.md")] == ["table.md"]
    with pytest.raises(FileNotFoundError, match=r"page_intro=.*nothing\.md: no such file"):
        rep.report([runs], tmp_path / "out2", ["recall@10"], page=tmp_path / "p.md", page_intro=tmp_path / "nothing.md")
    assert not (tmp_path / "out2").exists() and not (tmp_path / "p.md").exists()


def test_page_cli_writes_it_and_its_rebuild_command_rebuilds_it(tmp_path):
    runs = pages(tmp_path)
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(PAPER))
    args = [f"runs=[{runs}]", f"out={tmp_path / 'out'}", "metrics=[recall@10]", f"paper={tmp_path / 'paper.yaml'}",
            f"page={tmp_path / 'x.md'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "genrec.report", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "x.md").read_text()
    assert f"wrote the page {tmp_path / 'x.md'}" in proc.stdout
    assert rebuild_command({"runs": [str(runs)], "out": str(tmp_path / "out"), "metrics": ["recall@10"],
                            "baseline": "ce", "split": "test", "select": None, "paper": str(tmp_path / "paper.yaml"),
                            "page": str(tmp_path / "x.md"), "page_intro": None}) in text
    command = section(text, "Rerun").split("The page, from the committed runs:")[1].split("```bash\n")[1].split("\n")[0]
    (tmp_path / "x.md").unlink()
    proc = subprocess.run(shlex.split(command.replace("python", sys.executable, 1)), cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "x.md").read_text() == text


BEAR = {"_target_": "genrec.objectives.bear.BEAR", "form": "reweight", "lam": 0.25, "xi": 2.75, "beam": 20,
        "widths": None, "masked": False, "temperature": 1.0}


def test_scoring_section_sets_each_row_beside_itself_under_every_scoring_it_was_re_evaluated_with(tmp_path):
    """A row's own scoring (its full-rank re-evaluation, else metrics.json) and each other scoring of its full-rank
    re-evaluations at its own beam, mean over the seeds evaluated more than one way; rows evaluated one way only
    are left out."""
    runs = tmp_path / "runs"
    ce42 = write_run(runs / "ce-42", "office", "tiger", OBJECTIVES["ce"], 42,
                     {"test/recall@10": 0.050, "test/ndcg@10": 0.025, "eval_score": "full", "eval_temperature": 1.0})
    write_eval(ce42, 20, True, {"test/recall@10": 0.049, "test/ndcg@10": 0.024, "test/pruning_rate@5": 0.30,
                                "test/pruning_rate@10": 0.20})  # its own scoring, one process: wins over metrics.json
    write_eval(ce42, 20, True, {"test/recall@10": 0.052, "test/ndcg@10": 0.026, "test/pruning_rate@5": 0.20,
                                "test/pruning_rate@10": 0.10}, score="masked")
    write_eval(ce42, 10, True, {"test/recall@10": 0.9}, score="masked", temperature=2.0)  # another beam
    write_eval(ce42, 20, False, {"test/recall@10": 0.8}, score="masked", temperature=2.0)  # no full ranking
    ce43 = write_run(runs / "ce-43", "office", "tiger", OBJECTIVES["ce"], 43,  # own scoring: metrics.json only
                     {"test/recall@10": 0.054, "test/ndcg@10": 0.027, "test/pruning_rate@5": 0.34,
                      "test/pruning_rate@10": 0.22, "eval_score": "full", "eval_temperature": 1.0})
    write_eval(ce43, 20, True, {"test/recall@10": 0.056, "test/ndcg@10": 0.028, "test/pruning_rate@5": 0.24,
                                "test/pruning_rate@10": 0.12}, score="masked")
    write_run(runs / "ce-44", "office", "tiger", OBJECTIVES["ce"], 44,  # its own scoring only: not in CE's means
              {"test/recall@10": 0.070, "test/ndcg@10": 0.035, "eval_score": "full", "eval_temperature": 1.0})
    bear = write_run(runs / "bear-42", "office", "tiger", BEAR, 42,
                     {"test/recall@10": 0.060, "test/ndcg@10": 0.030, "eval_score": "masked", "eval_temperature": 1.0},
                     extra={"eval": {"beam": 20, "ks": [5, 10, 20], "score": "masked", "temperature": 1.0}})
    write_eval(bear, 20, True, {"test/recall@10": 0.061, "test/ndcg@10": 0.031, "test/pruning_rate@5": 0.10,
                                "test/pruning_rate@10": 0.05}, score="masked", own=("masked", 1.0))
    write_eval(bear, 20, True, {"test/recall@10": 0.058, "test/ndcg@10": 0.029, "test/pruning_rate@5": 0.15,
                                "test/pruning_rate@10": 0.08}, own=("masked", 1.0))
    apao = write_run(runs / "apao-42", "office", "tiger", OBJECTIVES["pointwise"], 42,  # one scoring: not shown
                     {"test/recall@10": 0.057, "eval_score": "full"})
    write_eval(apao, 20, True, {"test/pruning_rate@5": 0.2})
    (tmp_path / "intro.md").write_text("x\n")
    page = tmp_path / "office.md"
    rep.report([runs], tmp_path / "out", ["recall@10", "ndcg@10"], page=page, page_intro=tmp_path / "intro.md")
    rows = table(section(page.read_text(), "Scoring"))

    def mean(*x):
        return f"{statistics.fmean(x):.4f}"
    assert [(r["Objective"], r["Scoring"], r["Seeds"]) for r in rows] == [
        ("CE", "full, τ 1 (own)", "42,43"), ("CE", "masked, τ 1", "42,43"),
        ("BEAR", "masked, τ 1 (own)", "42"), ("BEAR", "full, τ 1", "42")]
    assert [r["recall@10"] for r in rows] == [mean(0.049, 0.054), mean(0.052, 0.056), mean(0.061), mean(0.058)]
    assert [r["ndcg@10"] for r in rows] == [mean(0.024, 0.027), mean(0.026, 0.028), mean(0.031), mean(0.029)]
    assert [r["pruning_rate@5"] for r in rows] == [mean(0.30, 0.34), mean(0.20, 0.24), mean(0.10), mean(0.15)]
    assert [r["pruning_rate@10"] for r in rows] == [mean(0.20, 0.22), mean(0.10, 0.12), mean(0.05), mean(0.08)]


def test_scoring_section_says_how_to_fill_it_when_no_run_was_re_evaluated_under_another_scoring(tmp_path):
    runs = pages(tmp_path)
    (tmp_path / "intro.md").write_text("x\n")
    rep.report([runs], tmp_path / "out", ["recall@10"], page=tmp_path / "p.md", page_intro=tmp_path / "intro.md")
    text = section((tmp_path / "p.md").read_text(), "Scoring")
    assert "No run has a full-rank re-evaluation under another scoring yet" in text
    assert "python -m genrec.evaluate ckpt=<run dir> eval.score=masked eval.temperature=1 eval.full_rank=true" in text


def test_grid_section_lists_each_configuration_on_the_seeds_they_share(tmp_path):
    """A setting run on seeds 42-44 and a grid point on 42 alone: each line's validation score and test numbers
    are its seed-42 numbers (what selection compared), the shown one ticked; one configuration: a plain line."""
    val = {(0.3, 42): 0.046, (0.3, 43): 0.040, (0.3, 44): 0.040, (0.1, 42): 0.044}
    for (beta, seed), v in val.items():
        write_run(tmp_path / "runs" / f"b{beta}-s{seed}", "office", "tiger", {**POINTWISE, "beta": beta}, seed,
                  {"test/recall@10": beta / 5 + seed / 1000, "test/ndcg@10": beta / 10, "val/ndcg@10": v,
                   "history": []}, extra={**OFFICE, "protocol": {"prefix_weights": "released"}})
    write_run(tmp_path / "runs" / "ce", "office", "tiger", OBJECTIVES["ce"], 42,
              {"test/recall@10": 0.05, "test/ndcg@10": 0.02, "val/ndcg@10": 0.04, "history": []}, extra=OFFICE)
    (tmp_path / "intro.md").write_text("grid\n")
    page = tmp_path / "office.md"
    rep.report([tmp_path / "runs"], tmp_path / "out", ["recall@10", "ndcg@10"], page=page, page_intro=tmp_path / "intro.md")
    rows = table(section(page.read_text(), "Grid on validation"))
    assert [(r["Objective"], r["Setting"], r["Seeds run"], r["Compared on"], r["Shown"]) for r in rows] == [
        ("APAO-pointwise", "beta=0.1", "42", "42", ""), ("APAO-pointwise", "beta=0.3", "42,43,44", "42", "✓")]
    for r, beta in zip(rows, (0.1, 0.3)):
        assert r["val/ndcg@10 (selects)"] == f"{val[(beta, 42)]:.4f}"
        assert r["test recall@10"] == f"{beta / 5 + 0.042:.4f}" and r["test ndcg@10"] == f"{beta / 10:.4f}"
    assert table(section(page.read_text(), "Table"))[1]["Seeds"] == "3"  # the shown setting keeps all its seeds

    for p in (tmp_path / "runs").glob("b0.1-*"):
        shutil.rmtree(p)
    rep.report([tmp_path / "runs"], tmp_path / "out", ["recall@10"], page=page, page_intro=tmp_path / "intro.md")
    assert section(page.read_text(), "Grid on validation").strip().endswith("Every row ran one configuration.")
