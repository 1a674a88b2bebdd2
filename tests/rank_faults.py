"""CE objectives that fail on one DDP rank only, from its third training step (tests/test_train.py)."""

import os
import signal

import torch
import torch.distributed as dist

from genrec.objectives.ce import CE


class OnRankFromStep3(CE):
    """Counts training steps; `fault` says whether this rank is `rank` and at step 3 or later."""

    rank, steps = 1, 0

    def fault(self) -> bool:
        if not self.training:
            return False
        type(self).steps += 1
        return dist.is_initialized() and dist.get_rank() == self.rank and type(self).steps >= 3


class NanOnRankOne(OnRankFromStep3):
    """The loss turns NaN on rank 1."""

    def forward(self, batch, backbone):
        fault = self.fault()
        loss, terms = super().forward(batch, backbone)
        return (loss * torch.tensor(float("nan")) if fault else loss), terms


class KilledOnRankZero(OnRankFromStep3):
    """Rank 0 (the process that launched the others) is SIGKILLed, as the kernel's OOM killer ended one on a
    24 GB host; the other rank is left to report it."""

    rank = 0

    def forward(self, batch, backbone):
        if self.fault():
            os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(batch, backbone)
