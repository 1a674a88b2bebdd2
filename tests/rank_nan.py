"""A CE objective whose loss turns NaN on DDP rank 1 only, from its third step (tests/test_train.py)."""

import torch
import torch.distributed as dist

from genrec.objectives.ce import CE


class NanOnRankOne(CE):
    steps = 0

    def forward(self, batch, backbone):
        loss, terms = super().forward(batch, backbone)
        if self.training:
            NanOnRankOne.steps += 1
            if dist.is_initialized() and dist.get_rank() == 1 and NanOnRankOne.steps >= 3:
                loss = loss * torch.tensor(float("nan"))
        return loss, terms
