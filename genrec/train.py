"""Train and evaluate one configuration (or a `-m` grid of them).

    python -m genrec.train backbone=tiger objective=apao dataset=office
    python -m genrec.train resume=true        # continue the latest matching run from last.ckpt

Lightning's Trainer is `trainer.lightning` (conf/trainer/) instantiated with the logger (conf/logger/)
and the callbacks (conf/callbacks/): `build_trainer`.

The run dir holds the resolved `config.yaml`, `checkpoints/{last,best}.ckpt`, the
logger's files, `metrics.json` (final test metrics, best validation metrics, epochs,
wall time) and `test_ranks.csv` (each test user's rank): everything `genrec.report` needs.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import io
import json
import os
import resource
import sys
import time
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from genrec.callbacks import Checkpoints, best_of
from genrec.cli import check_command_line
from genrec.config_check import check, exit_if_invalid, forget_run_dir, refuse
from genrec.data.datamodule import SeqDataModule
from genrec.data.readers.common import DataError
from genrec.eval.metrics import is_loss
from genrec.lit import GenRec, NonFiniteLoss
from genrec.loggers import close_wandb, forget_wandb_run, log_final
from genrec.malloc import keep_freed_memory
from genrec.memory import Estimate, check as check_memory
from genrec.prepare import prepare
from genrec.runs import (RunDirInUse, checkpoint_path, claim, config_changes, held_elsewhere, release_claims,
                         run_config, write_json, write_text)

CONF = Path(__file__).resolve().parent.parent / "conf"
VOLATILE = ("resume", "run_dir")  # config keys that may differ between a run and its resumption
# rank 0's resume choice ("": none) for the DDP processes Lightning starts by running this command again: their
# own search would not see the run dir rank 0 now holds (`held_elsewhere`), and ranks resuming different runs hang
RESUME_CHOICE = "GENREC_RESUME_DIR"


def keep_logged_rows(logger, epoch: int) -> None:
    """CSV logger on a resumed run: keep the rows logged up to the end of `epoch` (the
    checkpoint's; -1 for a fresh start), drop the later ones, which the run logs again, and
    any row a kill cut short. The file is replaced atomically; Lightning then appends to it."""
    if not isinstance(logger, CSVLogger):
        return
    path = Path(logger.log_dir) / "metrics.csv"
    old = path.with_name("metrics.csv.resumed")  # the untrimmed rows until the trimmed file is in place
    if path.exists():
        os.replace(path, old)
    rows, header = [], []
    if old.exists():
        with open(old, newline="") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            rows = [r for r in reader if None not in r.values() and r["epoch"].isdigit() and int(r["epoch"]) <= epoch]
    writer = logger.experiment  # created now, with no metrics.csv to find (Lightning >= 2.5 deletes it)
    if rows:
        text = io.StringIO()
        out = csv.DictWriter(text, fieldnames=header)
        out.writeheader()
        out.writerows(rows)
        write_text(path, text.getvalue())
        writer.metrics_keys = header
    old.unlink(missing_ok=True)


def _comparable(cfg: DictConfig | dict) -> dict:
    c = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else dict(cfg)
    return {k: v for k, v in c.items() if k not in VOLATILE and k != "hydra"}


def last_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a run dir continues from: its own last.ckpt, else a two-stage run's stage 1's (killed before
    stage 2 began); None if neither exists."""
    return next((p for p in (run_dir / s / "checkpoints" / "last.ckpt" for s in (".", "stage1")) if p.exists()), None)


def started(run_dir: Path) -> bool:
    """Whether a run has begun training in this dir (its config.yaml, or its stage 1's, is written)."""
    return any((run_dir / s / "config.yaml").exists() for s in (".", "stage1"))


def find_resume_dir(cfg: DictConfig) -> Path | None:
    """The run dir to continue: `resume=<run dir or ckpt>`, or with `resume=true` this run dir if a run started
    in it (from its last.ckpt, or stage 1's, else over), else the newest sibling run with the same config and a
    last.ckpt that no live process holds. A DDP run's other processes continue what rank 0 chose."""
    if cfg.resume in (False, None, "false"):
        return None
    if rank_zero_only.rank > 0 and RESUME_CHOICE in os.environ:  # a DDP process that rank 0 started: its choice
        return Path(os.environ[RESUME_CHOICE]) if os.environ[RESUME_CHOICE] else None
    here = Path(cfg.run_dir)
    if cfg.resume not in (True, "true"):
        path = Path(str(cfg.resume))
        path = path.parent.parent if path.suffix == ".ckpt" else path
        if last_checkpoint(path) is None:
            raise DataError(f"resume={cfg.resume}: no checkpoints/last.ckpt under {path}")
        return path
    if started(here):  # with no checkpoint yet it starts over, in place
        return here
    want = _comparable(cfg)
    # a live run is not to resume; ranks > 0 that a cluster's launcher started (not rank 0) do not ask: rank 0 may
    # hold theirs already
    runs = [(c.stat().st_mtime, d) for d in (here.parent.iterdir() if here.parent.is_dir() else [])
            if d != here and (c := last_checkpoint(d)) and (rank_zero_only.rank > 0 or not held_elsewhere(d))]
    for _, run in sorted(runs, reverse=True):
        saved = run / ".hydra" / "config.yaml"
        if saved.exists() and _comparable(OmegaConf.load(saved)) == want:
            return run
    print(f"resume=true: no earlier run with this config under {here.parent}; starting fresh")
    return None


def compose_objective(name: str) -> DictConfig:
    """conf/objective/<name>.yaml as Hydra composes it (unresolved: its interpolations resolve in the run)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside the Hydra app
        return compose("config", overrides=[f"objective={name}"]).objective
    with initialize_config_dir(str(CONF), version_base="1.3"):  # run() called directly
        return compose_objective(name)


def stage1_config(cfg: DictConfig) -> DictConfig:
    """Stage 1 of a two-stage run: this config with `objective=<stage1>` (the run's evaluator), trained into
    <run dir>/stage1 and logged there to CSV; continued from its last.ckpt if it has one."""
    stage1 = Path(cfg.run_dir) / "stage1"
    first = cfg.copy()
    with open_dict(first):
        first.objective = compose_objective(cfg.stage1)
        first.stage1 = None
        first.run_dir, first.resume = str(stage1), (stage1 / "checkpoints" / "last.ckpt").exists()
        first.logger = {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": str(stage1), "name": "logs",
                        "version": ""}
    return first


class NotYours(DataError):
    """The run dir belongs to another run (another config, a finished run, a live process): nothing in it is
    touched, not even failed.json."""


class ResumeMismatch(NotYours):
    """The run dir holds a run of another config."""


def check_resumable(cfg: DictConfig, run_dir: Path) -> None:
    """A run continues only with the config it ran (`genrec.runs.config_changes`): one line naming what differs,
    before any compute, else the checkpoint would go on under another recipe and its record would say the new one.
    A two-stage run killed in stage 1 is checked on stage 1's config."""
    saved, now = run_dir / "config.yaml", cfg.copy()
    if not saved.exists() and (run_dir / "stage1" / "config.yaml").exists():
        if not cfg.get("stage1"):
            raise ResumeMismatch(f"resume: {run_dir} is a two-stage run killed in stage 1, this config has no "
                                 f"stage 1; resume it with its own overrides ({run_dir / 'overrides.yaml'}) or start "
                                 f"a new run dir")
        saved, now = run_dir / "stage1" / "config.yaml", stage1_config(cfg)
    if not saved.exists():
        return
    if cfg.get("stage1") and saved.parent == run_dir:  # stage 2 starts from stage 1's run, set once it is trained
        with open_dict(now):
            now.init_from = str(run_dir / "stage1")
    if changes := config_changes(saved, now):
        ran = run_dir / "overrides.yaml"  # runs from before it was written: config.yaml says what they ran
        command = ran if ran.exists() else run_dir / "config.yaml"
        raise ResumeMismatch(f"resume: {run_dir} ran another config ({len(changes)} differ: {'; '.join(changes[:4])}"
                        f"{' ...' if len(changes) > 4 else ''}); resume it with its own overrides "
                        f"({command}) or start a new run dir")


def take_run_dir(run_dir: Path, fresh: bool) -> None:
    """Claim the run dir for this process (`genrec.runs.claim`); a fresh run never writes into another run's dir."""
    try:
        claim(run_dir)
    except RunDirInUse as e:
        raise NotYours(str(e)) from None
    if fresh and started(run_dir):
        raise NotYours(f"{run_dir} holds another run; resume=true continues it, a new run needs another dir "
                       f"(hydra.run.dir=...)")


def forget_hydra_dir(cfg: DictConfig) -> None:
    """The dir Hydra made for this start, when the run went on in another one (resume=true found it): removed
    if it holds only Hydra's files, so that no report lists it."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized() and Path(HydraConfig.get().runtime.output_dir).resolve() != \
            Path(cfg.run_dir).resolve():
        forget_run_dir()


def record_command(run_dir: Path, fresh: bool) -> None:
    """<run dir>/overrides.yaml: the command-line overrides of the run's first start, which rerun it (the report's
    rerun lines, results_office.sh). Hydra rewrites .hydra/overrides.yaml on every start, a refused one included."""
    from hydra.core.hydra_config import HydraConfig

    path = run_dir / "overrides.yaml"
    if rank_zero_only.rank == 0 and HydraConfig.initialized() and (fresh or not path.exists()):
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(path, OmegaConf.to_yaml(OmegaConf.create(list(HydraConfig.get().overrides.task))))


def check_init_from(cfg: DictConfig) -> None:
    """`init_from` names a checkpoint of this run's backbone (a model of another family cannot start this one);
    weights of other shapes (another tokenizer or catalogue) are refused once the model is built (GenRec)."""
    try:
        ckpt = checkpoint_path(cfg.init_from)
    except FileNotFoundError as e:
        raise DataError(f"init_from={cfg.init_from}: {e}") from None
    saved = ckpt.parent.parent / "config.yaml"
    was = run_config(saved).backbone.get("_target_") if ckpt.parent.name == "checkpoints" and saved.exists() else None
    if was is not None and was != cfg.backbone.get("_target_"):
        raise DataError(f"init_from={cfg.init_from}: a {was} run; this run's backbone is {cfg.backbone._target_}")


def run(cfg: DictConfig) -> dict:
    """Train and test `cfg`; with `stage1` (an objective name, e.g. objective=sdpo_2stage) a pipeline:
    stage 1 trains that objective into <run dir>/stage1 (skipped once its metrics.json exists),
    then this config starts from stage 1's checkpoint (`init_from`). The run dir is held while it runs."""
    try:
        return _run(cfg)
    finally:
        release_claims()  # the next job of a sweep, or an in-process caller's next run, claims its own


def _run(cfg: DictConfig) -> dict:
    start = time.time()
    check(cfg, trainer=True)
    resume_dir = find_resume_dir(cfg)
    if rank_zero_only.rank == 0:
        os.environ[RESUME_CHOICE] = str(resume_dir or "")
    if resume_dir is not None:
        with open_dict(cfg):
            cfg.run_dir = str(resume_dir)
        check_resumable(cfg, resume_dir)  # read only: a refused resume leaves every file as it was
    if rank_zero_only.rank == 0:  # a DDP run's other processes run inside the launching one's claim
        take_run_dir(Path(cfg.run_dir), fresh=resume_dir is None)
        forget_hydra_dir(cfg)
    record_command(Path(cfg.run_dir), fresh=resume_dir is None)
    if resume_dir is not None and (resume_dir / "metrics.json").exists():  # its test ran: results stay as written
        print(f"resume: {resume_dir} has finished (metrics.json); nothing to resume (a new run: another run dir or "
              f"no resume=true)")
        return json.loads((resume_dir / "metrics.json").read_text())
    if cfg.get("init_from"):  # before any compute
        check_init_from(cfg)
    if cfg.get("stage1"):
        first = stage1_config(cfg)
        if not (Path(first.run_dir) / "metrics.json").exists():
            train(first, time.time(), Path(first.run_dir) if first.resume else None, objective_name=cfg.stage1)
        with open_dict(cfg):
            cfg.init_from = first.run_dir
    result = train(cfg, start, resume_dir)
    if rank_zero_only.rank == 0:
        forget_hydra_dir(cfg)  # what a resumed DDP run's other processes logged into it since
    return result


def train(cfg: DictConfig, start: float, resume_dir: Path | None, objective_name: str | None = None) -> dict:
    """One stage: fit, test on the best checkpoint, write the run dir."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.trainer.keep_freed_memory:
        keep_freed_memory()
    if cfg.trainer.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    t = cfg.trainer
    data = prepare(cfg, log=lambda m: print(m, file=sys.stderr))
    dm = SeqDataModule(data.seq, data.sids, cfg.dataset.max_history, t.batch_size, t.eval_batch_size, cfg.seed,
                       t.num_workers, t.pin_memory, t.val_users, t.length_window)
    module = GenRec(cfg, data.sids, dm.item_counts())  # LR schedule length: from the Trainer (world size)
    module.clock = (start, 0.0)  # validation points' wall seconds count from this process's start
    estimate = None  # the launching process's memory check, before it starts any other (genrec/memory.py)
    if t.memory_check and rank_zero_only.rank == 0:
        estimate = check_memory(cfg, module, dm.splits["train"])
    if resume_dir is None and rank_zero_only.rank == 0:
        forget_wandb_run(run_dir)  # a fresh run in a reused dir is a new W&B run

    trainer = build_trainer(cfg, run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    resume_from = last if resume_dir is not None and last.exists() else None
    if trainer.is_global_zero:
        write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        epoch = torch.load(last, map_location="cpu", mmap=True, weights_only=False)["epoch"] if resume_from else -1
        if resume_from:
            print(f"resume: continuing {run_dir} after epoch {epoch} (checkpoints/last.ckpt)", flush=True)
        keep_logged_rows(trainer.logger, epoch)
        hparams = OmegaConf.to_container(cfg, resolve=True)
        if (command := run_dir / "overrides.yaml").exists():  # the run's command line: W&B keeps it beside the config
            hparams["command"] = OmegaConf.to_container(OmegaConf.load(command))
        trainer.logger.log_hyperparams(hparams)
    trainer.fit(module, dm, ckpt_path=str(resume_from) if resume_from else None)
    history = list(module.history)
    ckpt = next(c for c in trainer.callbacks if isinstance(c, Checkpoints))
    best = ckpt.best_model_path or str(last)
    trainer.test(module, dm, ckpt_path=best, verbose=False)
    best_epoch = best_of(history, t.monitor, t.monitor_mode)
    result = {
        **{f"test/{k}": v for k, v in module.last_metrics["test"].items()},
        **({f"val/{k}": v for k, v in next(h for h in history if h["epoch"] == best_epoch).items()
            if k not in ("epoch", "seconds")}
           if best_epoch is not None else {}),
        "best_epoch": best_epoch, "epochs": trainer.current_epoch,
        **cost(module, trainer, estimate),
        "dataset": cfg.dataset.name, "backbone": _choice(cfg, "backbone"), "objective": objective_name or _choice(cfg, "objective"),
        "seed": cfg.seed, "eval_score": module.evaluator.score, "eval_temperature": module.evaluator.temperature,
        "checkpoint": best, "history": history,
    }
    if trainer.is_global_zero:
        write_json(run_dir / "metrics.json", result)
        module.write_ranks(run_dir / "test_ranks.csv", dm.splits["test"])
        (run_dir / "failed.json").unlink(missing_ok=True)  # a resumed run that once failed
        log_final(trainer.logger, result)
        print_summary(result, data.summary)
    if trainer.logger is not None:
        trainer.logger.finalize("success")
    close_wandb(exit_code=0)  # this job's run; the next job of a sweep starts its own
    return result


def cost(module: GenRec, trainer: L.Trainer, estimate: Estimate | None = None) -> dict:
    """Wall seconds (all of a resumed run's processes, data stage and test included), of which training
    epochs, and peak resident memory of the largest process (GPU: peak allocated, too), beside the estimate per
    process that the memory check made before training (genrec/memory.py)."""
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB -> GiB (Linux)
                         torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0])
    peak = trainer.strategy.reduce(peak.to(module.device), reduce_op="max").cpu()
    train = None if module.train_seconds is None else round(module.train_seconds, 1)
    return {"seconds": round(module.elapsed(), 1), "train_seconds": train,
            "peak_rss_gb": round(float(peak[0]), 2), **({"peak_gpu_gb": round(float(peak[1]), 2)} if peak[1] else {}),
            **({"memory_estimate_gb": round(estimate.per_process / 2**30, 2)} if estimate else {}),
            "processes": trainer.world_size}


def build_trainer(cfg: DictConfig, run_dir: Path) -> L.Trainer:
    """`trainer.lightning` (conf/trainer/) with the logger (conf/logger/), the callbacks (conf/callbacks/, in
    their config order) and the run dir: every argument of Lightning's Trainer is in the config."""
    callbacks = [instantiate(c) for c in cfg.callbacks.values()]
    return instantiate(cfg.trainer.lightning, logger=instantiate(cfg.logger), callbacks=callbacks,
                       default_root_dir=str(run_dir))


def _choice(cfg: DictConfig, group: str) -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices[group]
    except Exception:  # outside a Hydra app (tests calling run() directly)
        return cfg[group]["_target_"].rsplit(".", 1)[-1].lower()


def print_summary(r: dict, data: dict) -> None:
    keys = [k[len("test/"):] for k in r if k.startswith(("test/recall@", "test/ndcg@"))]
    keys = sorted(keys, key=lambda k: (int(k.split("@")[1]), k))
    b = r["best_epoch"]  # counted from 0 (metrics.json, the history); the progress lines count from 1
    best = "none" if b is None else f"{b + 1}/{r['epochs']} (best_epoch {b} in metrics.json, from 0)"
    lines = [
        "",
        f"== genrec: {r['dataset']} · {r['backbone']} · {r['objective']} · seed {r['seed']} ==",
        f"data      {data['users']} users, {data['items']} items, {data['interactions']} interactions, T={data['levels']}",
        f"training  {r['epochs']} epochs, best epoch {best}, wall time {r['seconds']:.1f}s",
        "metric        " + "".join(f"{k:>11}" for k in keys),
        *(["valid (best)  " + "".join(f"{r['val/' + k]:>11.4f}" for k in keys)] if all(f"val/{k}" in r for k in keys)
          else [f"valid (best)  {t}: {r[t]:.4f}" for t in r if t.startswith("val/") and is_loss(t)]),
        "test          " + "".join(f"{r.get('test/' + k, float('nan')):>11.4f}" for k in keys),
    ]
    prefix = [f"{r[k]:.3f}" for k in sorted(r) if k.startswith("test/prefix_recall@")]
    if prefix:
        lines.append("test prefix recall per step: " + ", ".join(prefix))
    lines.append(f"checkpoint {r['checkpoint']}")
    print("\n".join(lines))


# What a process of a distributed run sees when another one of it died (e.g. killed by the kernel for memory).
LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def lost_peer_hint(e: BaseException) -> str | None:
    """One line for an error that only says a peer vanished: its cause is in another process, not this one."""
    if not (isinstance(e, RuntimeError) and any(s in str(e) for s in LOST_PEER)):
        return None
    return ("another process of this run died first (an out-of-memory kill leaves only this message: `dmesg | grep "
            "-i oom`); the same command with resume=true continues from the last epoch's checkpoint, also with memory "
            "options changed (backbone.memory, backbone.memory_under_autocast); a smaller trainer.batch_size is a new run")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if not sweep:  # a sweep's jobs: checked up front (grids) or by run(), failing only that job
        exit_if_invalid(cfg, trainer=True)
    try:
        result = run(cfg)
    except BaseException as e:
        close_wandb(exit_code=1)  # else the next sweep job in this process would log into this run
        if isinstance(e, NotYours) and not sweep:  # another run's dir: left as it is
            forget_hydra_dir(cfg)
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        if isinstance(e, DataError) and not sweep and not (Path(cfg.run_dir) / "checkpoints").exists():
            refuse(e)  # bad input before any training (data file, init_from, resume dir): one line, no run dir left
        # Recorded in the run dir (the report shows the cell as failed); in a sweep the
        # exception goes to Hydra, which runs the remaining jobs before it reports failures.
        if not isinstance(e, NotYours) and not held_elsewhere(Path(cfg.run_dir)):
            Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
            record = {"error": f"{type(e).__name__}: {e}"}
            if hint := lost_peer_hint(e):
                record["hint"] = hint
                print(f"error: {hint}", file=sys.stderr)
            write_json(Path(cfg.run_dir) / "failed.json", record)
        if isinstance(e, (DataError, NonFiniteLoss)) and not sweep:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        raise
    # What Optuna sweeps optimise: the monitored VALIDATION value at the best epoch (never test: leakage);
    # its direction is trainer.monitor_mode.
    return result.get(cfg.trainer.monitor)


def release_process_group() -> None:
    """Destroy the DDP process group while the interpreter is whole (at exit: `atexit` below), as PyTorch asks of
    every process. Lightning does it only for NCCL; a gloo group is otherwise torn down during interpreter shutdown,
    where its worker threads may still hold tensors that need the interpreter (pytorch/pytorch#179291)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        with contextlib.suppress(Exception):  # a group in an error state: exit with the run's own status
            torch.distributed.destroy_process_group()


atexit.register(release_process_group)  # every way this process ends, also under other Hydra launchers

if __name__ == "__main__":
    check_command_line("config")  # an override that does not compose: one line, exit 2
    torch.set_float32_matmul_precision("high")
    main()
