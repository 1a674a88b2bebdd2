"""The backbone interface every objective and the evaluator use.

Token layout (see `genrec.sid.tokenizers.SemanticIds`): 0 = pad, 1 = eos, 2 = bos, then the
codebook tokens of level 0, level 1, ... (level-offset ids). A history is the flattened
SID tokens of the last `max_history` items followed by eos, **left-padded** with 0.

Contract (B users, N candidates per user, m prefix tokens, V vocabulary):

- `encode(history [B, L], mask [B, L]) -> enc`: the history encoding, computed once per
  user (TIGER: the encoder states; Llama: the KV cache
  of the history prompt). Opaque to callers except for `enc.mask` ([B, L] bool).
- `prefix_logits(enc, prefix [B, N, m]) -> [B, N, m + 1, V]`: teacher forcing for N
  target prefixes per user that all share `enc` (never re-encoded per candidate).
  Position j holds the logits for target token j given bos + prefix[:j]. So the
  teacher-forced logits of full targets y [B, T] are
  `prefix_logits(enc, y[:, None, :-1])[:, 0]` -> [B, T, V]; m may be 0 (first step only).
- `prefix_logprobs(enc, prefix [B, N, m], tokens [B, N, m + 1], temperature) -> [B, N, m + 1]`:
  the log-probs of `tokens` at those positions, `token_logprobs(prefix_logits(...), tokens)`.
  Backbones override it to score many candidates without the [B, N, m + 1, V] logits.
- `start(enc) -> state` and `step(state, tokens [B, K] | None, parents [B, K] | None)
  -> (logits [B, K, V], state)`: incremental decoding for beam search. The first call
  passes tokens=None and returns the first-token logits with K=1. Each later call
  appends `tokens` to the beams selected by `parents` (indices into the previous step's
  beams, so beams may be re-ordered, duplicated or dropped and K may change) and returns
  the next-token logits. Backbones override this with a cached implementation; the
  default here re-runs `prefix_logits` and is the obviously-correct reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from genrec.sid.codes import BOS, EOS, PAD  # noqa: F401  (the token layout)


@dataclass
class PrefixState:
    """Decoding state of the reference `step`: the history encoding and the beams so far."""

    enc: Any
    prefix: torch.Tensor  # [B, K, m]


class Backbone(nn.Module):
    vocab_size: int
    legacy_key: str = ""  # a key of checkpoints saved when the backbone wrapped HF's model (under `hf.`)

    def hf_names(self) -> dict[str, str]:
        """Our parameter name -> HF's (backbones whose weights convert to and from an HF model)."""
        raise NotImplementedError

    def _from_hf_state(self, state: dict, prefix: str = "") -> dict:
        return {ours: state[prefix + hf] for ours, hf in self.hf_names().items()}

    def _export_to(self, hf: nn.Module) -> nn.Module:
        """`hf` (an HF model built from this backbone's config) holding these weights, on their device and
        dtype, in this backbone's train/eval mode."""
        state = self.state_dict()
        hf.load_state_dict({theirs: state[ours] for ours, theirs in self.hf_names().items()}, strict=False)
        return hf.to(next(self.parameters())).train(self.training)

    def _upgrade_state(self, state: dict, prefix: str, *args) -> None:
        """A load_state_dict pre-hook: checkpoints written when the backbone wrapped HF's model hold HF's
        names under `hf.`; rename them."""
        if self.legacy_key and prefix + "hf." + self.legacy_key in state:
            for ours, hf in self.hf_names().items():
                state[prefix + ours] = state[prefix + "hf." + hf]
            for key in [k for k in state if k.startswith(prefix + "hf.")]:
                del state[key]

    def encode(self, history: torch.Tensor, mask: torch.Tensor) -> Any:
        raise NotImplementedError

    def prefix_logits(self, enc: Any, prefix: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def prefix_logprobs(self, enc: Any, prefix: torch.Tensor, tokens: torch.Tensor,
                        temperature: float = 1.0) -> torch.Tensor:
        return token_logprobs(self.prefix_logits(enc, prefix), tokens, temperature)

    def target_logits(self, history: torch.Tensor, mask: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, T, V] for targets [B, T] (one encoder pass)."""
        return self.prefix_logits(self.encode(history, mask), target[:, None, :-1])[:, 0]

    def start(self, enc: Any) -> Any:
        return PrefixState(enc, enc.mask.new_zeros(enc.mask.shape[0], 1, 0, dtype=torch.long))

    def step(self, state: Any, tokens: torch.Tensor | None, parents: torch.Tensor | None):
        prefix = state.prefix
        if tokens is not None:
            prefix = torch.gather(prefix, 1, parents[..., None].expand(-1, -1, prefix.shape[-1]))
            prefix = torch.cat([prefix, tokens[..., None]], dim=-1)
        logits = self.prefix_logits(state.enc, prefix)[:, :, -1]
        return logits, PrefixState(state.enc, prefix)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """s^t = log softmax(z^t / tau)[y^t]: logits [..., T, V], tokens [..., T] -> [..., T]."""
    z = logits.float()
    logp = torch.log_softmax(z if temperature == 1.0 else z / temperature, dim=-1)
    return logp.gather(-1, tokens[..., None]).squeeze(-1)
