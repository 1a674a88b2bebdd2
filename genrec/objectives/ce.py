"""Cross-entropy with teacher forcing: L_CE = -(1/T) sum_t s^t, s^t = log softmax(z^t / tau)[y^t].

`end_token=True` also scores eos after the T target tokens (the released code does), so the
mean runs over T + 1 tokens; its logits come from the same call (prefix = the full target).
"""

from __future__ import annotations

from typing import Any

import torch

from genrec.models.base import EOS, Backbone, token_logprobs
from genrec.objectives.base import Objective


class CE(Objective):
    order = 0

    def __init__(self, temperature: float = 1.0, end_token: bool = False) -> None:
        super().__init__()
        self.temperature = temperature
        self.end_token = end_token

    def scored(self, tokens: torch.Tensor) -> torch.Tensor:
        """The tokens scored for targets [..., T]: the target, then eos if `end_token`."""
        if not self.end_token:
            return tokens
        return torch.cat([tokens, torch.full_like(tokens[..., :1], EOS)], -1)

    def prefixes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forcing prefixes for targets [..., T] (one more position with eos)."""
        return tokens if self.end_token else tokens[..., :-1]

    def teacher_forced(self, batch: dict, backbone: Backbone) -> tuple[Any, torch.Tensor]:
        """One encoder pass; logits [B, T(+1), V] of the batch's targets."""
        enc = backbone.encode(batch["history"], batch["mask"])
        return enc, backbone.prefix_logits(enc, self.prefixes(batch["target"])[:, None])[:, 0]

    def forward(self, batch: dict, backbone: Backbone) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        _, logits = self.teacher_forced(batch, backbone)
        loss = -token_logprobs(logits, self.scored(batch["target"]), self.temperature).mean()
        return loss, {"ce": loss.detach()}
