"""Experiment tracking: W&B (offline unless an API key is configured and the server answers) and final-result tables.

Every job owns one W&B run: a sweep's jobs share a process, so a job's run is finished when the job
ends (`close_wandb`, exit code 0 or 1) and a new logger never adopts a run left open. Runs carry a
flat config (`objective.beta`, ...) and are grouped by sweep, with job type `<dataset>/<backbone>/<objective>`.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse
from typing import Any

from lightning.pytorch.loggers import Logger, WandbLogger


def _host() -> tuple[str, int]:
    """(host, port) of the W&B server (WANDB_BASE_URL, default https://api.wandb.ai)."""
    url = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    return url.hostname or "api.wandb.ai", url.port or (80 if url.scheme == "http" else 443)


def _has_key(host: str) -> bool:
    """An API key in WANDB_API_KEY or, as `wandb login` writes it, in ~/.netrc (or $NETRC) for the host. The file
    is read as text: Python's netrc refuses a group-readable file that W&B itself reads."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        words = Path(os.environ.get("NETRC") or Path.home() / ".netrc").read_text().split()
    except OSError:
        return False
    entries = " ".join(words).split("machine ")
    return any(e.split()[:1] == [host] and "password" in e.split() for e in entries)


PROBE_SECONDS = 3.0


def _reachable(host: str, port: int) -> bool:
    """The server accepts a connection within PROBE_SECONDS, name lookup included (a thread: getaddrinfo has no
    timeout of its own). Behind a proxy (HTTPS_PROXY, ...) W&B connects through it: assumed reachable."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return True
    answered: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
            answered.append(True)
        except OSError:
            pass

    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(PROBE_SECONDS)
    return bool(answered)


def _offline(offline: bool | None) -> bool:
    """`None`: offline where WANDB_MODE says offline/disabled, where no API key is configured, or where the W&B
    server does not answer (a compute node without network: one line says so, the run logs offline)."""
    if offline is not None:
        return offline
    if os.environ.get("WANDB_MODE", "") in ("offline", "disabled"):
        return True
    host, port = _host()
    if not _has_key(host):
        return True
    if not _reachable(host, port):
        print(f"W&B: {host}:{port} did not answer within {PROBE_SECONDS:g} s: logging offline (upload later: "
              f"wandb sync <run dir>/wandb/offline-run-*)", file=sys.stderr)
        return True
    return False


def flat(d: dict, prefix: str = "") -> dict:
    """{"objective": {"beta": 1}} -> {"objective.beta": 1}: W&B's parallel-coordinates and sweep
    views need one column per setting."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def sweep_group() -> str | None:
    """The sweep a `-m` job belongs to: its sweep dir's name; None for a single run or outside Hydra."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(HydraConfig.get().sweep.dir).name


class JobWandbLogger(WandbLogger):
    """Lightning's WandbLogger that starts its own run and logs the config flat."""

    @property
    def experiment(self):
        import wandb as wb

        if self._experiment is None and wb.run is not None:
            wb.finish(exit_code=1)  # left open by an earlier job of this process that never finished it
        return super().experiment

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        super().log_hyperparams(flat(dict(params)))


def run_id(save_dir: str) -> str:
    """This run dir's W&B id, kept in `<run dir>/wandb/run_id` (created once, atomically), so that a job
    resumed after a kill continues its W&B run instead of starting another."""
    import secrets

    path = Path(save_dir) / "wandb" / "run_id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"run_id.tmp{os.getpid()}")
        tmp.write_text(secrets.token_hex(4))
        try:
            os.link(tmp, path)  # the first process (DDP rank) to get here decides
        except FileExistsError:
            pass
        tmp.unlink()
    return path.read_text().strip()


def forget_wandb_run(save_dir: str | Path) -> None:
    """Drop the run dir's W&B id: the next logger starts a new W&B run (a fresh run in a reused dir)."""
    (Path(save_dir) / "wandb" / "run_id").unlink(missing_ok=True)


def wandb(project: str, group: str | None = None, job_type: str | None = None, tags: list[str] | None = None,
          experiment: str | None = None, save_dir: str = ".", offline: bool | None = None, log_model: bool = False,
          name: str | None = None) -> WandbLogger:
    """One W&B run for this job. `group=None`: the sweep (`sweep_group`); `tags` plus the experiment
    preset's name; `name=None`: the run dir's name. A resumed job continues its run (`run_id`). Offline
    runs land in `<run dir>/wandb/offline-run-*` (one per process of a resumed job, same id): upload them
    later with `wandb sync <run dir>/wandb/offline-run-*`."""
    tags = list(tags or []) + ([experiment] if experiment and experiment not in (tags or []) else [])
    return JobWandbLogger(project=project, group=group or sweep_group(), job_type=job_type, tags=tags,
                          save_dir=save_dir, offline=_offline(offline), log_model=log_model,
                          name=name or Path(save_dir).name, id=run_id(save_dir), resume="allow")


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
    """Finish this job's W&B run (exit code 0: success, 1: failed), if W&B was used at all;
    the next job of a sweep then starts its own."""
    import sys

    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish(exit_code=exit_code)


def log_report(out: Path, summary: dict, project: str, group: str | None = None, offline: bool | None = None) -> str:
    """The report in `out` (genrec.report's table.csv, cells.csv and PNGs) as one W&B run of job type
    `report`: `paper_table` (Table-1 layout as shown: mean ± std (gain over the baseline)), `paper_cells`
    (one numeric row per cell, for W&B's own charts) and each plot as an image. Returns the run's folder."""
    import csv

    import wandb as wb

    def table(name: str, numeric: bool = False) -> wb.Table:
        with (out / name).open(newline="") as f:
            head, *rows = list(csv.reader(f))
        return wb.Table(columns=head, data=[[_number(x) for x in r] if numeric else r for r in rows])

    config = {k: summary[k] for k in ("split", "metrics", "baseline")}
    with wb.init(project=project, job_type="report", group=group, name=f"report-{out.name}", dir=str(out),
                 config=config, mode="offline" if _offline(offline) else "online") as run:
        run.log({"paper_table": table("table.csv"), "paper_cells": table("cells.csv", numeric=True),
                 **{f"plots/{Path(p).stem}": wb.Image(str(out / p)) for p in summary["files"] if p.endswith(".png")}})
        run.summary.update({f"runs/{k}": v for k, v in summary["runs"].items()})
        return str(Path(run.dir).parent)


def _number(x: str) -> float | str | None:
    try:
        return float(x)
    except ValueError:
        return x or None
