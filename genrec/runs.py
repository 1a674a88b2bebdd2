"""Files of a run dir (and of the data cache), written atomically: a crash or kill -9 never leaves a
half-written config.yaml, metrics.json, failed.json or cache index that a report or a resume would trust.
A run's config as today's genrec reads it, and its checkpoint: where it is, and its model (backbone) weights."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

# Modules that moved, for the `_target_`s of configs written before: old prefix -> today's.
MOVED = {"genrec.data.sid.": "genrec.sid.tokenizers."}
# Keys added since runs were first written, at the value that reproduces what genrec did before them (a
# preset may set another value today: a run that predates the key never ran it).
ADDED = {"optim.cooldown": 1.0, "optim.eps": 1e-8, "trainer.validate": "beam",
         "protocol.micro_batches": None}  # office_cpu counts the release's since 2026-12-05
# Keys that say where, on what and under which name a run executes, or how it saves memory, not what it computes
# (the same losses and metrics: tests/test_pinned_metrics.py): a resumed run may change them.
EXECUTION = ("run_dir", "resume", "data_dir", "tags", "logger", "hydra",
             "trainer.accelerator", "trainer.devices", "trainer.num_nodes", "trainer.strategy", "trainer.num_workers",
             "trainer.progress_bar", "trainer.eval_batch_size", "embedder.device", "eval.full_rank", "eval.chunk",
             "dataset.root", "dataset.reader.root", "tokenizer.path",
             # the same hardware keys as the Trainer receives them (trainer.lightning: interpolations of the above)
             "trainer.lightning.accelerator", "trainer.lightning.devices", "trainer.lightning.num_nodes",
             "trainer.lightning.strategy", "trainer.lightning.enable_progress_bar",
             "backbone.memory", "backbone.memory_users", "backbone.memory_under_autocast", "backbone.lean_users",
             "backbone.lean_under_autocast", "trainer.keep_freed_memory", "trainer.memory_check",
             "trainer.pin_memory", "callbacks.epoch_log",
             "trainer.validate")  # what validation logs beside the monitored loss (config_check), not the model


class RunDirInUse(RuntimeError):
    """Another live process holds the run dir (`claim`)."""


_CLAIMS: dict = {}  # run dir -> its open lock file, for the run dirs this process holds (released when it exits)


def _lock(f) -> bool | None:
    """flock the open file `f` exclusively, without waiting: True (this process holds it now), False (another
    process does), None (no flock on this file system, e.g. some network mounts)."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def claim(run_dir: Path) -> None:
    """Hold `<run dir>/.lock` for the rest of this process's life (the kernel releases it however the process
    ends, kill -9 included), so that no second process trains into the same dir at the same time: two runs given
    one dir, or a resume of a run that is still running. Raises RunDirInUse naming the holder's pid. On a file
    system without flock, runs go unguarded, as before."""
    if run_dir.resolve() in _CLAIMS:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    f = open(run_dir / ".lock", "a+")
    got = _lock(f)
    if not got:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        if got is False:
            raise RunDirInUse(f"{run_dir} is in use by another run (pid {holder}); wait for it to end, or give this "
                              f"run another dir (hydra.run.dir=...)")
        return
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    _CLAIMS[run_dir.resolve()] = f


def held_elsewhere(run_dir: Path) -> bool:
    """Whether another live process holds the run dir (`claim`)."""
    if run_dir.resolve() in _CLAIMS or not (run_dir / ".lock").exists():
        return False
    with open(run_dir / ".lock", "a+") as f:  # closing it lets go of a lock taken here
        return _lock(f) is False


def release_claims() -> None:
    """Let go of every run dir this process claimed (the end of a sweep job: the next job of the sweep, run by
    the same process, claims its own)."""
    while _CLAIMS:
        _CLAIMS.popitem()[1].close()


def write_text(path: Path, text: str) -> None:
    """Write to a temp file beside `path`, then rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj: dict) -> None:
    write_text(path, json.dumps(obj, indent=1, default=float))


def moved_targets(cfg: dict | list) -> dict | list:
    """The config (a container) with every `_target_` under a moved module's old path renamed (MOVED)."""
    if isinstance(cfg, list):
        return [moved_targets(v) if isinstance(v, (dict, list)) else v for v in cfg]
    out = {k: moved_targets(v) if isinstance(v, (dict, list)) else v for k, v in cfg.items()}
    t = out.get("_target_")
    if isinstance(t, str):
        out["_target_"] = next((new + t[len(old):] for old, new in MOVED.items() if t.startswith(old)), t)
    return out


