"""Token log-probs straight from the decoder's final hidden states, without the logits tensor.

Scoring N = 100 candidates per user (pairwise APAO, S-DPO, hard negatives) with
`token_logprobs(prefix_logits(...))` materialises [B, N, T, V] logits, their log-softmax and,
in backward, two gradients of that size (Office, batch 128: ~200 MB each). Here

    s_i = z_{r_i}[y_i] / tau - logsumexp(z_{r_i} / tau),   z_r = W h_r,

for score i reading hidden row r_i and token y_i. The dot products z_r[y] go through autograd;
`logsumexp_linear` computes the normalisers over chunks of rows and recomputes each chunk's
logits in backward (one extra [rows, D] x [D, V] matmul), keeping only h and the [rows]
normalisers. Several scores may read one row (TIGER's bos row is shared by a user's candidates).

Under autocast (bf16-mixed) h arrives in bf16: the normalisers, their backward and the picked
dot products are computed in float32 from those values with autocast off (a bf16 matmul here
gave softmax rows summing to 0.9-1.07 and log-probs off by up to 0.1).
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 2048  # rows per chunk: an [CHUNK, V] logits block stays in cache


def _acc(h: Tensor) -> torch.dtype:
    """The dtype logits are normalised in: float32, or h's if wider (float64 in tests)."""
    return torch.promote_types(h.dtype, torch.float32)


class _LogsumexpLinear(torch.autograd.Function):
    """logsumexp_v (h W^T / tau)[r, v] for h [R, D], W [V, D] -> [R], in float32 or h's wider dtype."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, tau: float) -> Tensor:
        acc = _acc(h)
        out = torch.cat([(c @ weight.T.to(c.dtype)).to(acc).div_(tau).logsumexp(-1) for c in h.split(CHUNK)])
        ctx.save_for_backward(h, weight, out)
        ctx.tau = tau
        return out

    @staticmethod
    @torch.autocast("cuda", enabled=False)
    @torch.autocast("cpu", enabled=False)
    def backward(ctx, g: Tensor):  # autocast off: the same float32 math as forward
        h, weight, lse = ctx.saved_tensors
        w = weight.to(h.dtype)
        grad_h, grad_w = torch.empty_like(h), torch.zeros_like(weight, dtype=_acc(h))
        for i in range(0, len(h), CHUNK):
            c = h[i : i + CHUNK]
            p = (c @ w.T).to(lse.dtype).div_(ctx.tau).sub_(lse[i : i + CHUNK, None]).exp_()  # softmax rows
            gz = p.mul_((g[i : i + CHUNK] / ctx.tau)[:, None]).to(h.dtype)  # d lse / d z
            grad_h[i : i + CHUNK] = gz @ w
            grad_w += gz.T @ c
        return grad_h, grad_w.to(weight.dtype), None


def logsumexp_linear(h: Tensor, weight: Tensor, tau: float = 1.0) -> Tensor:
    if torch.is_autocast_enabled(h.device.type):  # float32 math on h's values, not bf16 matmuls
        with torch.autocast(h.device.type, enabled=False):
            return _LogsumexpLinear.apply(h.to(_acc(h)), weight, tau)
    return _LogsumexpLinear.apply(h, weight, tau)


def head_logprobs(h: Tensor, weight: Tensor, rows: Tensor, tokens: Tensor, tau: float = 1.0) -> Tensor:
    """log softmax(W h_r / tau)[y] for hidden rows h [R, D], head weight W [V, D] (no bias) and
    the scores' rows r and tokens y (same shape): log-probs of that shape (float32 or wider)."""
    acc = _acc(h)
    picked = (h[rows].to(acc) * weight[tokens].to(acc)).sum(-1) / tau
    return picked - logsumexp_linear(h, weight, tau)[rows]


def float_logits(h: Tensor, weight: Tensor) -> Tensor:
    """h W^T in float32 or wider, autocast off: beam search and full ranking score from these
    (bf16 logits tie dozens of a level's 256 codes and coarsen the ranking)."""
    acc = torch.promote_types(_acc(h), weight.dtype)
    with torch.autocast(h.device.type, enabled=False):
        return h.to(acc) @ weight.to(acc).T
