"""Collect run dirs into the papers' table layout and plots.

    python -m genrec.report                                   # runs=[outputs,multirun]
    python -m genrec.report runs=[multirun/2026-01-01_10-00-00] metrics=[recall@5,ndcg@5] out=reports/tiny

Table: rows backbone × objective (+ the row's seed count), columns dataset × metric; mean ± std (sample,
over seeds), gain (%) of the mean over the `baseline` row of the same backbone, dataset and preset, the best mean
per column within each backbone in bold; with `paper` (reference numbers), a "paper <metric>" column
beside each metric that has one, with the reference's own gain over its baseline row. Several
configurations of one objective on one dataset and backbone (a β × η sweep) are reduced to the one with
the best mean validation score (each run's `trainer.monitor`, or `select`) on the seeds they all ran, as
the papers tune on validation; the sweep itself becomes a sensitivity plot. Runs of another experiment preset (`tags`) than
the most common one are rows of their own, "CE [apao_release]", with the reference numbers of "CE". A run
dir without metrics.json is a `failed` cell if it has failed.json or was last touched more than
`stale_minutes` ago, else `running`. Writes table.md, table.tex, table.csv (wide, as shown), cells.csv
(long, numeric), paired.csv (each row against the baseline over the same users, from per-user ranks: paired.py),
summary.json and the PNGs for which data exists; with `page`, the results page (page.py).

Rows are named, ordered and split into ablations by the objective classes (`Objective.report_row`,
`ablations`, `axes` in genrec/objectives/base.py): a new objective needs nothing here.
  load.py    run dirs -> Run records;  select.py  variants, validation-based selection
  table.py   pandas table, md / tex / csv;  paired.py  paired test over users
  figures.py + plots.py  PNGs;  page.py  the results page
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from genrec.report import plots  # noqa: F401  (tests patch genrec.report.plots)
from genrec.report.figures import diagnostic_plots, sensitivity_plots
from genrec.report.load import (BACKBONE_NAMES, Run, base_label, is_row_label, load_runs, mark_recipes,  # noqa: F401
                                objective_label, shipped_labels)
from genrec.report.page import write_page
from genrec.report.paired import paired
from genrec.report.select import choose, group, shared_seeds, sortable, varying
from genrec.report.table import Reference, cells, text, write_tables
from genrec.runs import write_text


class UnknownBaseline(ValueError):
    """`baseline` is no objective's row label (a typo)."""


