"""The results page (`page=`): one markdown file with the table, the pruning rates, the figures, each run's
cost, the commands that rerun every run and rebuild the page, and the report's notes."""

from __future__ import annotations

import math
import os
import shlex
import statistics
from pathlib import Path

import pandas as pd

from genrec.report.load import BACKBONE_NAMES, Run, overrides_of
from genrec.report.select import Cell, Variant, baseline_cell, shared_seeds, sortable, varying
from genrec.report.table import cells, flat, markdown
from genrec.runs import write_text

PRUNING = ["pruning_rate@5", "pruning_rate@10"]
CAPTIONS = {"prefix_recall": "Prefix recall per beam step m: the share of targets whose length-m prefix is in the "
                             "beam",
            "pruning_rate": "Pruning rate PR@k: the share of targets full ranking puts in the top k that the beam "
                            "loses (lower is better)"}
SETTINGS = ("runs", "out", "metrics", "baseline", "split", "select", "paper", "page", "page_intro")  # shape the page


def rebuild_command(settings: dict) -> str:
    """`python -m genrec.report` with the report's settings that shape the page (conf/report.yaml's keys)."""
    def arg(k: str, v) -> str:
        return shlex.quote(f"{k}=" + (f"[{','.join(map(str, v))}]" if isinstance(v, (list, tuple)) else str(v)))
    return " ".join(["python -m genrec.report"] + [arg(k, settings[k]) for k in SETTINGS if settings.get(k) is not None])


def rerun_command(r: Run) -> str:
    """`python -m genrec.train <its command-line overrides>` from the run's overrides.yaml (Hydra's
    .hydra/overrides.yaml, committed beside metrics.json)."""
    if (overrides := overrides_of(r.path)) is None:
        return f"# no overrides.yaml: its full config is {r.path.name}/config.yaml"
    return " ".join(["python -m genrec.train"] + [shlex.quote(o) for o in overrides])


def _num(x, spec: str) -> str:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)
    return format(x, spec) if ok else "—"


def per_epoch(r: Run) -> float | None:
    """Training seconds per epoch (metrics.json `train_seconds` / `epochs`), None when unknown."""
    t, n = r.values.get("train_seconds"), r.values.get("epochs")
    return t / n if isinstance(t, (int, float)) and isinstance(n, int) and n > 0 else None


def _name(d: str, b: str, lab: str) -> dict:
    return {"Dataset": d, "Backbone": BACKBONE_NAMES.get(b, b), "Objective": lab}


def run_cost(c: Cell, r: Run) -> dict:
    """Wall time of all the run's processes, training seconds per epoch, peak RSS of the largest process."""
    v, wall = r.values, r.values.get("seconds")
    return {**_name(*c), "Seed": str(r.seed), "Processes": _num(v.get("processes"), "d"),
            "Epochs": _num(v.get("epochs"), "d"), "Best epoch": _num(v.get("best_epoch"), "d"),
            "Wall (min)": _num(wall / 60 if isinstance(wall, (int, float)) else None, ".1f"),
            "Train s/epoch": _num(per_epoch(r), ".1f"), "Peak RSS (GB)": _num(v.get("peak_rss_gb"), ".2f")}


def row_cost(chosen: dict[Cell, Variant], rows: list[Cell], baseline: str) -> pd.DataFrame:
    """Per row its mean training seconds per epoch over seeds, and that relative to the baseline row of the
    same dataset, backbone and recipe ("CE [apao_release]" for an "APAO-pointwise [apao_release]" row)."""
    def mean(c: Cell | None) -> float | None:
        v = [x for r in chosen[c].runs if (x := per_epoch(r)) is not None] if c else []
        return statistics.fmean(v) if v else None

    table = []
    for d, b, lab in rows:
        x, x0 = mean((d, b, lab)), mean(baseline_cell(chosen, (d, b, lab), baseline))
        table.append({**_name(d, b, lab), "Train s/epoch (mean)": _num(x, ".1f"),
                      f"vs {baseline.upper()}": f"×{x / x0:.2f}" if x and x0 else "—"})
    return pd.DataFrame(table)


