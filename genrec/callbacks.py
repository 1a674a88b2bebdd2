"""genrec's Lightning callbacks and checkpoint writer, configured in conf/callbacks/ and conf/trainer/
(`_target_`, built by genrec/train.py with `hydra.utils.instantiate`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping, EMAWeightAveraging, ModelCheckpoint
from lightning.pytorch.plugins import TorchCheckpointIO

from genrec.models.dropout import set_dropout


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to `.<name>.tmp` and renames it into place: a kill while writing
    leaves the previous last.ckpt / best.ckpt whole, never a half-written one."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        tmp = Path(path).with_name(f".{Path(path).name}.tmp")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        os.replace(tmp, path)


class Checkpoints(ModelCheckpoint):
    """best.ckpt as ModelCheckpoint keeps it, and last.ckpt at the end of every epoch, after
    validation (Lightning's `save_last` skips epochs that do not improve best.ckpt): a resumed
    run replays at most one epoch. Without `dirpath`: <run dir>/checkpoints (the Trainer's
    `default_root_dir`), so the config holds no run-specific path."""

    def setup(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.realpath(Path(trainer.default_root_dir) / "checkpoints")
        super().setup(trainer, module, stage)

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, module)
        trainer.save_checkpoint(Path(self.dirpath) / "last.ckpt", weights_only=False)  # the full state (resume)


class ResumableEarlyStopping(EarlyStopping):
    """Lightning does not checkpoint `trainer.should_stop`: without this, a run killed after it
    stopped early (e.g. during the final test) would train one more epoch when resumed."""

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.stopped_epoch:  # restored from last.ckpt
            trainer.should_stop = True


class ValidateLastEpoch(Callback):
    """Lightning validates after epoch e when (e + 1) % check_val_every_n_epoch == 0, so a max_epochs that is not a
    multiple of it would leave the last epochs (a cooldown's lowest learning rate) out of model selection: the
    last epoch is validated too."""

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.check_val_every_n_epoch and trainer.current_epoch == trainer.max_epochs - 1:
            trainer.check_val_every_n_epoch = 1


class LateDropout(Callback):
    """Late dropout (Liu et al. 2023, "Dropout Reduces Underfitting"): the backbone trains without dropout for its
    first `start_epoch` epochs (an underfitting model learns faster, and a step without masks is cheaper), then
    with rate p to the end. Set at each epoch's start from the epoch number, so a resumed run continues it."""

    def __init__(self, start_epoch: int, p: float) -> None:
        self.start_epoch, self.p = start_epoch, p

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        set_dropout(module.backbone, 0.0 if trainer.current_epoch < self.start_epoch else float(self.p))


class EMA(EMAWeightAveraging):
    """Lightning's exponential moving average of the weights: validation, the checkpoints' state_dict (so best.ckpt,
    the test and genrec.evaluate) see the average; training steps the raw weights, which checkpoints keep beside it
    for resume. Lightning's callback (2.6) also puts the raw weights back when `trainer.test(ckpt_path=...)` loads
    best.ckpt, so the run's test would score other weights than those selected: only fitting reloads them here."""

    def on_load_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict) -> None:
        if trainer.state.fn == "fit":
            super().on_load_checkpoint(trainer, module, checkpoint)


def best_of(history: list[dict], monitor: str, mode: str) -> int | None:
    """The epoch whose `monitor` (e.g. val/ndcg@10) is best under `mode` (max | min); the first on ties,
    as the checkpoint callback keeps it. Epochs without the value never win."""
    key, sign = monitor.split("/", 1)[1], 1 if mode == "max" else -1
    scored = [h for h in history if key in h and h[key] == h[key]]  # drop missing and NaN
    return max(scored, key=lambda h: sign * h[key])["epoch"] if scored else None


class EpochLog(Callback):
    """Without a progress bar (background runs, `trainer.progress_bar=false`) the launching process prints one line
    per epoch: its last training loss, its validation `metrics` and monitor if it validated (marked best by it),
    its minutes (validation included) and the minutes left at this process's mean epoch (at most, under early
    stopping), e.g. `epoch 12/42 · train/loss 1.5811 · val recall@10 0.0349 ndcg@10 0.0176 (best) · 2.3 min · ~69 min left`."""

    def __init__(self, metrics: list[str]) -> None:
        self.metrics, self.times, self.start = list(metrics), [], 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.start = time.time()

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.progress_bar_callback is not None or not trainer.is_global_zero:
            return
        self.times.append(time.time() - self.start)
        e = trainer.current_epoch
        parts = [f"epoch {e + 1}/{trainer.max_epochs}"]
        if (loss := trainer.callback_metrics.get("train/loss")) is not None:
            parts.append(f"train/loss {float(loss):.4f}")
        history = getattr(module, "history", [])
        if history and history[-1]["epoch"] == e:
            val, t = history[-1], module.cfg.trainer
            best = best_of(history, t.monitor, t.monitor_mode) == e  # the epoch best.ckpt holds
            shown = [k for k in dict.fromkeys([*self.metrics, t.monitor.split("/", 1)[1]]) if k in val]  # + monitor
            parts.append("val " + " ".join(f"{k} {val[k]:.4f}" for k in shown) + " (best)" * best)
        parts.append(f"{self.times[-1] / 60:.1f} min")
        if left := (trainer.max_epochs - e - 1) * sum(self.times) / len(self.times) / 60:
            parts.append(f"~{left:.{0 if left >= 10 else 1}f} min left")
        print(" · ".join(parts), flush=True)
