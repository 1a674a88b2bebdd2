"""Matplotlib (Agg) figures for `genrec.report`: each function writes one PNG and returns its path.

A figure is a row of panels; a line panel is (y label, {series label: (xs, ys)}).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
from matplotlib.ticker import MaxNLocator

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

Series = dict[str, tuple[list, list]]


def _save(fig, path: Path, title: str, tight: bool = False) -> Path:
    fig.suptitle(title, fontsize=10)
    if tight:  # an extra draw: only where colorbars make fixed margins awkward
        fig.tight_layout()
    else:  # margins in inches
        w, h = fig.get_size_inches()
        fig.subplots_adjust(left=0.75 / w, right=1 - 0.15 / w, bottom=0.55 / h, top=1 - 0.45 / h, wspace=0.35)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def lines(path: Path, panels: list[tuple[str, Series]], xlabel: str, title: str, categorical: bool = False) -> Path:
    """Line panels side by side; `categorical`: xs are equally spaced labels (e.g. swept values)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (ylabel, series) in zip(axes[0], panels):
        for label, (xs, ys) in series.items():
            ax.plot(range(len(xs)) if categorical else xs, ys, marker="o", ms=3, label=label)
            if categorical:
                ax.set_xticks(range(len(xs)), [f"{x:g}" if isinstance(x, float) else str(x) for x in xs])
            elif all(isinstance(x, int) for x in xs):
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=7)
    return _save(fig, path, title)


def heatmaps(path: Path, panels: list[tuple[str, list[list[float]]]], rows: list, cols: list, ylabel: str,
             xlabel: str, title: str) -> Path:
    """One annotated heatmap per panel: grid[i][j] is the value at (rows[i], cols[j]); NaN = no run."""
    fig, axes = plt.subplots(1, len(panels), figsize=(1.2 + 0.9 * len(cols), 1.0 + 0.6 * len(rows)), squeeze=False)
    fig.set_size_inches(max(4.0, fig.get_figwidth()) * len(panels), max(3.0, fig.get_figheight()))
    for ax, (name, grid) in zip(axes[0], panels):
        im = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.4f}", ha="center", va="center", fontsize=7,
                            color="k" if im.norm(v) > 0.6 else "w")
        ax.set_xticks(range(len(cols)), [f"{c:g}" if isinstance(c, float) else str(c) for c in cols])
        ax.set_yticks(range(len(rows)), [f"{r:g}" if isinstance(r, float) else str(r) for r in rows])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    return _save(fig, path, title, tight=True)
