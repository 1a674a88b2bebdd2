"""Runs -> variants (one configuration of one objective on one dataset and backbone, its seeds) and the
variant each table cell shows: the best mean validation score, as the papers tune on validation."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from genrec.eval.metrics import lower_is_better
from genrec.report.load import Run

Cell = tuple[str, str, str]  # (dataset, backbone, objective label)


@dataclass
class Variant:
    """Its ok runs (one per seed, the newest) and the seeds that only have failed/running runs."""
    runs: list[Run]
    pending: list[Run]
    flat: dict

    def values(self, key: str) -> list[float]:
        return [r.values[key] for r in self.runs if isinstance(r.values.get(key), (int, float))]

    def mean(self, key: str) -> float:
        v = self.values(key)
        return statistics.fmean(v) if v else math.nan

    def score(self, select: str | None, seeds: set | None = None) -> float:
        """Mean validation score over `seeds` (default: all its seeds), higher is better (a loss is negated).
        A variant's runs share one config, so one monitor."""
        key = select or (self.runs[0].monitor if self.runs else "")
        v = [r.values[key] for r in self.runs
             if isinstance(r.values.get(key), (int, float)) and (seeds is None or r.seed in seeds)]
        return (-1 if lower_is_better(key) else 1) * statistics.fmean(v) if v else -math.inf


def sortable(x) -> tuple:
    return (0, x, "") if isinstance(x, (int, float)) and not isinstance(x, bool) else (1, 0, str(x))


def group(runs: list[Run]) -> dict[Cell, list[Variant]]:
    """(dataset, backbone, label) -> its variants."""
    by: dict[Cell, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by[(r.dataset, r.backbone, r.label)][r.key].append(r)
    out = {}
    for cell, variants in by.items():
        out[cell] = []
        for rs in variants.values():
            ok = {}  # seed -> its newest ok run
            for r in sorted((r for r in rs if r.status == "ok"), key=lambda r: (r.path / "metrics.json").stat().st_mtime):
                ok[r.seed] = r
            pending = [r for r in rs if r.status != "ok" and r.seed not in ok]
            out[cell].append(Variant(sorted(ok.values(), key=lambda r: sortable(r.seed)), pending, rs[0].flat))
    return out


def varying(variants: list[Variant]) -> list[str]:
    """The config keys whose values differ between the variants."""
    keys = sorted({k for v in variants for k in v.flat})
    return [k for k in keys if len({json.dumps(v.flat.get(k), default=str) for v in variants}) > 1]


def shared_seeds(variants: list[Variant]) -> set | None:
    """The seeds every finished variant ran; None when they share none (or there is none)."""
    sets = [{r.seed for r in v.runs} for v in variants if v.runs]
    return (set.intersection(*sets) if sets else set()) or None


def choose(variants: list[Variant], select: str | None) -> Variant:
    """The variant with the best validation score on the seeds all of them ran (a grid point run on one seed
    against a setting run on three: a 3-seed mean against one seed would favour the noisier), on all of each
    one's seeds when they share none. Its table cell then shows all its seeds."""
    seeds = shared_seeds(variants)
    return max(variants, key=lambda v: (bool(v.runs), v.score(select, seeds)))


def baseline_cell(chosen: dict[Cell, Variant], cell: Cell, baseline: str) -> Cell | None:
    """The baseline row of `cell`'s dataset, backbone and recipe ("CE [apao_release]" for an
    "APAO-pointwise [apao_release]" row), None without one."""
    d, b, _ = cell
    recipe = chosen[cell].runs[0].recipe if chosen[cell].runs else ""
    return next((c for c in chosen if c[:2] == (d, b) and c[2].lower() == (baseline + recipe).lower()), None)
