"""Collect run dirs into the papers' table layout and plots.

    python -m genrec.report                                   # runs=[outputs,multirun]
    python -m genrec.report runs=[multirun/2026-01-01_10-00-00] metrics=[recall@5,ndcg@5] out=reports/tiny

Table: rows backbone × objective, columns dataset × metric; mean ± std (sample, over seeds),
gain (%) of the mean over the `baseline` row of the same backbone and dataset, the best mean per
column within each backbone in bold. Several configurations of one objective on one dataset and
backbone (a β × η sweep) are reduced to the one with the best mean validation score (each run's
`trainer.monitor`, or `select`), as the papers tune on validation; the sweep itself becomes a
sensitivity plot. A run dir without metrics.json is a `failed` cell if it has failed.json or was
last touched more than `stale_minutes` ago, else `running`. Writes table.md, table.tex, table.csv (wide, as shown),
cells.csv (long, numeric), summary.json and the PNGs for which data exists.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import hydra
from omegaconf import DictConfig, OmegaConf

from genrec import plots
from genrec.eval.metrics import lower_is_better

# Config keys that do not define the experiment (seeds are averaged, the rest is bookkeeping/hardware).
IGNORED = ("seed", "run_dir", "resume", "data_dir", "tags", "logger", "hydra", "init_from",
           "trainer.accelerator", "trainer.devices", "trainer.num_nodes", "trainer.strategy", "trainer.num_workers",
           "trainer.progress_bar", "trainer.eval_batch_size", "embedder.device", "eval.full_rank", "eval.chunk",
           "dataset.root", "dataset.reader.root", "tokenizer.path")
SKIP_DIRS = {".hydra", "checkpoints", "logs", "eval", "wandb", ".git", ".venv", "__pycache__", "data"}
OBJECTIVE_NAMES = {"SDPO": "S-DPO"}
BACKBONE_NAMES = {"tiger": "TIGER", "llama": "Llama"}
ORDER = ["CE", "MSL", "S-DPO", "S-DPO+BEAR", "BEAR", "APAO-pointwise", "APAO-pairwise", "APAO-pairwise_printed"]
# Non-default discrete settings that make an ablation its own row rather than a tuned variant.
ABLATIONS = {"APAO": {"weights": "paper", "negatives.kind": "uniform", "drop_prefix": None},
             "BEAR": {"form": "reweight", "widths": None}, "SDPO": {"negatives.kind": "uniform"}}
AXES = [("beta", "eta"), ("lam", "xi"), ("bear.lam", "bear.xi")]  # heatmap (rows, cols) when both vary


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
    return out


def objective_label(obj: dict) -> str:
    """"APAO-pairwise", "S-DPO+BEAR", "BEAR (form=regularizer)", ..."""
    name = str(obj.get("_target_", "?")).rsplit(".", 1)[-1]
    label = OBJECTIVE_NAMES.get(name, name)
    if name == "APAO":
        label += f"-{obj.get('loss', 'pairwise')}"
    bear = obj.get("bear")  # BEAR's term: {lam, ...} with lam 0 = off (older runs: S-DPO true, APAO null)
    if name in ("APAO", "SDPO") and (bear is True or isinstance(bear, dict) and bear.get("lam", 0.1) > 0):
        label += "+BEAR"
    flat = flatten(obj)
    changed = [f"{k}={flat[k]}" for k, d in ABLATIONS.get(name, {}).items() if k in flat and flat[k] != d]
    return label + (f" ({', '.join(changed)})" if changed else "")


@dataclass
class Run:
    path: Path
    cfg: dict
    metrics: dict | None
    status: str  # ok | failed | running
    backbone: str  # the hydra choice name when known
    error: str | None = None  # failed.json's message
    dataset: str = field(init=False)
    label: str = field(init=False)
    seed: int = field(init=False)
    flat: dict = field(init=False)  # the config minus IGNORED: runs with equal `flat` differ only by seed
    key: str = field(init=False)

    def __post_init__(self):
        self.dataset = str(self.cfg["dataset"].get("name", "?"))
        self.label = objective_label(self.cfg["objective"])
        self.seed = self.cfg.get("seed", 0)
        self.flat = {k: v for k, v in flatten(self.cfg).items()
                     if not any(k == i or k.startswith(i + ".") for i in IGNORED)}
        self.key = json.dumps(self.flat, sort_keys=True, default=str)

    @property
    def monitor(self) -> str:
        return self.cfg.get("trainer", {}).get("monitor", "val/ndcg@10")

    def evals(self, split: str) -> list[dict]:
        """Re-evaluations written by genrec.evaluate: eval/<split>-beam<K>[-full].json."""
        return [j for f in sorted((self.path / "eval").glob(f"{split}-beam*.json")) if (j := _read_json(f))]

    @cached_property
    def log_rows(self) -> list[dict]:
        """logs/metrics.csv (Lightning CSVLogger) as dicts of floats, empty cells dropped."""
        f = self.path / "logs" / "metrics.csv"
        if not f.exists():
            return []
        with f.open() as fh:
            return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(fh)]


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def find_run_dirs(root: Path) -> list[Path]:
    """Dirs holding config.yaml (or .hydra/config.yaml: a job that died before writing it), not descended into."""
    if (root / "config.yaml").exists() or (root / ".hydra" / "config.yaml").exists():
        return [root]
    if not root.is_dir():
        return []
    return [d for c in sorted(root.iterdir()) if c.is_dir() and c.name not in SKIP_DIRS for d in find_run_dirs(c)]


def _choice(path: Path, group: str) -> str | None:
    f = path / ".hydra" / "hydra.yaml"
    return OmegaConf.select(OmegaConf.load(f), f"hydra.runtime.choices.{group}") if f.exists() else None


def load_run(path: Path, stale_minutes: float = 30.0) -> Run | None:
    f = path / "config.yaml" if (path / "config.yaml").exists() else path / ".hydra" / "config.yaml"
    cfg = OmegaConf.load(f)
    for k in ("run_dir", "logger", "hydra"):  # .hydra/config.yaml: interpolations only a Hydra app resolves
        cfg.pop(k, None)
    try:
        cfg = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation this process cannot resolve: keep it as written
        cfg = OmegaConf.to_container(cfg, resolve=False)
    if not isinstance(cfg, dict) or not all(isinstance(cfg.get(k), dict) for k in ("dataset", "backbone", "objective")):
        return None  # some other config.yaml
    metrics, failed = _read_json(path / "metrics.json"), _read_json(path / "failed.json")
    if metrics is not None or failed is not None:  # train.py writes failed.json when a run raises
        status = "ok" if metrics is not None else "failed"
    else:
        files = [p for d in (path, path / "logs", path / "checkpoints") if d.is_dir() for p in d.iterdir()]
        newest = max((p.stat().st_mtime for p in files), default=0.0)
        status = "running" if time.time() - newest < stale_minutes * 60 else "failed"
    backbone = ((metrics or {}).get("backbone") or _choice(path, "backbone")
                or str(cfg["backbone"].get("_target_", "?")).rsplit(".", 1)[-1].lower())
    return Run(path, cfg, metrics, status, backbone, (failed or {}).get("error") if metrics is None else None)


def load_runs(paths: Sequence[str | Path], stale_minutes: float = 30.0) -> list[Run]:
    """The loader: run dirs under `paths` (a W&B loader would return the same Run records)."""
    dirs = dict.fromkeys(d.resolve() for p in paths for d in find_run_dirs(Path(p)))
    return [r for d in dirs if (r := load_run(d, stale_minutes)) is not None]


# ---- aggregation ---------------------------------------------------------------------------
@dataclass
class Variant:
    """One configuration of one objective on one dataset and backbone: its ok runs (one per seed,
    the newest) and the seeds that only have failed/running runs."""
    runs: list[Run]
    pending: list[Run]
    flat: dict

    def values(self, key: str) -> list[float]:
        return [r.metrics[key] for r in self.runs if isinstance(r.metrics.get(key), (int, float))]

    def mean(self, key: str) -> float:
        v = self.values(key)
        return statistics.fmean(v) if v else math.nan

    def score(self, select: str | None) -> float:
        """Mean validation score, higher is better (a loss is negated). A variant's runs share one
        config, so one monitor."""
        v = [r.metrics.get(select or r.monitor) for r in self.runs]
        v = [x for x in v if isinstance(x, (int, float))]
        if not v:
            return -math.inf
        return (-1 if lower_is_better(select or self.runs[0].monitor) else 1) * statistics.fmean(v)


def group(runs: list[Run]) -> dict[tuple[str, str, str], list[Variant]]:
    """(dataset, backbone, label) -> its variants."""
    by: dict[tuple, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by[(r.dataset, r.backbone, r.label)][r.key].append(r)
    out = {}
    for cell, variants in by.items():
        out[cell] = []
        for rs in variants.values():
            ok = {}
            for r in sorted((r for r in rs if r.status == "ok"), key=lambda r: (r.path / "metrics.json").stat().st_mtime):
                ok[r.seed] = r
            pending = [r for r in rs if r.status != "ok" and r.seed not in ok]
            out[cell].append(Variant(sorted(ok.values(), key=lambda r: _sortable(r.seed)), pending, rs[0].flat))
    return out


def varying(variants: list[Variant]) -> list[str]:
    """The config keys whose values differ between the variants."""
    keys = sorted({k for v in variants for k in v.flat})
    return [k for k in keys if len({json.dumps(v.flat.get(k), default=str) for v in variants}) > 1]


def choose(variants: list[Variant], select: str | None) -> Variant:
    return max(variants, key=lambda v: (bool(v.runs), v.score(select)))


def _sortable(x) -> tuple:
    return (0, x, "") if isinstance(x, (int, float)) and not isinstance(x, bool) else (1, 0, str(x))


def _order(label: str) -> tuple:
    base = label.split(" (")[0]
    return (ORDER.index(base) if base in ORDER else len(ORDER), label)


def table(chosen: dict[tuple, Variant], metrics: list[str], split: str, baseline: str) -> tuple[list, list, dict]:
    """rows [(backbone, label)], cols [(dataset, metric)], cells {(backbone, label, dataset, metric): dict}."""
    rows = sorted({(b, lab) for _, b, lab in chosen}, key=lambda r: (r[0], _order(r[1])))
    cols = [(d, m) for d in sorted({d for d, _, _ in chosen}) for m in metrics]
    cells = {}
    for b, lab in rows:
        for d, m in cols:
            v = chosen.get((d, b, lab))
            vals = v.values(f"{split}/{m}") if v else []
            c = {"backbone": b, "objective": lab, "dataset": d, "metric": m, "mean": None, "std": None, "n": len(vals),
                 "gain": None, "best": False, "seeds": [r.seed for r in v.runs if f"{split}/{m}" in r.metrics] if v else [],
                 "failed": [str(r.path) for r in v.pending if r.status == "failed"] if v else []}
            if vals:
                c.update(status="ok", mean=statistics.fmean(vals), std=statistics.stdev(vals) if len(vals) > 1 else None)
            elif v and not v.runs and v.pending:
                c["status"] = "running" if any(r.status == "running" for r in v.pending) else "failed"
            else:
                c["status"] = "missing"
            cells[(b, lab, d, m)] = c
    for (b, lab, d, m), c in cells.items():
        base = next((cells[(b, l2, d, m)] for bb, l2 in rows if bb == b and l2.lower() == baseline.lower()), None)
        if c["mean"] is not None and base and base["mean"] and lab.lower() != baseline.lower():
            c["gain"] = 100.0 * (c["mean"] / base["mean"] - 1.0)
        block = [cells[(b, l2, d, m)]["mean"] for bb, l2 in rows if bb == b]
        c["best"] = c["mean"] is not None and c["mean"] == max(x for x in block if x is not None)
    return rows, cols, cells


def cell_text(c: dict, latex: bool = False) -> str:
    if c["status"] != "ok":
        return {"missing": "—" if not latex else "--"}.get(c["status"], c["status"])
    mean = f"{c['mean']:.4f}"
    if c["best"]:
        mean = f"\\textbf{{{mean}}}" if latex else f"**{mean}**"
    pm = " $\\pm$ " if latex else " ± "
    s = mean + (f"{pm}{c['std']:.4f}" if c["std"] is not None else "")
    pct = "\\%" if latex else "%"
    return s + (f" ({c['gain']:+.2f}{pct})" if c["gain"] is not None else "")


def _tex(s: str) -> str:
    return re.sub(r"([_%&#])", r"\\\1", s)


def write_tables(out: Path, rows: list, cols: list, cells: dict) -> list[Path]:
    name = lambda b: BACKBONE_NAMES.get(b, b)  # noqa: E731
    head = ["Backbone", "Objective"] + [f"{d} {m}" for d, m in cols]
    body = [[name(b), lab] + [cell_text(cells[(b, lab, d, m)]) for d, m in cols] for b, lab in rows]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * len(cols)]
    md += ["| " + " | ".join(r) + " |" for r in body]
    (out / "table.md").write_text("\n".join(md) + "\n")

    with (out / "table.csv").open("w", newline="") as f:
        csv.writer(f).writerows([head] + [[x.replace("**", "") for x in r] for r in body])
    keys = ["backbone", "objective", "dataset", "metric", "mean", "std", "n", "gain", "best", "status"]
    with (out / "cells.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(cells[(b, lab, d, m)] for b, lab in rows for d, m in cols)

    datasets = list(dict.fromkeys(d for d, _ in cols))
    per = len(cols) // max(1, len(datasets))
    tex = [r"\begin{tabular}{ll" + "r" * len(cols) + "}", r"\toprule",
           " & & " + " & ".join(f"\\multicolumn{{{per}}}{{c}}{{{_tex(d)}}}" for d in datasets) + r" \\",
           "Backbone & Objective & " + " & ".join(_tex(m) for _, m in cols) + r" \\", r"\midrule"]
    for i, (b, lab) in enumerate(rows):
        if i and rows[i - 1][0] != b:
            tex.append(r"\midrule")
        tex.append(" & ".join([_tex(name(b)), _tex(lab)] + [cell_text(cells[(b, lab, d, m)], latex=True)
                                                            for d, m in cols]) + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}"]
    (out / "table.tex").write_text("\n".join(tex) + "\n")
    return [out / n for n in ("table.md", "table.tex", "table.csv", "cells.csv")]


# ---- plots -----------------------------------------------------------------------------------
def _mean_by_x(points: list[dict]) -> tuple[list, list]:
    """Mean over runs of {x: y} dicts, x sorted (a run missing an x does not count there)."""
    acc = defaultdict(list)
    for p in points:
        for x, y in p.items():
            acc[x].append(y)
    xs = sorted(acc)
    return xs, [statistics.fmean(acc[x]) for x in xs]


def _numbered(d: dict, prefix: str) -> dict[int, float]:
    """{n: v} for keys `<prefix><n>`."""
    return {int(k[len(prefix):]): v for k, v in d.items() if k.startswith(prefix) and k[len(prefix):].isdigit()}


def _png(out: Path, *parts) -> Path:
    return out / (re.sub(r"[^A-Za-z0-9.+=-]+", "_", "_".join(map(str, parts))) + ".png")


def diagnostic_plots(out: Path, d: str, b: str, here: dict[str, Variant], metrics: list[str], split: str) -> list[Path]:
    """Per dataset and backbone, one line per objective (its selected config, mean over seeds): prefix recall,
    pruning rate, metrics vs beam width, training curves; per APAO objective its weights over training."""
    files, title = [], f"{d} · {BACKBONE_NAMES.get(b, b)}"
    labels = sorted(here, key=_order)

    def per_label(points: Callable[[Run], dict]) -> dict[str, tuple[list, list]]:
        s = {lab: _mean_by_x([points(r) for r in here[lab].runs]) for lab in labels}
        return {k: v for k, v in s.items() if v[0]}

    if pr := per_label(lambda r: _numbered(r.metrics, f"{split}/prefix_recall@")):
        files.append(plots.lines(_png(out, "prefix_recall", d, b), [("prefix recall", pr)], "step m", title))

    def pruning(r: Run) -> dict:
        full = [e for e in r.evals(split) if e.get("full_rank") and e.get("beam") == r.cfg["eval"].get("beam")]
        return _numbered(r.metrics, f"{split}/pruning_rate@") or (_numbered(full[0], f"{split}/pruning_rate@")
                                                                   if full else {})
    if pru := per_label(pruning):
        files.append(plots.lines(_png(out, "pruning_rate", d, b), [("pruning rate PR@k", pru)], "k", title))

    def by_beam(r: Run, key: str) -> dict:
        pts = {e["beam"]: e[key] for e in r.evals(split) if key in e and "beam" in e}
        return {**pts, r.cfg["eval"].get("beam"): r.metrics[key]} if key in r.metrics else pts
    panels = [(m, per_label(lambda r, k=f"{split}/{m}": by_beam(r, k))) for m in metrics]
    if panels := [(m, s) for m, s in panels if any(len(xs) > 1 for xs, _ in s.values())]:
        files.append(plots.lines(_png(out, "beam_width", d, b), panels, "beam width", title))

    def train_loss(r: Run) -> dict:
        acc = defaultdict(list)
        for row in r.log_rows:
            if "train/loss" in row and "epoch" in row:
                acc[int(row["epoch"])].append(row["train/loss"])
        return {e: statistics.fmean(v) for e, v in acc.items()}
    monitor = here[labels[0]].runs[0].monitor.split("/", 1)[-1] if labels else "ndcg@10"
    curves = [("train loss", per_label(train_loss))] + [
        (f"val {key}", per_label(lambda r, k=key: {h["epoch"]: h[k] for h in r.metrics.get("history", []) if k in h}))
        for key in ("loss", monitor)]
    if curves := [c for c in curves if c[1]]:
        files.append(plots.lines(_png(out, "training_curves", d, b), curves, "epoch", title))

    for lab in labels:
        panels = []
        for name, prefix in (("APAO weight w_m", "train/apao/w"), ("prefix loss L_m", "train/apao/L")):
            per_m = defaultdict(list)  # m -> one {step: value} per run
            for r in here[lab].runs:
                steps = defaultdict(dict)
                for row in r.log_rows:
                    for m, v in _numbered(row, prefix).items():
                        steps[m][row["step"]] = v
                for m, pts in steps.items():
                    per_m[m].append(pts)
            if per_m:
                panels.append((name, {f"m={m}": _mean_by_x(per_m[m]) for m in sorted(per_m)}))
        if panels:
            files.append(plots.lines(_png(out, "apao_weights", d, b, lab), panels, "step", f"{title} · {lab}"))
    return files


def sensitivity_plots(out: Path, groups: dict, metrics: list[str], split: str) -> tuple[list[Path], list[str]]:
    """Configs of one objective that differ in one objective parameter: a line plot; in two: a heatmap
    (β × η for APAO, λ × ξ for BEAR); value = the mean over seeds on `split`."""
    files, notes = [], []
    for (d, b, lab), variants in sorted(groups.items()):
        variants = [v for v in variants if v.runs]
        if len(variants) < 2:
            continue
        vary = varying(variants)
        if not vary or len(vary) > 2 or not all(k.startswith("objective.") for k in vary):
            notes.append(f"no sensitivity plot for {d}/{b}/{lab}: the runs differ in {', '.join(vary)}")
            continue
        params = [k[len("objective."):] for k in vary]
        title = f"{d} · {BACKBONE_NAMES.get(b, b)} · {lab} ({split})"
        shown = [m for m in metrics if any(v.values(f"{split}/{m}") for v in variants)]
        if len(params) == 1:
            p = params[0]
            vs = sorted(variants, key=lambda v: _sortable(v.flat[f"objective.{p}"]))
            xs = [v.flat[f"objective.{p}"] for v in vs]
            panels = [(m, {lab: (xs, [v.mean(f"{split}/{m}") for v in vs])}) for m in shown]
            if panels:
                files.append(plots.lines(_png(out, "sensitivity", d, b, lab, p), panels, p, title, categorical=True))
            continue
        rp, cp = next(((r, c) for r, c in AXES if {r, c} == set(params)), params)
        rv = sorted({v.flat[f"objective.{rp}"] for v in variants}, key=_sortable)
        cv = sorted({v.flat[f"objective.{cp}"] for v in variants}, key=_sortable)
        at = {(v.flat[f"objective.{rp}"], v.flat[f"objective.{cp}"]): v for v in variants}
        panels = [(m, [[at[(x, y)].mean(f"{split}/{m}") if (x, y) in at else math.nan for y in cv] for x in rv])
                  for m in shown]
        if panels:
            files.append(plots.heatmaps(_png(out, "heatmap", d, b, lab, f"{rp}x{cp}"), panels, rv, cv, rp, cp, title))
    return files, notes


# ---- entry points ------------------------------------------------------------------------------
def report(runs: Sequence[str | Path], out: str | Path, metrics: Sequence[str] = ("recall@10", "ndcg@10", "recall@20",
           "ndcg@20"), baseline: str = "ce", split: str = "test", select: str | None = None,
           stale_minutes: float = 30.0, loader: Callable[..., list[Run]] = load_runs) -> dict:
    """Write the tables, plots and summary.json for the runs `loader(runs)` finds; return the summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = list(metrics)
    found = loader(runs, stale_minutes)
    groups = group(found)
    chosen = {k: choose(v, select) for k, v in groups.items()}
    rows, cols, cells = table(chosen, metrics, split, baseline)
    files = write_tables(out, rows, cols, cells)
    pngs = [p for d, b in sorted({(d, b) for d, b, _ in chosen})
            for p in diagnostic_plots(out, d, b, {lab: v for (dd, bb, lab), v in chosen.items()
                                                  if (dd, bb) == (d, b) and v.runs}, metrics, split)]
    more, notes = sensitivity_plots(out, groups, metrics, split)
    pngs += more
    for (d, b, lab), v in sorted(chosen.items()):
        notes += [f"{r.status}: {d}/{b}/{lab} seed {r.seed}: {r.path}" + (f" ({r.error})" if r.error else "")
                  for r in v.pending]
        tried = [x for x in groups[(d, b, lab)] if x.runs]
        if len(tried) > 1 and v.runs:
            picked = ", ".join(f"{k}={v.flat.get(k)}" for k in varying(tried))
            notes.append(f"{d}/{b}/{lab}: best of {len(tried)} configs on {select or v.runs[0].monitor}: {picked}")
    summary = {
        "split": split, "metrics": metrics, "baseline": baseline,
        "runs": {s: sum(r.status == s for r in found) for s in ("ok", "failed", "running")},
        "rows": [{"backbone": b, "objective": lab} for b, lab in rows],
        "columns": [{"dataset": d, "metric": m} for d, m in cols],
        "cells": [{**c, "text": cell_text(c)} for c in cells.values()],
        "selected": [{"dataset": d, "backbone": b, "objective": lab, "score": v.score(select) if v.runs else None,
                      "objective_params": {k: v.flat[k] for k in v.flat if k.startswith("objective.")},
                      "runs": [str(r.path) for r in v.runs], "variants": len(groups[(d, b, lab)])}
                     for (d, b, lab), v in sorted(chosen.items())],
        "notes": notes,
        "files": [p.name for p in files + pngs] + ["summary.json"],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


@hydra.main(version_base="1.3", config_path="../conf", config_name="report")
def main(cfg: DictConfig) -> None:
    runs = [cfg.runs] if isinstance(cfg.runs, str) else list(cfg.runs)
    s = report(runs, cfg.out, list(cfg.metrics), cfg.baseline, cfg.split, cfg.select, cfg.stale_minutes)
    if not sum(s["runs"].values()):
        print(f"error: no run dirs (config.yaml) under {', '.join(map(str, runs))}", file=sys.stderr)
        sys.exit(2)
    print((Path(cfg.out) / "table.md").read_text())
    print("\n".join(s["notes"] + [f"runs: {s['runs']}", f"wrote {cfg.out}/: " + ", ".join(s["files"])]))
    if cfg.wandb:
        from genrec.loggers import log_report

        group = Path(runs[0]).name if len(runs) == 1 else None  # one sweep: the report joins its runs' group
        print(f"W&B run: {log_report(Path(cfg.out), s, cfg.wandb_project, group)} (offline: `wandb sync` it)")


if __name__ == "__main__":
    main()
