"""Runs from a W&B project: `python -m genrec.report runs=[wandb:<entity>/<project>[/<group>]]`.

Each training run of the project (of the group: a `-m` sweep's dir name) is written as a run dir,
`<out>/wandb_runs/<i>/<run id>/` (i: the source's place in `runs`): config.yaml (the flat config genrec
logs, `objective.beta`, ..., nested again), overrides.yaml (its command line, logged as `command`: an older
run's config is completed with the keys added since, as a run dir's is) and metrics.json (its summary's
numbers: the final metrics, beside the last logged values) or failed.json (a failed or crashed run; a running
one has neither). The report then reads them like any other run dir. What only run dirs hold, per-user ranks
(paired tests), re-evaluations (pruning rates) and validation curves, is not on W&B.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from genrec.runs import write_json, write_text

PREFIX = "wandb:"
FAILED = ("failed", "crashed", "killed")


def unflatten(flat: dict[str, Any]) -> dict:
    """{"objective.beta": 1} -> {"objective": {"beta": 1}} (the inverse of genrec.loggers.flat)."""
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def parts(source: str) -> list[str]:
    """[entity, project(, group)] of a wandb: source; ValueError when it is not one."""
    found = source[len(PREFIX):].strip("/").split("/")
    if len(found) not in (2, 3) or not all(found):
        raise ValueError(f"runs={source}: expected wandb:<entity>/<project>[/<group>]")
    return found


def fetch(source: str, dest: Path, api: Any = None) -> Path:
    """The training runs of `source` (wandb:<entity>/<project>[/<group>]) as run dirs under `dest` (replaced);
    returns `dest`. ValueError for a malformed source; `api`: a `wandb.Api()` (tests pass their own)."""
    where = parts(source)
    try:
        if api is None:
            import wandb

            api = wandb.Api()
        runs = list(api.runs("/".join(where[:2]), filters={"group": where[2]} if len(where) == 3 else None))
    except Exception as e:  # no key, no network, no such project: W&B's own message
        raise ValueError(f"runs={source}: W&B: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    shutil.rmtree(dest, ignore_errors=True)
    for run in runs:
        cfg = unflatten({k: v for k, v in run.config.items() if not k.startswith("_")})
        if run.job_type == "report" or not all(isinstance(cfg.get(k), dict) for k in ("dataset", "backbone",
                                                                                     "objective")):
            continue  # genrec.report's own runs, other code's runs
        d = dest / run.id
        d.mkdir(parents=True)
        if isinstance(command := cfg.pop("command", None), list):  # its overrides (genrec.train logs them)
            write_text(d / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(command)))
        write_text(d / "config.yaml", OmegaConf.to_yaml(cfg))
        summary = {k: v for k, v in run.summary_metrics.items()
                   if not k.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if run.state == "finished":
            write_json(d / "metrics.json", summary)
        elif run.state in FAILED:
            write_json(d / "failed.json", {"error": f"W&B run {run.id}: {run.state}"})
    return dest


def run_group(source: str) -> str | None:
    """The W&B group of a runs= entry: a sweep dir's name, or a wandb: source's group (None: a whole project)."""
    if source.startswith(PREFIX):
        where = parts(source)
        return where[2] if len(where) == 3 else None
    return Path(source).name


def resolve(runs: list[str], out: Path, api: Any = None) -> list[str]:
    """`runs` with each wandb: source replaced by the run dirs it is fetched into (<out>/wandb_runs/<i>)."""
    return [str(fetch(r, out / "wandb_runs" / str(i), api)) if r.startswith(PREFIX) else r for i, r in enumerate(runs)]