def with_added(cfg: dict) -> dict:
    """The keys of `ADDED` a config (a container) lacks, at the value that reproduces what genrec did before
    them (not what today's presets set)."""
    out = OmegaConf.create(cfg)
    for key, old in ADDED.items():
        if OmegaConf.select(out, key) is None:
            OmegaConf.update(out, key, old, force_add=True)
    return OmegaConf.to_container(out, resolve=False)


def flatten(d: dict, prefix: str = "") -> dict:
    """A nested config (a container) as {"dotted.key": value}; lists as tuples (hashable), {} as a value."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
    return out


def listed(key: str, keys: tuple[str, ...]) -> bool:
    """Whether dotted `key` is one of `keys` or lies under one of them."""
    return any(key == k or key.startswith(k + ".") for k in keys)


def state_per_micro_batch(objective: dict | None) -> str | None:
    """What an objective config (a container) sets once per micro-batch (`Objective.state_per_micro_batch`);
    None if nothing, or if its `_target_` cannot be imported (instantiating it names that)."""
    try:
        cls = get_class(str((objective or {}).get("_target_")))
    except (ImportError, AttributeError, ValueError):
        return None
    return cls.state_per_micro_batch(objective) if hasattr(cls, "state_per_micro_batch") else None


def defining(flat: dict, objective: dict | None) -> dict:
    """A flattened config without `protocol.micro_batches` when the run's objective keeps no state or weights it
    sets once per micro-batch: a reproduced recipe's count then changes nothing it computes."""
    if "protocol.micro_batches" not in flat or state_per_micro_batch(objective):
        return flat
    return {k: v for k, v in flat.items() if k != "protocol.micro_batches"}


def config_changes(saved: Path, cfg: DictConfig) -> list[str]:
    """'key: saved -> now' for every key both the run dir's `saved` config.yaml and `cfg` hold with different
    values, outside EXECUTION (keys added or dropped since the run was written are not compared; paths inside
    the run dir compare relative to it)."""
    old = with_added(moved_targets(OmegaConf.to_container(OmegaConf.load(saved))))
    now = OmegaConf.to_container(cfg, resolve=True)
    old, now = (defining(flatten(c), c.get("objective")) for c in (old, now))
    here, there = str(now.get("run_dir")), str(old.get("run_dir"))  # paths inside the run dir, however it was named
    old = {k: v.replace(there, here) if isinstance(v, str) and there != "None" else v for k, v in old.items()}
    return [f"{k}: {old[k]!r} -> {now[k]!r}" for k in sorted(old.keys() & now.keys())
            if old[k] != now[k] and not listed(k, EXECUTION)]


def run_config(path: Path) -> DictConfig:
    """A run's config.yaml (written resolved) with moved modules' targets renamed."""
    return OmegaConf.create(moved_targets(OmegaConf.to_container(OmegaConf.load(path))))


def checkpoint_path(path: str | Path) -> Path:
    """A .ckpt file, or a run dir's checkpoints/best.ckpt falling back to last.ckpt."""
    path = Path(path)
    if path.is_dir():
        for name in ("best.ckpt", "last.ckpt"):
            if (path / "checkpoints" / name).is_file():
                return path / "checkpoints" / name
        summary = (path / "metrics.json").is_file() and not (path / "checkpoints").exists()
        raise FileNotFoundError(f"no checkpoints/best.ckpt or checkpoints/last.ckpt under {path}" + (
            " (a run summary, as committed: its weights are not kept; rerun it from its overrides.yaml)"
            if summary else ""))
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def load_backbone_state(path: str | Path) -> dict:
    """The backbone weights (keys `backbone.*`, prefix stripped) of a run's Lightning checkpoint
    (`checkpoint_path`): the model part only, never the objective's state."""
    path = checkpoint_path(path)
    # Our own training checkpoint (Lightning pickles hyper-parameters alongside the weights).
    state = torch.load(path, map_location="cpu", weights_only=False).get("state_dict", {})
    weights = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    if not weights:
        raise ValueError(f"{path} holds no backbone.* weights in its state_dict")
    return weights