def scoring_rows(chosen: dict[Cell, Variant], rows: list[Cell], metrics: list[str], split: str) -> pd.DataFrame:
    """Each row under every scoring of its runs (Run.by_scoring), its own first, mean over the runs evaluated
    under more than one (so that a row's lines average the same seeds); rows evaluated one way only are left out."""
    table = []
    for c in rows:
        runs = [(r, p) for r in chosen[c].runs if len(p := r.by_scoring(split)) > 1]
        if not runs:
            continue
        own = runs[0][0].scoring
        for k in sorted({k for _, p in runs for k in p}, key=lambda k: (k != own, k)):
            have = [(r, p[k]) for r, p in runs if k in p]
            line = {**_name(*c), "Scoring": f"{k[0]}, τ {k[1]:g}" + (" (own)" if k == own else ""),
                    "Seeds": ",".join(str(r.seed) for r, _ in have)}
            for m in metrics:
                v = [x for _, p in have if isinstance(x := p.get(f"{split}/{m}"), (int, float))]
                line[m] = _num(statistics.fmean(v) if v else None, ".4f")
            table.append(line)
    return pd.DataFrame(table)


def grid_rows(groups: dict[Cell, list[Variant]], chosen: dict[Cell, Variant], order: dict[str, float],
              select: str | None, metrics: list[str], split: str) -> pd.DataFrame:
    """Every row that ran several configurations (a β × η grid): one line per configuration, its validation
    score on the seeds all of them ran (what selection compared: select.choose) and, beside it, its `split`
    metrics on the same seeds, which selection never reads."""
    table = []
    for c in sorted(groups, key=lambda c: (c[0], c[1], order.get(c[2], 0.0), c[2])):
        tried = [v for v in groups[c] if v.runs]
        if len(tried) < 2:
            continue
        seeds, keys = shared_seeds(tried), varying(tried)
        for v in sorted(tried, key=lambda v: [sortable(v.flat.get(k)) for k in keys]):
            on = Variant([r for r in v.runs if seeds is None or r.seed in seeds], [], v.flat)
            monitor = select or v.runs[0].monitor
            table.append({**_name(*c), "Setting": ", ".join(f"{k.removeprefix('objective.')}={v.flat.get(k)}" for k in keys),
                          "Seeds run": ",".join(str(r.seed) for r in v.runs),
                          "Compared on": ",".join(str(r.seed) for r in on.runs),
                          f"{monitor} (selects)": _num(on.mean(monitor), ".4f"),
                          **{f"{split} {m}": _num(on.mean(f"{split}/{m}"), ".4f") for m in metrics},
                          "Shown": "✓" if v is chosen[c] else ""})
    return pd.DataFrame(table)


def paired_rows(pairs: pd.DataFrame) -> pd.DataFrame:
    """paired.py's table as the page shows it."""
    def seeds(x: list) -> str:
        return ",".join(map(str, x))
    return pd.DataFrame([{**_name(r.dataset, r.backbone, r.objective), "vs": r.baseline, "Seeds": seeds(r.seeds),
                          "vs seeds": seeds(r.baseline_seeds), "Users": str(r.users), "Metric": r.metric,
                          "Difference": f"{r.diff:+.4f}", "95% interval": f"[{r.lo:+.4f}, {r.hi:+.4f}]",
                          "p": f"{r.p:.3f}" if r.p >= 0.001 else "<0.001"} for r in pairs.itertuples()])


