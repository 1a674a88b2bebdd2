"""Experiment tracking: W&B (offline unless an API key is configured) and final-result tables."""

from __future__ import annotations

import os

from lightning.pytorch.loggers import Logger, WandbLogger


def wandb(project: str, group: str | None = None, tags: list[str] | None = None, save_dir: str = ".",
          offline: bool | None = None, log_model: bool = False, name: str | None = None) -> WandbLogger:
    """Lightning's WandbLogger; `offline=None` means offline unless WANDB_API_KEY is set (or
    WANDB_MODE says otherwise). Offline runs land in `<run dir>/wandb/offline-run-*`:
    upload them later with `wandb sync <run dir>/wandb/offline-run-*`."""
    if offline is None:
        offline = os.environ.get("WANDB_MODE", "") in ("offline", "disabled") or not os.environ.get("WANDB_API_KEY")
    return WandbLogger(project=project, group=group, tags=list(tags or []), save_dir=save_dir, offline=offline,
                       log_model=log_model, name=name)


def log_final(logger: Logger | None, result: dict) -> None:
    """Final metrics as summary values, and (W&B) the metrics and diagnostics as tables."""
    if not isinstance(logger, WandbLogger):
        return
    scalars = {k: v for k, v in result.items() if isinstance(v, (int, float))}
    run = logger.experiment
    run.summary.update(scalars)
    import wandb as wb

    rows = [[k, float(v)] for k, v in scalars.items() if k.startswith(("test/", "val/"))]
    run.log({"final_metrics": wb.Table(columns=["metric", "value"], data=rows)})
    prefix = sorted((k for k in scalars if k.startswith("test/prefix_recall@")), key=lambda k: int(k.split("@")[1]))
    if prefix:
        run.log({"prefix_recall": wb.Table(columns=["step", "recall"],
                                           data=[[int(k.split("@")[1]), scalars[k]] for k in prefix])})


def close_wandb(exit_code: int = 0) -> None:
    """Finish a W&B run left open (by a failed job), if W&B was used at all."""
    import sys

    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish(exit_code=exit_code)
