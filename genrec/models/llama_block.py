"""One Llama decoder layer, owned by genrec: the math of the Llama backbone in one place.

Llama layout (`transformers.models.llama.modeling_llama` is the reference the tests compare
against, for genrec's configs: no biases, SiLU, default RoPE, head_dim = hidden / heads):
pre-norm residual sub-layers, RMS norm in float32 (`RMSNorm`), rotary positions on queries and
keys (`Rotary`), grouped-query attention (each of the `num_kv_heads` key/value heads serves
`num_heads / num_kv_heads` query heads) scaled by 1/sqrt(d), a SwiGLU feed-forward, and dropout
only on the attention probabilities:

    x = x + o(softmax(rope(q(norm(x))) rope(k(norm(x)))^T / sqrt(d)) v(norm(x)))
    x = x + down(silu(gate(norm(x))) * up(norm(x)))

`Layer.forward` runs both. Which keys a query meets is the caller's (a history's own tokens;
a candidate's or beam's own tokens after the user's shared history keys), so the layer takes
the rows' own-key mask, the shared history keys/values and the rows' cached past keys/values;
`attention` joins history and own keys in one softmax. Parameters are created in HF's order,
so a seed gives the weights HF's Llama would (see `genrec.models.llama.Llama`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Llama's RMSNorm: weight * (x / RMS(x)), the normalisation in float32, cast back to x's dtype
    before the weight (T5's `Norm` casts differently: not the same rounding)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.float32)
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Rotary(nn.Module):
    """Rotary position embedding (default RoPE): position p turns the pair (i, i + d/2) of a
    query/key by p * theta^(-2i/d)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin [..., d] for position ids pos [...], in `dtype`."""
        freqs = pos[..., None].float() * self.inv_freq.float()
        emb = torch.cat([freqs, freqs], -1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def heads_fit(hidden_size: int, num_heads: int, num_kv_heads: int) -> bool:
    """The heads split hidden_size into an even head size (RoPE rotates pairs) and the key/value heads split the
    heads (grouped-query attention)."""
    return hidden_size % (2 * num_heads) == 0 and num_heads % num_kv_heads == 0


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., H, S, d] turned by cos, sin [..., S, d]."""
    cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def prefill_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, p: float, training: bool) -> Tensor:
    """softmax(q k^T / sqrt(d)) v over the keys in mask, [B, H, S, d]. Training in bf16 on CPU computes it
    explicitly (the softmax accumulates in float32, its probabilities are kept in bf16, as the product with v
    reads them): SDPA's bf16 CPU backward took half of a Llama step, which runs 1.9x as fast without it
    (benchmarks/training.py). Otherwise SDPA (its fused CPU forward is ~3x the explicit one; in float32 its
    backward is as fast)."""
    # under autocast q and k are float32 (after rotary), v bf16
    autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    if q.requires_grad and q.device.type == "cpu" and (autocast or v.dtype == torch.bfloat16):
        scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)  # the scale on the narrow side
        return F.dropout(scores.masked_fill(~mask, float("-inf")).softmax(-1), p, training) @ v
    return F.scaled_dot_product_attention(q, k, v, mask, dropout_p=p if training else 0.0)


def attention(q: Tensor, k: Tensor, v: Tensor, own_mask: Tensor | None, history: tuple[Tensor, Tensor, Tensor] | None,
              p: float, training: bool) -> Tensor:
    """q [B, N, H, S, d] over each row's own keys k, v [B, N, H, t, d] (masked by `own_mask`) and,
    if `history` = (K, V [B, H, L, d], mask [B, L]), the user's shared history keys: one softmax
    over both; dropout p on the probabilities. Output [B, N, H, S, d]."""
    if history is None:  # history prefill (N = 1)
        return prefill_attention(*(x.flatten(0, 1) for x in (q, k, v, own_mask)), p, training).unflatten(0, q.shape[:2])
    B, N, H, S, d = q.shape
    hk, hv, mask = history
    L = mask.shape[1]
    own = q @ k.transpose(-1, -2) * d**-0.5  # [B, N, H, S, t]
    if own_mask is not None:
        own = own.masked_fill(~own_mask, float("-inf"))
    qh = q.transpose(1, 2).reshape(B, H, N * S, d)  # all rows of a user are queries of one product
    hist = (qh @ hk.transpose(-1, -2) * d**-0.5).masked_fill(~mask[:, None, None], float("-inf"))
    scores = torch.cat([hist.view(B, H, N, S, L).transpose(1, 2), own], -1)  # [B, N, H, S, L + t]
    a = F.dropout(scores.softmax(-1), p, training)
    yh = a[..., :L].transpose(1, 2).reshape(B, H, N * S, L) @ hv  # [B, H, N * S, d]
    return yh.view(B, H, N, S, d).transpose(1, 2) + a[..., L:] @ v


class Attention(nn.Module):
    """q, k, v, o projections (no bias): H query heads, H_kv key/value heads of width d."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.q = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.k = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.v = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.o = nn.Linear(num_heads * head_dim, d_model, bias=False)
        self.n_rep, self.head_dim = num_heads // num_kv_heads, head_dim

    def heads(self, x: Tensor) -> Tensor:
        """[..., S, h * d] -> [..., h, S, d]."""
        return x.unflatten(-1, (-1, self.head_dim)).transpose(-2, -3)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(d_model, d_ff, bias=False), nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    """One Llama decoder layer; see the module docstring."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, d_ff: int, p: float = 0.0,
                 eps: float = 1e-6) -> None:
        super().__init__()
        self.attn = Attention(d_model, num_heads, num_kv_heads, d_model // num_heads)
        self.mlp = MLP(d_model, d_ff)
        self.attn_norm, self.mlp_norm = RMSNorm(d_model, eps), RMSNorm(d_model, eps)
        self.p = p

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, own_mask: Tensor | None,
                history: tuple[Tensor, Tensor, Tensor] | None, past: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, N, S, D] (rows' new positions, rotary cos/sin [B, N, S, d]) -> new x, and the rows'
        own keys/values [B, N, H, t, d] (after `past`, repeated to all query heads) for the cache."""
        a = self.attn
        h = self.attn_norm(x)
        q, k, v = a.heads(a.q(h)), a.heads(a.k(h)), a.heads(a.v(h))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k, v = k.repeat_interleave(a.n_rep, -3), v.repeat_interleave(a.n_rep, -3)
        if past is not None:
            k, v = torch.cat([past[0], k], -2), torch.cat([past[1], v], -2)
        y = attention(q, k, v, own_mask, history, self.p, self.training)
        x = x + a.o(y.transpose(-2, -3).flatten(-2))
        return x + self.mlp(self.mlp_norm(x)), k, v
