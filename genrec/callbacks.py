"""genrec's Lightning callbacks and checkpoint writer, configured in conf/callbacks/ and conf/trainer/
(`_target_`, built by genrec/train.py with `hydra.utils.instantiate`)."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.plugins import TorchCheckpointIO


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
        trainer.save_checkpoint(Path(self.dirpath) / "last.ckpt")


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
