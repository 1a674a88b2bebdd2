"""What must be equal between two runs of the same config and seed: metrics.json without timings."""

from __future__ import annotations

TIMINGS = ("seconds", "train_seconds", "peak_rss_gb", "peak_gpu_gb", "checkpoint")


def reproducible(metrics: dict) -> dict:
    """metrics.json without wall times and peak memory (top level and per validation point) and the checkpoint path."""
    out = {k: v for k, v in metrics.items() if k not in TIMINGS}
    out["history"] = [{k: v for k, v in h.items() if k not in TIMINGS} for h in metrics.get("history", [])]
    return out
