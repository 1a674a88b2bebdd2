"""Shared helpers of the training benchmarks: Office config, real training batches, one
optimiser step of the LightningModule's own objective and optimiser, timers.

Office is the APAO release's processed data with its own codes (`tokenizer=precomputed`,
colliding items merged: T = 4 as in the papers), so no embedding model runs.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from genrec.data.datamodule import LengthBatches, SeqDataModule  # noqa: E402
from genrec.lit import GenRec  # noqa: E402
from genrec.malloc import keep_freed_memory  # noqa: E402
from genrec.prepare import Prepared, prepare  # noqa: E402

OFFICE = ["dataset=lcrec", f"dataset.root={ROOT.parent / 'shared/data/apao-office'}", "dataset.name=Office",
          "tokenizer=precomputed", "tokenizer.collision=merge"]


def config(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", [*OFFICE, *overrides])


def office(overrides: list[str], batch_size: int) -> tuple[DictConfig, Prepared, SeqDataModule]:
    """Config, the (cached) data stage and the datamodule; run from anywhere, data under ROOT/data."""
    cfg = config([f"trainer.batch_size={batch_size}", f"data_dir={ROOT / 'data'}", *overrides])
    data = prepare(cfg, log=lambda m: print(m, file=sys.stderr))
    dm = SeqDataModule(data.seq, data.sids, cfg.dataset.max_history, batch_size, batch_size, cfg.seed)
    return cfg, data, dm


def epoch(lengths: np.ndarray, batch_size: int, seed: int, bucketed: bool = True) -> list[np.ndarray]:
    """Epoch 0's training batches (example ids) as `SeqDataModule` draws them; `bucketed=False`:
    random batches instead (the length-sorting window is a single batch)."""
    return LengthBatches(lengths, batch_size, True, seed, **({} if bucketed else {"window": 1})).batches()


def epoch_batches(dm: SeqDataModule, n: int, bucketed: bool = True) -> list[dict]:
    """n of epoch 0's training batches, as the train loader yields them (its sampler and
    collation), picked at evenly spaced quantiles of their padded width so that the sample costs
    what the epoch costs per example; in epoch order."""
    ds = dm.splits["train"]
    batches = epoch(ds.lengths, dm.batch_size, dm.seed, bucketed)
    width = np.array([ds.lengths[b].max() for b in batches])
    pick = np.argsort(width, kind="stable")[((np.arange(n) + 0.5) / n * len(batches)).astype(int)]
    return [ds[batches[i].tolist()] for i in np.sort(pick)]


class TrainStep:
    """forward (objective) + backward + gradient clipping + AdamW + scheduler, as `genrec.train`
    runs them (without Lightning's loop and logging); `bf16`: the forward under CPU bf16 autocast, as
    `trainer.precision=bf16-mixed` runs it (backward, clipping and AdamW outside, on float32 weights)."""

    def __init__(self, cfg: DictConfig, data: Prepared, dm: SeqDataModule, seed: int = 0, bf16: bool = False) -> None:
        if cfg.trainer.keep_freed_memory:  # as genrec.train
            keep_freed_memory()
        torch.manual_seed(seed)
        steps = math.ceil(len(dm.splits["train"]) / dm.batch_size)
        self.module = GenRec(cfg, data.sids, dm.item_counts(), steps).train()
        opt = self.module.configure_optimizers()
        self.opt, self.sched = opt["optimizer"], opt["lr_scheduler"]["scheduler"]
        self.clip, self.bf16 = cfg.trainer.gradient_clip, bf16

    def step(self, batch: dict) -> float:
        m = self.module
        with torch.autocast("cpu", torch.bfloat16, enabled=self.bf16):
            loss, _ = m.objective(batch, m.backbone)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_([p for p in m.parameters() if p.requires_grad], self.clip)
        self.opt.step()
        self.sched.step()
        return float(loss.detach())


def timed(f, *args) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of f(*args)."""
    t, c = time.perf_counter(), time.process_time()
    f(*args)
    return time.perf_counter() - t, time.process_time() - c


def fastest(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """The faster of two (wall, CPU) timings, per component."""
    return min(a[0], b[0]), min(a[1], b[1])


def best_times(f, batches: list[dict], min_seconds: float) -> tuple[float, float, int]:
    """f on every batch, in passes until `min_seconds` of wall time have gone by (at least one):
    (wall, CPU) seconds summed over the batches, each batch's fastest pass counting; passes."""
    start, best, passes = time.perf_counter(), None, 0
    while best is None or time.perf_counter() - start < min_seconds:
        times = [timed(f, b) for b in batches]
        best = times if best is None else list(map(fastest, best, times))
        passes += 1
    return sum(t[0] for t in best), sum(t[1] for t in best), passes


def step_flops(f, batches: list[dict]) -> int:
    """Matmul FLOPs (mm, bmm, attention; forward and backward, as torch's FlopCounterMode counts them) of f
    on every batch: the work a step cannot avoid, whatever runs it."""
    with FlopCounterMode(display=False) as counter:
        for b in batches:
            f(b)
    return counter.get_total_flops()


def matmul_peak_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """GFLOP per CPU second of one large n x n x n matmul in `dtype` on this process's threads (best of
    `repeats`): the roofline a training step's matmuls can reach here."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    return 2 * n**3 / min(timed(torch.matmul, a, b)[1] for _ in range(repeats)) / 1e9


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def padding_efficiency(lengths: np.ndarray, batch_size: int, T: int, seed: int, bucketed: bool = True) -> float:
    """Real history tokens / padded history tokens over one epoch of training batches (a history
    holds n items * T tokens + eos, padded to its batch's maximum): our length-bucketed batches,
    or random batches (`bucketed=False`: the sort window is a single batch)."""
    tokens = lengths * T + 1
    batches = epoch(lengths, batch_size, seed, bucketed)
    return float(sum(tokens[b].sum() for b in batches) / sum(len(b) * tokens[b].max() for b in batches))