def write_page(path: Path, intro: str, df: pd.DataFrame, groups: dict[Cell, list[Variant]],
               chosen: dict[Cell, Variant], order: dict[str, float], split: str, baseline: str, select: str | None,
               figures: list[tuple[str, str, Path]], summary: dict, rebuild: str | None, pairs: pd.DataFrame) -> None:
    """The page at `path`: `df` is the report's table (cells), `groups` every row's configurations and `chosen`
    the one each row shows, `figures` its PNGs as (dataset, backbone, file), `pairs` paired.py's table."""
    shown = sorted(chosen, key=lambda c: (c[0], c[1], order.get(c[2], 0.0), c[2]))
    rows = [c for c in shown if chosen[c].runs]
    base, n = baseline.upper(), summary["runs"]
    metrics = [m for m in dict.fromkeys(df["metric"]) if m not in PRUNING]
    scoring = scoring_rows(chosen, rows, metrics + PRUNING, split)
    grid = grid_rows(groups, chosen, order, select, metrics, split)
    steps = sorted({k.split("/", 1)[1] for c in rows for r in chosen[c].runs for k in r.values
                    if k.startswith(f"{split}/prefix_recall@")}, key=lambda m: int(m.rsplit("@", 1)[1]))
    lines = [f"# Results: {', '.join(sorted({d for d, _, _ in chosen}))}", "", intro.rstrip(), "",
             f"*Written by `python -m genrec.report` from {sum(n.values())} run dirs ({n['ok']} ok, {n['failed']} "
             f"failed, {n['running']} running); rebuild it with the command under Rerun.*", "",
             "## Table", "", f"{split.title()} mean ± std over seeds (Seeds: how many), in brackets the gain over "
             f"{base} of the same backbone and preset; bold: the best per backbone. \"paper\": the reference numbers, with "
             "their gain over the paper's own baseline. A row \"[preset]\" was trained with another preset than the "
             "rest (its objectives are compared with that preset's CE, never across presets).",
             "", markdown(flat(df)),
             "## Grid on validation", "", "Rows that ran several configurations of their objective: each one's "
             "validation score on the seeds all of them ran, which picks the one the tables show (✓), and beside it "
             f"its {split} numbers on the same seeds, which the choice never reads.", "",
             markdown(grid, 4) if len(grid) else "Every row ran one configuration.\n",
             "## Prefix recall per beam step", "", f"{CAPTIONS['prefix_recall']} (APAO's claim: its gain over {base} "
             f"grows along the beam); mean ± std over seeds, in brackets the change vs {base} at that step.", "",
             markdown(flat(cells(chosen, order, steps, split, baseline))) if steps else "No run has prefix recall.\n",
             "## Pruning rate", "", f"{CAPTIONS['pruning_rate']}, from each run's full-rank evaluation at its own beam "
             "and scoring (`eval.full_rank=true`; the rows under one scoring: section Scoring); mean ± std over "
             f"seeds, in brackets the change vs {base}; —: no full-rank evaluation.", "",
             markdown(flat(cells(chosen, order, PRUNING, split, baseline))),
             "## Paired test over users", "", f"Each row against {base} of the same backbone and preset on the same "
             f"{split} users: the mean per-user difference (a hit for recall, the NDCG gain), averaged over the seeds "
             "with per-user ranks (`test_ranks.csv`, or a re-evaluation's `eval/<name>.ranks.csv`), its 95% bootstrap "
             "interval over users and a two-sided sign-flip "
             "randomization p. It measures the test set's noise for these trained models, not the spread between "
             "seeds, and pairs the seeds listed (any two, also different ones).", "",
             markdown(paired_rows(pairs), 3) if len(pairs) else "No two rows have per-user ranks yet.\n",
             "## Scoring", "", "Each row under every scoring (`eval.score`, temperature τ) its runs were evaluated "
             "with: its own (its objective's default, as that objective's release evaluates) and every other of its "
             "full-rank re-evaluations at its own beam, from one-process re-evaluations (`genrec.evaluate`; the own "
             "scoring from metrics.json where a run has none); mean over the seeds listed, those evaluated more than "
             "one way. It separates what an objective's training changes from what its scoring changes (rows "
             "evaluated one way only are left out).",
             "", markdown(scoring, 5) if len(scoring) else
             "No run has a full-rank re-evaluation under another scoring yet: `python -m genrec.evaluate "
             "ckpt=<run dir> eval.score=masked eval.temperature=1 eval.full_rank=true`.\n",
             "## Figures", ""]
    for d, b, f in figures:
        kind = next(k for k in CAPTIONS if f.name.startswith(k))
        lines += [f"![{kind} {d} {b}]({Path(os.path.relpath(f, path.parent)).as_posix()})", "",
                  f"*{CAPTIONS[kind]}; {d} · {BACKBONE_NAMES.get(b, b)}, mean over seeds.*", ""]
    lines += ["## Cost", "", "Per run: wall time of all its processes (data stage and test included), training "
              "seconds per epoch, peak resident memory of the largest process.", "",
              markdown(pd.DataFrame([run_cost(c, r) for c in rows for r in chosen[c].runs]), 3),
              f"Per row: training seconds per epoch, mean over seeds, relative to {base} of the same backbone and "
              "preset.", "", markdown(row_cost(chosen, rows, baseline), 3),
              "## Rerun", "", "Each run (from its committed overrides.yaml):", "", "```bash"]
    for (d, b, lab) in shown:
        for r in chosen[(d, b, lab)].runs + chosen[(d, b, lab)].pending:
            status = "" if r.status == "ok" else f" ({r.status})"
            lines += [f"# {d} · {BACKBONE_NAMES.get(b, b)} · {lab} · seed {r.seed}{status}", rerun_command(r)]
    if rebuild:
        lines += ["```", "", "The page, from the committed runs:", "", "```bash", rebuild]
    lines += ["```", ""]
    lines += ["## Notes", ""] + [f"- {x}" for x in summary["notes"] or ["none"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "\n".join(lines) + "\n")
