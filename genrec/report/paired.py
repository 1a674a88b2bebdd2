"""Each row against the baseline row over the same users (a paired test): per user a metric's value (a hit, an
NDCG gain: genrec.eval.metrics.per_user) from the beam ranks of `<split>_ranks.csv`, averaged over the row's seeds
that have them; then the mean per-user difference, its 95% bootstrap interval over users and a two-sided
sign-flip randomization p-value (Smucker, Allan & Carterette, CIKM 2007). It measures the test set's noise for
these trained models: with one seed per row it says nothing about the variance between seeds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from genrec.eval.metrics import per_user
from genrec.report.select import Cell, Variant, baseline_cell

RESAMPLES = 10_000
CHUNK = 500  # resamples drawn at once (bounds memory: CHUNK x users indices)


def bootstrap_ci(d: np.ndarray, resamples: int = RESAMPLES, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the mean of `d` over `resamples` resamples of its entries with replacement."""
    rng, means = np.random.default_rng(seed), []
    for n in np.diff(np.r_[0:resamples:CHUNK, resamples]):
        means.append(d[rng.integers(0, len(d), size=(n, len(d)))].mean(1))
    lo, hi = np.quantile(np.concatenate(means), [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def sign_flip_p(d: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> float:
    """Two-sided p of mean(d) = 0: the share of random sign flips of the per-user differences whose mean is at
    least as far from 0 as the observed one (the observed set counted once: never 0)."""
    rng, seen, observed = np.random.default_rng(seed), 0, abs(d.mean())
    for n in np.diff(np.r_[0:resamples:CHUNK, resamples]):
        signs = rng.integers(0, 2, size=(n, len(d))) * 2 - 1
        seen += int((np.abs((signs * d).mean(1)) >= observed - 1e-12).sum())
    return (seen + 1) / (resamples + 1)


def user_values(v: Variant, metric: str, split: str) -> tuple[pd.Series, list]:
    """Per user the metric averaged over the variant's runs that have per-user ranks (users all of them have),
    and those runs' seeds."""
    cols, seeds = [], []
    for r in v.runs:
        if (ranks := r.ranks(split)) is not None:
            value = per_user(torch.as_tensor(ranks["rank"].to_numpy()), metric).numpy()
            cols.append(pd.Series(value, index=ranks["user"].to_numpy()))
            seeds.append(r.seed)
    return (pd.concat(cols, axis=1, join="inner").mean(1) if cols else pd.Series(dtype=float)), seeds


def paired(chosen: dict[Cell, Variant], metrics: list[str], split: str, baseline: str) -> pd.DataFrame:
    """One row per (row with per-user ranks, metric): its mean per-user difference from the baseline row, the
    95% interval and p; empty when no two rows have them."""
    out = []
    for cell in sorted(chosen):
        base = baseline_cell(chosen, cell, baseline)
        if base is None or base == cell:
            continue
        for m in metrics:
            x, seeds = user_values(chosen[cell], m, split)
            x0, seeds0 = user_values(chosen[base], m, split)
            both = x.index.intersection(x0.index)
            if not len(both):
                continue
            d = (x[both] - x0[both]).to_numpy()
            lo, hi = bootstrap_ci(d)
            out.append({"dataset": cell[0], "backbone": cell[1], "objective": cell[2], "baseline": base[2],
                        "seeds": seeds, "baseline_seeds": seeds0, "users": len(both), "metric": m,
                        "diff": float(d.mean()), "lo": lo, "hi": hi, "p": sign_flip_p(d)})
    return pd.DataFrame(out, columns=["dataset", "backbone", "objective", "baseline", "seeds", "baseline_seeds",
                                      "users", "metric", "diff", "lo", "hi", "p"])