def report(runs: Sequence[str | Path], out: str | Path, metrics: Sequence[str] = ("recall@10", "ndcg@10", "recall@20",
           "ndcg@20"), baseline: str = "ce", split: str = "test", select: str | None = None,
           stale_minutes: float = 30.0, loader: Callable[..., list[Run]] = load_runs,
           paper: Reference | None = None, page: str | Path | None = None, page_intro: str | Path | None = None,
           rebuild: str | None = None) -> dict:
    """Write the tables, plots and summary.json for the runs `loader(runs)` finds, and with `page` the results
    page (`page_intro`: markdown under its title; `rebuild`: the command shown to rebuild it); return the
    summary. Raises FileNotFoundError, writing nothing, when there is no run or no `page_intro` file, and
    UnknownBaseline when no objective has the `baseline` row label."""
    if page and page_intro and not Path(page_intro).is_file():
        raise FileNotFoundError(f"page_intro={page_intro}: no such file")
    found = loader(runs, stale_minutes)
    if not found:
        raise FileNotFoundError(f"no run dirs (config.yaml) under {', '.join(map(str, runs))}")
    mark_recipes(found)
    metrics = list(metrics)
    order = {r.label: r.order for r in found}
    groups = group(found)
    chosen = {k: choose(v, select) for k, v in groups.items()}
    labels = sorted({base_label(lab) for _, _, lab in chosen})
    absent = bool(chosen) and baseline.lower() not in map(str.lower, labels)
    if absent and not is_row_label(baseline):  # a typo: refused before anything is written
        raise UnknownBaseline(f"baseline={baseline}: no objective has that row label (objectives: "
                              f"{', '.join(shipped_labels())}; rows here: {', '.join(labels)})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    scored_on = {k: shared_seeds(v) for k, v in groups.items()}
    df = cells(chosen, order, metrics, split, baseline, paper)
    files = write_tables(out, df)
    drawn = [(d, b, p) for d, b in sorted({(d, b) for d, b, _ in chosen})
             for p in diagnostic_plots(out, d, b, {lab: v for (dd, bb, lab), v in chosen.items()
                                                   if (dd, bb) == (d, b) and v.runs}, order, metrics, split)]
    pngs = [p for _, _, p in drawn]
    more, notes = sensitivity_plots(out, groups, metrics, split)
    pngs += more
    for (d, b, lab), v in sorted(chosen.items()):
        notes += [f"{r.status}: {d}/{b}/{lab} seed {r.seed}: {r.path}" + (f" ({r.error})" if r.error else "")
                  for r in v.pending]
        lacking = [f"{split}/{m}" for m in metrics
                   if not any(isinstance(r.values.get(f"{split}/{m}"), (int, float)) for r in v.runs)]
        if v.runs and lacking:  # "—" cells beside finished runs
            notes.append(f"{d}/{b}/{lab}: its {len(v.runs)} finished run(s) log no {', '.join(lacking)} "
                         f"(eval.ks {v.runs[0].cfg.get('eval', {}).get('ks')})")
        tried = [x for x in groups[(d, b, lab)] if x.runs]
        if len(tried) > 1 and v.runs:
            picked = ", ".join(f"{k}={v.flat.get(k)}" for k in varying(tried))
            seeds = scored_on[(d, b, lab)]
            over = (f" over seed{'s' * (len(seeds) > 1)} {', '.join(map(str, sorted(seeds, key=sortable)))}, the "
                    "seeds they share" if seeds and any({r.seed for r in x.runs} != seeds for x in tried) else "")
            notes.append(f"{d}/{b}/{lab}: best of {len(tried)} configs on {select or v.runs[0].monitor}{over}: {picked}")
    if absent:  # an objective these runs lack
        notes.append(f"baseline={baseline}: no row of that objective (rows: {', '.join(labels)}): no gains")
    pairs, unpaired = paired(chosen, metrics, split, baseline)
    notes += unpaired
    (out / "paired.csv").unlink(missing_ok=True)  # an earlier report's
    if len(pairs):
        files.append(out / "paired.csv")
        write_text(files[-1], pairs.to_csv(index=False))
    records = df.astype(object).where(df.notna(), None).to_dict("records")
    summary = {
        "split": split, "metrics": metrics, "baseline": baseline,
        "runs": {s: sum(r.status == s for r in found) for s in ("ok", "failed", "running")},
        "rows": [{"backbone": b, "objective": lab} for b, lab in dict.fromkeys(zip(df.backbone, df.objective))],
        "columns": [{"dataset": d, "metric": m} for d, m in dict.fromkeys(zip(df.dataset, df.metric))],
        "cells": [{**c, "text": text(row)} for c, row in zip(records, df.itertuples())],
        "selected": [{"dataset": d, "backbone": b, "objective": lab,
                      "score": v.score(select, scored_on[(d, b, lab)]) if v.runs else None,
                      "objective_params": {k: v.flat[k] for k in v.flat if k.startswith("objective.")},
                      "runs": [str(r.path) for r in v.runs], "variants": len(groups[(d, b, lab)])}
                     for (d, b, lab), v in sorted(chosen.items())],
        "paired": pairs.to_dict("records"),
        "notes": notes,
        "files": [p.name for p in files + pngs] + ["summary.json"],
    }
    if page:
        figures = [x for x in drawn if x[2].name.startswith(("prefix_recall", "pruning_rate"))]
        write_page(Path(page), Path(page_intro).read_text() if page_intro else "", df, groups, chosen, order, split,
                   baseline, select, figures, summary, rebuild, pairs)
        summary["page"] = str(page)
    write_text(out / "summary.json", json.dumps(summary, indent=1, default=str))
    return summary
