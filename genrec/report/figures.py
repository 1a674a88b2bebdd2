"""Which figures the report draws from which runs (`plots` draws them): per dataset and backbone the
diagnostics of each objective's selected configuration; per swept objective its sensitivity."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Callable

import pandas as pd

from genrec.report import plots
from genrec.report.load import BACKBONE_NAMES, Run, axes
from genrec.report.select import Cell, Variant, sortable, varying


def _mean_by_x(points: list[dict]) -> tuple[list, list]:
    """Mean over runs of {x: y} dicts, x sorted (a run missing an x does not count there)."""
    s = pd.DataFrame(points).mean().sort_index() if any(points) else pd.Series(dtype=float)
    return list(s.index), [float(y) for y in s]


def _numbered(d: dict, prefix: str) -> dict[int, float]:
    """{n: v} for keys `<prefix><n>`."""
    return {int(k[len(prefix):]): v for k, v in d.items() if k.startswith(prefix) and k[len(prefix):].isdigit()}


def _png(out: Path, *parts) -> Path:
    return out / (re.sub(r"[^A-Za-z0-9.+=-]+", "_", "_".join(map(str, parts))) + ".png")


def _series(log: pd.DataFrame, x: str, y: str) -> dict:
    """{x: mean y} over the log rows holding both."""
    if x not in log or y not in log:
        return {}
    return log.dropna(subset=[x, y]).groupby(x)[y].mean().to_dict()


def diagnostic_plots(out: Path, d: str, b: str, here: dict[str, Variant], order: dict[str, float],
                     metrics: list[str], split: str) -> list[Path]:
    """One line per objective (its selected config, mean over seeds): prefix recall, pruning rate, metrics vs
    beam width, training curves; per objective logging APAO's weights, those over training."""
    files, title = [], f"{d} · {BACKBONE_NAMES.get(b, b)}"
    labels = sorted(here, key=lambda lab: (order.get(lab, math.inf), lab))

    def per_label(points: Callable[[Run], dict]) -> dict[str, tuple[list, list]]:
        s = {lab: _mean_by_x([points(r) for r in here[lab].runs]) for lab in labels}
        return {k: v for k, v in s.items() if v[0]}

    if pr := per_label(lambda r: _numbered(r.values, f"{split}/prefix_recall@")):
        files.append(plots.lines(_png(out, "prefix_recall", d, b), [("prefix recall", pr)], "step m", title))
    if pru := per_label(lambda r: _numbered(r.values, f"{split}/pruning_rate@")):
        files.append(plots.lines(_png(out, "pruning_rate", d, b), [("pruning rate PR@k", pru)], "k", title))

    def by_beam(r: Run, key: str) -> dict:
        pts = {e["beam"]: e[key] for e in r.evals(split) if key in e and "beam" in e}
        return {**pts, r.cfg["eval"].get("beam"): r.metrics[key]} if key in r.metrics else pts
    panels = [(m, per_label(lambda r, k=f"{split}/{m}": by_beam(r, k))) for m in metrics]
    if panels := [(m, s) for m, s in panels if any(len(xs) > 1 for xs, _ in s.values())]:
        files.append(plots.lines(_png(out, "beam_width", d, b), panels, "beam width", title))

    monitor = here[labels[0]].runs[0].monitor.split("/", 1)[-1] if labels else "ndcg@10"
    curves = [("train loss", per_label(lambda r: {int(e): v for e, v in _series(r.log, "epoch", "train/loss").items()}))]
    curves += [(f"val {key}", per_label(lambda r, k=key: {h["epoch"]: h[k] for h in r.metrics.get("history", [])
                                                         if k in h})) for key in ("loss", monitor)]
    if curves := [c for c in curves if c[1]]:
        files.append(plots.lines(_png(out, "training_curves", d, b), curves, "epoch", title))

    for lab in labels:
        panels = []
        for name, prefix in (("APAO weight w_m", "train/apao/w"), ("prefix loss L_m", "train/apao/L")):
            per_m = {}  # m -> one {step: value} per run
            for r in here[lab].runs:
                for m, col in sorted(_numbered({c: c for c in r.log.columns}, prefix).items()):
                    per_m.setdefault(m, []).append(_series(r.log, "step", col))
            if per_m:
                panels.append((name, {f"m={m}": _mean_by_x(per_m[m]) for m in sorted(per_m)}))
        if panels:
            files.append(plots.lines(_png(out, "apao_weights", d, b, lab), panels, "step", f"{title} · {lab}"))
    return files


def sensitivity_plots(out: Path, groups: dict[Cell, list[Variant]], metrics: list[str],
                      split: str) -> tuple[list[Path], list[str]]:
    """Configs of one objective that differ in one objective parameter: a line plot; in two: a heatmap
    (rows, cols as the objective class's `axes` order them, e.g. β × η for APAO); value = the mean over
    seeds on `split`."""
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
            vs = sorted(variants, key=lambda v: sortable(v.flat[f"objective.{p}"]))
            xs = [v.flat[f"objective.{p}"] for v in vs]
            panels = [(m, {lab: (xs, [v.mean(f"{split}/{m}") for v in vs])}) for m in shown]
            if panels:
                files.append(plots.lines(_png(out, "sensitivity", d, b, lab, p), panels, p, title, categorical=True))
            continue
        preferred = axes(variants[0].runs[0].cfg["objective"])
        rp, cp = next(((r, c) for r, c in preferred if {r, c} == set(params)), params)
        rv = sorted({v.flat[f"objective.{rp}"] for v in variants}, key=sortable)
        cv = sorted({v.flat[f"objective.{cp}"] for v in variants}, key=sortable)
        at = {(v.flat[f"objective.{rp}"], v.flat[f"objective.{cp}"]): v for v in variants}
        panels = [(m, [[at[(x, y)].mean(f"{split}/{m}") if (x, y) in at else math.nan for y in cv] for x in rv])
                  for m in shown]
        if panels:
            files.append(plots.heatmaps(_png(out, "heatmap", d, b, lab, f"{rp}x{cp}"), panels, rv, cv, rp, cp, title))
    return files, notes
