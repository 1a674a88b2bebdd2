"""Masked-softmax loss (MSL): CE where the softmax at step t runs only over the tokens the item
trie allows after the ground-truth prefix (the others get -inf). The released code uses tau = 2.
With `end_token` the eos step allows only eos, so it adds 0 to the sum but counts in the mean
(as in the released code)."""

from __future__ import annotations

import torch

from genrec.sid.trie import Trie
from genrec.models.base import EOS, Backbone, token_logprobs
from genrec.objectives.ce import CE


def allowed_masks(trie: Trie, target: torch.Tensor, end_token: bool = False) -> torch.Tensor:
    """Trie-allowed tokens [B, T(+1), V] after each ground-truth prefix of targets [B, T]."""
    masks = trie.target_masks(target)
    if end_token:
        eos = torch.zeros_like(masks[:, :1])
        eos[..., EOS] = True
        masks = torch.cat([masks, eos], 1)
    return masks


class MSL(CE):
    order = 1

    def __init__(self, temperature: float = 2.0, end_token: bool = False) -> None:
        super().__init__(temperature, end_token)

    def forward(self, batch: dict, backbone: Backbone) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        _, logits = self.teacher_forced(batch, backbone)
        allowed = allowed_masks(self.ctx.trie, batch["target"], self.end_token)
        logits = logits.masked_fill(~allowed, float("-inf"))
        loss = -token_logprobs(logits, self.scored(batch["target"]), self.temperature).mean()
        return loss, {"msl": loss.detach()}
