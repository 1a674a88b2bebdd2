"""Each row against the baseline row over the same users (a paired test). Per example a metric's value (a hit,
an NDCG gain: genrec.eval.metrics.per_user) from the beam ranks in the runs' ranks files, averaged over the row's
seeds that have them, then per user (several examples under a sliding-window split); the mean per-user
difference, its 95% bootstrap interval over users and a two-sided sign-flip randomization p-value (Smucker,
Allan & Carterette, CIKM 2007). It measures the test set's noise for these trained models: with one seed per
row it says nothing about the variance between seeds."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import torch

from genrec.eval.metrics import per_user
from genrec.report.select import Cell, Variant, baseline_cell

RESAMPLES = 10_000
CHUNK = 500  # resamples drawn at once (bounds memory: CHUNK x users indices)
PAIRED = re.compile(r"(recall|ndcg)@\d+")  # the metrics a beam rank gives per example
COLUMNS = ["dataset", "backbone", "objective", "baseline", "seeds", "baseline_seeds", "users", "metric", "diff", "lo",
           "hi", "p"]


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


def seed_ranks(v: Variant, split: str) -> tuple[pd.DataFrame | None, list]:
    """The variant's runs' beam ranks side by side, one column per seed, on the examples all of them scored
    (index: example, user, item), and those seeds."""
    found = [(r.seed, ranks) for r in v.runs if (ranks := r.ranks(split)) is not None]
    if not found:
        return None, []
    cols = [ranks.set_index(["example", "user", "item"])["rank"].rename(seed) for seed, ranks in found]
    return pd.concat(cols, axis=1, join="inner"), [seed for seed, _ in found]


def user_means(ranks: pd.DataFrame, metric: str) -> pd.Series:
    """Per example the metric averaged over the seed columns, then averaged per user."""
    value = np.mean([per_user(torch.as_tensor(ranks[c].to_numpy()), metric).numpy() for c in ranks], axis=0)
    return pd.Series(value, index=ranks.index).groupby(level="user").mean()


def paired(chosen: dict[Cell, Variant], metrics: list[str], split: str, baseline: str) -> tuple[pd.DataFrame, list]:
    """One row per (row with ranks, recall/NDCG metric): its mean per-user difference from the baseline row, the
    95% interval and p; and notes on what could not be paired."""
    out, notes = [], []
    loaded = {c: seed_ranks(v, split) for c, v in chosen.items()}
    for cell in sorted(chosen):
        base = baseline_cell(chosen, cell, baseline)
        (x, seeds), (x0, seeds0) = loaded[cell], loaded.get(base, (None, []))
        if x is None or base is None or base == cell:
            continue
        name = "/".join(cell)
        if x0 is None:
            notes.append(f"paired test: {name} has per-user ranks, {base[2]} has none")
            continue
        both = x.index.intersection(x0.index)  # the same example, user and held-out item
        if len(both) < max(len(x), len(x0)):
            notes.append(f"paired test: {name} and {base[2]} share {len(both)} of {len(x)} / {len(x0)} examples")
        if not len(both):
            continue
        for m in [m for m in metrics if PAIRED.fullmatch(m)]:
            d = (user_means(x.loc[both], m) - user_means(x0.loc[both], m)).to_numpy()
            lo, hi = bootstrap_ci(d)
            out.append(dict(zip(COLUMNS, [*cell, base[2], seeds, seeds0, len(d), m, float(d.mean()), lo, hi,
                                          sign_flip_p(d)])))
    return pd.DataFrame(out, columns=COLUMNS), notes
