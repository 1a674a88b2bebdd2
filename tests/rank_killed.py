"""A CE objective whose DDP rank 0 (the process that launched the others) is SIGKILLed at its third step, as the
kernel's OOM killer ended one on a 24 GB host; the other rank is left to report it (tests/test_train.py)."""

import os
import signal

import torch.distributed as dist

from genrec.objectives.ce import CE


class KilledOnRankZero(CE):
    steps = 0

    def forward(self, batch, backbone):
        if self.training:
            KilledOnRankZero.steps += 1
            if dist.is_initialized() and dist.get_rank() == 0 and KilledOnRankZero.steps >= 3:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(batch, backbone)
