"""Will a CPU training run fit in this host's memory? Estimated before the first step, not found out by the
kernel's out-of-memory killer hours in.

Per process, a CPU step's peak resident memory is about
    base (this process now: data, model) + 3 x trainable weights (gradients, AdamW's two moments)
    + DDP's gradient buckets (1 x, with several processes) + an averaged copy (1 x, callbacks=[default,ema])
    + activations,
where `activations` are the bytes autograd keeps for backward: measured by running the objective's forward
(under the run's precision) on the k and 2k training examples with the longest histories and counting the
distinct tensors it saves (`torch.autograd.graph.saved_tensors_hooks`); they grow linearly with the examples, so
    activations = fixed + per_example x trainer.batch_size.
What this does not count (backward's transient gradients, evaluation, the allocator's heap) is covered by one
measured allowance: the estimate is `ALLOWANCE` x that sum (peak resident memory over the sum: 1.55-2.4 in Office
runs of CE and pairwise APAO, with trainer.keep_freed_memory true or false alike; benchmarks/memory.py).
Layers recomputed in backward (`backbone.memory=checkpoint`) save only their inputs; their recomputation's
transient activations (`backbone.memory_users` users at a time) are not counted.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from genrec.data.readers.common import DataError

GB = 2**30
PROBE = 4  # examples per probe forward (k; and 2k)
ALLOWANCE = 2.0  # peak RSS over the counted bytes (benchmarks/memory.py: 1.55-1.99 in 40-step runs, 1.9-2.4 whole runs)


@dataclass
class Estimate:
    base: float          # bytes: this process's resident memory now
    weights: float       # gradients, optimiser state, DDP buckets
    fixed: float         # saved tensors independent of the batch (e.g. bf16 copies of the weights)
    per_example: float   # saved tensors per training example (the longest histories)
    batch_size: int
    allowance: float = ALLOWANCE  # for what is not counted

    @property
    def counted(self) -> float:
        return self.base + self.weights + self.fixed + self.per_example * self.batch_size

    @property
    def per_process(self) -> float:
        return self.allowance * self.counted


def saved_bytes(module, batch: dict, autocast: torch.dtype | None) -> int:
    """Bytes of the distinct tensors (storages) autograd saves for backward in one training forward of the
    objective on `batch`, parameters excluded; no weight, RNG stream or objective state is changed."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    state = [(b, b.clone()) for b in module.buffers()]  # training state a forward updates (APAO's weights)
    with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", autocast or torch.bfloat16, enabled=autocast is not None):
        module.objective(batch, module.backbone)
    with torch.no_grad():
        for b, before in state:
            b.copy_(before)
    return sum(seen.values())


def resident_bytes() -> float:
    """This process's resident memory now (Linux /proc; else its peak so far)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def available_bytes() -> float | None:
    """Memory a new allocation can still get: MemAvailable, capped by a cgroup v2 limit (containers, Slurm);
    None where unknown (not Linux)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        free = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free = min(free, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return free


def estimate(cfg: DictConfig, module, train_set, processes: int) -> Estimate:
    """The per-process estimate for `module` trained on `train_set` (the datamodule's training `Examples`) under `cfg`."""
    longest = np.argsort(-np.asarray(train_set.lengths), kind="stable")
    autocast = torch.bfloat16 if str(cfg.trainer.precision).startswith("bf16") else None
    was_training = module.training
    module.train()
    try:
        small, large = (saved_bytes(module, train_set[longest[:k].tolist()], autocast) for k in (PROBE, 2 * PROBE))
    finally:
        module.train(was_training)
    per_example = max(0.0, (large - small) / PROBE)
    trainable = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    copies = 3 + (processes > 1) + averaged(cfg)
    return Estimate(base=resident_bytes(), weights=trainable * copies,
                    fixed=max(0.0, small - PROBE * per_example), per_example=per_example,
                    batch_size=int(cfg.trainer.batch_size))


def averaged(cfg: DictConfig) -> int:
    """How many averaged copies of the model the run's callbacks keep (Lightning's WeightAveraging: conf/callbacks/ema.yaml)."""
    from hydra.utils import get_class
    from lightning.pytorch.callbacks import WeightAveraging

    return sum(issubclass(get_class(c._target_), WeightAveraging) for c in cfg.get("callbacks", {}).values()
               if isinstance(c, DictConfig) and "_target_" in c)


def shortfall(e: Estimate, processes: int, available: float | None) -> str | None:
    """One line if `processes` such processes need more than `available`, else None."""
    if available is None or e.per_process * processes <= available:
        return None
    fits = int((available / processes / e.allowance - e.base - e.weights - e.fixed) // max(e.per_example, 1))
    return (f"trainer.batch_size={e.batch_size}: this run needs about {e.per_process / GB:.1f} GB per process "
            f"(activations {e.per_example * e.batch_size / GB:.1f} GB; estimated) x {processes} "
            f"process{'es' * (processes > 1)}, {available / GB:.1f} GB available: "
            f"a smaller trainer.batch_size{f' (<= {fits})' if fits > 0 else ''} with a larger trainer.accumulate "
            f"(same effective batch), or backbone.memory_under_autocast=true (TIGER under bf16); "
            f"trainer.memory_check=false runs it anyway")


class MemoryShortfall(DataError):
    """The run would not fit in this host's memory (`shortfall`'s line)."""


def check(cfg: DictConfig, module, train_set) -> Estimate | None:
    """The estimate for this run's CPU processes on this host; MemoryShortfall if they need more memory than is
    available. None for an accelerator's run (its memory is the device's: not checked)."""
    from lightning.pytorch.accelerators import CPUAccelerator

    from genrec.config_check import bare_trainer, device_args

    trainer = bare_trainer(device_args(cfg))
    if not isinstance(trainer.accelerator, CPUAccelerator):
        return None
    processes = trainer.num_devices
    e = estimate(cfg, module, train_set, processes)
    if line := shortfall(e, processes, available_bytes()):
        raise MemoryShortfall(line)
    return e
