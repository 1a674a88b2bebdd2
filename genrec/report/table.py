"""The table: one cell per (backbone, objective, dataset, metric), mean ± std over seeds, gain over the
baseline row of the same recipe, best mean per backbone block (the lowest for a pruning rate); optional reference numbers (a paper's) as extra columns.
Written as table.md / table.tex / table.csv (wide, as shown) and cells.csv (long, numeric)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from genrec.eval.metrics import lower_is_better
from genrec.report.load import BACKBONE_NAMES, base_label
from genrec.report.select import Cell, Variant
from genrec.runs import write_text

KEYS = ["backbone", "objective", "dataset", "metric"]
Reference = dict[str, dict[str, dict[str, dict[str, float]]]]  # dataset -> backbone -> objective -> metric -> value


def cells(chosen: dict[Cell, Variant], order: dict[str, float], metrics: list[str], split: str, baseline: str,
          paper: Reference | None = None) -> pd.DataFrame:
    """Long table, rows in display order: backbone, objective (by `order`), dataset, metric."""
    values = pd.DataFrame(
        [(b, lab, d, m, r.seed, r.values[f"{split}/{m}"]) for (d, b, lab), v in chosen.items() for r in v.runs
         for m in metrics if isinstance(r.values.get(f"{split}/{m}"), (int, float))],
        columns=KEYS + ["seed", "value"])
    stats = values.groupby(KEYS).agg(mean=("value", "mean"), std=("value", "std"), n=("value", "size"),
                                     seeds=("seed", list))
    rows = sorted({(b, lab) for _, b, lab in chosen}, key=lambda r: (r[0], order.get(r[1], math.inf), r[1]))
    grid = pd.MultiIndex.from_tuples([(b, lab, d, m) for b, lab in rows for d in sorted({d for d, _, _ in chosen})
                                      for m in metrics], names=KEYS)
    df = stats.reindex(grid).reset_index()
    df["n"] = df["n"].fillna(0).astype(int)
    df["seeds"] = [s if isinstance(s, list) else [] for s in df["seeds"]]
    variants = [chosen.get((d, b, lab)) for b, lab, d in zip(df.backbone, df.objective, df.dataset)]
    df["failed"] = [[str(r.path) for r in v.pending if r.status == "failed"] if v else [] for v in variants]
    df["status"] = [_status(v, n) for v, n in zip(variants, df.n)]
    df["gain"] = gain(df, "mean", baseline)
    signed = df["mean"] * df["metric"].map(lambda m: -1.0 if lower_is_better(m) else 1.0)  # PR@k: lowest is best
    df["best"] = signed.notna() & (signed == signed.groupby([df.backbone, df.dataset, df.metric]).transform("max"))
    if paper:  # looked up by the label without its recipe: "CE [apao_release]" shows the paper's CE
        base = df["objective"].map(base_label)
        df["paper"] = [paper.get(d, {}).get(b, {}).get(lab, {}).get(m) for b, lab, d, m in zip(df.backbone, base,
                                                                                              df.dataset, df.metric)]
        df["paper"] = df["paper"].astype(float)
        df["paper_gain"] = gain(df, "paper", baseline).where(base.str.lower() != baseline.lower())
    return df


def _status(v: Variant | None, n: int) -> str:
    """ok (values), running / failed (no ok run, pending ones), missing (no run, or no such metric)."""
    if n:
        return "ok"
    if v is None or v.runs or not v.pending:
        return "missing"
    return "running" if any(r.status == "running" for r in v.pending) else "failed"


def gain(df: pd.DataFrame, col: str, baseline: str) -> pd.Series:
    """100 (x / x_baseline - 1), x_baseline: the baseline row's value in the same backbone, dataset, metric and
    recipe ("CE [apao_release]" for "APAO-pointwise [apao_release]": objectives are compared within a recipe)."""
    on = ["backbone", "dataset", "metric", "recipe"]
    df = df.assign(recipe=[lab[len(base_label(lab)):] for lab in df["objective"]])
    is_base = df["objective"].str.lower() == (baseline + df["recipe"]).str.lower()
    b = df.join(df[is_base].set_index(on)[col].rename("base"), on=on)["base"]
    return (100.0 * (df[col] / b - 1.0)).where(~is_base & (b != 0))


def text(c, latex: bool = False) -> str:
    """"**0.0612** ± 0.0010 (+3.20%)", "failed", "running", "—" (no run)."""
    if c.status != "ok":
        return {"missing": "--" if latex else "—"}.get(c.status, c.status)
    pm, pct = (" $\\pm$ ", "\\%") if latex else (" ± ", "%")
    mean = f"{c.mean:.4f}"
    if c.best:
        mean = f"\\textbf{{{mean}}}" if latex else f"**{mean}**"
    s = mean + (f"{pm}{c.std:.4f}" if pd.notna(c.std) else "")
    return s + (f" ({c.gain:+.2f}{pct})" if pd.notna(c.gain) else "")


def paper_text(value: float, gain: float, latex: bool = False) -> str:
    """A reference cell: "0.0667 (+9.70%)" (its gain over the reference's baseline row)."""
    if pd.isna(value):
        return "--" if latex else "—"
    pct = "\\%" if latex else "%"
    return f"{value:.4f}" + (f" ({gain:+.2f}{pct})" if pd.notna(gain) else "")


def _seeds(n: pd.Series) -> str:
    """The row's seed count: "3", or "2–3" when its cells differ."""
    ns = sorted(set(n[n > 0]))
    return "0" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"


def wide(df: pd.DataFrame, latex: bool = False) -> pd.DataFrame:
    """As shown: rows backbone × objective (+ seed count), columns (dataset, metric [, paper metric])."""
    esc = (lambda s: re.sub(r"([_%&#])", r"\\\1", s)) if latex else str  # noqa: E731
    df = df.assign(text=[text(c, latex) for c in df.itertuples()])
    if "paper" in df:
        ref = df[df.groupby(["dataset", "metric"])["paper"].transform("count") > 0]
        df = pd.concat([df, ref.assign(metric="paper " + ref["metric"],
                                       text=[paper_text(v, g, latex) for v, g in zip(ref["paper"], ref["paper_gain"])])])
    rows = list(dict.fromkeys(zip(df.backbone, df.objective)))
    cols = list(dict.fromkeys(zip(df.dataset, df.metric)))
    cols = sorted(cols, key=lambda c: c[0])  # each dataset's reference columns after its own (stable sort)
    t = df.pivot(index=["backbone", "objective"], columns=["dataset", "metric"], values="text").reindex(
        index=pd.MultiIndex.from_tuples(rows), columns=pd.MultiIndex.from_tuples(cols))
    seeds = df.groupby(["backbone", "objective"])["n"].agg(_seeds)
    head = pd.DataFrame({("", "Backbone"): [esc(BACKBONE_NAMES.get(b, b)) for b, _ in rows],
                         ("", "Objective"): [esc(lab) for _, lab in rows],
                         ("", "Seeds"): [seeds[r] for r in rows]})
    t.columns = pd.MultiIndex.from_tuples([(esc(d), esc(m)) for d, m in cols])
    return pd.concat([head, t.reset_index(drop=True)], axis=1)


def flat(df: pd.DataFrame) -> pd.DataFrame:
    """The wide table with one header row: "Backbone", ..., "beauty recall@10"."""
    t = wide(df)
    t.columns = [" ".join(x for x in c if x) for c in t.columns]
    return t


def markdown(t: pd.DataFrame, labels: int = 2) -> str:
    """A table of strings as markdown (table.md, the page): the first `labels` columns left, the rest right."""
    return t.to_markdown(index=False, disable_numparse=True,
                         colalign=["left"] * labels + ["right"] * (t.shape[1] - labels)) + "\n"


def write_tables(out: Path, df: pd.DataFrame) -> list[Path]:
    md = flat(df)
    write_text(out / "table.md", markdown(md))
    write_text(out / "table.csv", md.replace(r"\*\*", "", regex=True).to_csv(index=False))
    numeric = [c for c in KEYS + ["mean", "std", "n", "gain", "best", "status", "paper", "paper_gain"] if c in df]
    write_text(out / "cells.csv", df[numeric].to_csv(index=False))
    tex = wide(df, latex=True)
    lines = tex.to_latex(index=False, escape=False, multicolumn_format="c",
                         column_format="lll" + "r" * (tex.shape[1] - 3)).splitlines()
    body = lines.index(r"\midrule") + 1
    backbones = list(tex[("", "Backbone")])
    for i in reversed([i for i in range(1, len(backbones)) if backbones[i] != backbones[i - 1]]):
        lines.insert(body + i, r"\midrule")  # between backbone blocks
    write_text(out / "table.tex", "\n".join(lines) + "\n")
    return [out / n for n in ("table.md", "table.tex", "table.csv", "cells.csv")]
