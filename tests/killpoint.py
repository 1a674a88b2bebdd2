"""Run `genrec.train` and SIGKILL it at a named point (test helper for tests/test_resume.py).

    python tests/killpoint.py <point> <n> [hydra overrides...]

Points: `train` (after optimizer step n), `val` / `test` (inside the first validation /
test batch of epoch n; test: n is ignored), `ckpt` (half-way through writing the n-th
checkpoint file, 1-based). Nothing in genrec knows about this: a callback is added to every
Trainer, and the checkpoint writer is wrapped, from the outside.
"""

from __future__ import annotations

import io
import os
import runpy
import signal
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # this checkout's genrec, as `python -m` from its root
import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt(L.Callback):
    def __init__(self, point: str, n: int) -> None:
        self.point, self.n = point, n

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if self.point == "train" and trainer.global_step == self.n:
            die()

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.point == "val" and trainer.current_epoch == self.n and not trainer.sanity_checking:
            die()

    def on_test_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.point == "test":
            die()


def main() -> None:
    point, n = sys.argv[1], int(sys.argv[2])
    sys.argv = ["genrec.train", *sys.argv[3:]]
    init = L.Trainer.__init__

    def patched_init(self, *args, callbacks=None, **kwargs):
        init(self, *args, callbacks=[*(callbacks or []), KillAt(point, n)], **kwargs)

    L.Trainer.__init__ = patched_init
    if point == "ckpt":
        saves = [0]

        def half_write(self, checkpoint, path, storage_options=None):
            saves[0] += 1
            if saves[0] == n:  # the process dies with half the bytes at `path`
                buf = io.BytesIO()
                torch.save(checkpoint, buf)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                die()
            return save(self, checkpoint, path, storage_options)

        save = TorchCheckpointIO.save_checkpoint
        TorchCheckpointIO.save_checkpoint = half_write

    runpy.run_module("genrec.train", run_name="__main__")  # as `python -m genrec.train`


if __name__ == "__main__":
    main()
