"""One T5 layer, owned by genrec: the math of TIGER's encoder and decoder in one place.

T5 layout (`transformers.models.t5.modeling_t5` is the reference the tests compare against):
pre-norm residual sub-layers, RMS norm without bias or mean (`Norm`), attention without the
1/sqrt(d) scaling and with a learned relative position bias (`RelativeBias`, owned by the first
layer of each stack), a ReLU feed-forward, dropout after the embedding, on the attention
probabilities, after each sub-layer and inside the feed-forward:

    x = x + drop(o(attention(norm(x))))                 self-attention
    x = x + drop(o(attention(norm(x), encoder states)))  cross-attention (decoder layers)
    x = x + drop(wo(drop(relu(wi(norm(x))))))           feed-forward

`Block.forward` runs these three sub-layers. Which keys a query meets in its self-attention
depends on the caller (a history's own tokens, the shared bos and a candidate's own prefix, a
beam's ancestors in the cache), so the self-attention's pattern is a function the caller passes
in (`attend`, e.g. `Block.plain_attention`); so is the cross-attention (`cross`): over keys/values
projected once per user (`Block.projected_cross`) or straight from the encoder states
(`Block.absorbed_cross`). Parameters are created in HF's order, so a seed gives the weights
HF's T5 would (see `genrec.models.tiger.Tiger`).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genrec.models.dropout import dropout, dropout_unscaled, relu_dropout_unscaled


class Norm(nn.Module):
    """T5's LayerNorm: x / RMS(x) * weight, the mean square in float32."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: Tensor) -> Tensor:
        x = x * torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (x.to(self.weight.dtype) if self.weight.dtype in (torch.float16, torch.bfloat16) else x)


def relative_bucket(rel: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of relative position rel = key - query: exact below num_buckets / 2 (per
    direction if bidirectional), then logarithmic up to max_distance."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket = (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = -rel.clamp(max=0)
    exact = num_buckets // 2
    large = exact + (torch.log(rel.float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)).long()
    return bucket + torch.where(rel < exact, rel, large.clamp(max=num_buckets - 1))


class RelativeBias(nn.Module):
    """The learned bias [H, S, past + S] of S queries after `past` positions over all keys."""

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int, bidirectional: bool) -> None:
        super().__init__()
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional

    def forward(self, S: int, past: int = 0, device=None) -> Tensor:
        rel = torch.arange(past + S, device=device) - (torch.arange(S, device=device)[:, None] + past)
        return self.relative_attention_bias(relative_bucket(rel, self.bidirectional, self.num_buckets,
                                                            self.max_distance)).permute(2, 0, 1)


class Attention(nn.Module):
    """q, k, v, o projections (no bias) of H heads of width d_kv."""

    def __init__(self, d_model: int, num_heads: int, d_kv: int) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d_model, num_heads * d_kv, bias=False) for _ in range(3))
        self.o = nn.Linear(num_heads * d_kv, d_model, bias=False)
        self.num_heads, self.d_kv = num_heads, d_kv

    def heads(self, x: Tensor) -> Tensor:
        """[..., S, H * d] -> [..., H, S, d]."""
        return x.unflatten(-1, (self.num_heads, self.d_kv)).transpose(-2, -3)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.wi, self.wo = nn.Linear(d_model, d_ff, bias=False), nn.Linear(d_ff, d_model, bias=False)


class KeyBias:
    """A stack's self-attention position bias [1, H, S, L], shared by its layers; given the scores' dtype (where the
    layers' attention is explicit: `Block.explicit`), also `added`: the bias and the key mask [B, L] as one term
    [B H, S, L] (the bias, -inf at masked keys), built once for all layers (training's explicit attention adds it
    inside the q k^T matmul: one pass instead of three per layer) and outside any layer (activation checkpointing
    recomputes a layer: it must not build it there)."""

    def __init__(self, bias: Tensor, mask: Tensor, dtype: torch.dtype | None = None) -> None:
        self.bias, self.added = bias, None
        if dtype is not None:
            self.added = torch.where(mask[:, None, None], bias.to(dtype), -math.inf).flatten(0, 1)


Attend = Callable[[Attention, Tensor], Tensor]  # (attention, normed x) -> its residual branch drop(o(y))


class Block(nn.Module):
    """One T5 encoder (cross=False) or decoder (cross=True) layer; see the module docstring."""

    def __init__(self, d_model: int, num_heads: int, d_kv: int, d_ff: int, p: float, eps: float = 1e-6,
                 cross: bool = False, bias: RelativeBias | None = None) -> None:
        super().__init__()
        self.attn = Attention(d_model, num_heads, d_kv)
        if bias is not None:  # HF's T5 keeps a stack's bias in its first layer's attention
            self.attn.bias = bias
        self.attn_norm = Norm(d_model, eps)
        if cross:
            self.cross, self.cross_norm = Attention(d_model, num_heads, d_kv), Norm(d_model, eps)
        self.ff, self.ff_norm = FeedForward(d_model, d_ff), Norm(d_model, eps)
        self.p = p

    def drop(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def forward(self, x: Tensor, attend: Attend, cross: Attend | None = None) -> Tensor:
        """x [B, R, D]; `attend` the self-attention pattern; decoder layers: `cross` the cross-attention over the
        encoder states (`projected_cross` or `absorbed_cross`); the R rows of a user are its queries."""
        x = x + attend(self.attn, self.attn_norm(x))
        if cross is not None:
            x = x + cross(self.cross, self.cross_norm(x))
        h, scale = relu_dropout_unscaled(self.ff.wi(self.ff_norm(x)), self.p, self.training)
        y = self.ff.wo(h)  # dropout's 1 / (1 - p) after wo: on d_model, not d_ff, elements (a step ~6% faster)
        return x + self.drop(y if scale == 1.0 else y * scale)

    def explicit(self, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether `attention` computes explicitly (training), not through SDPA, for queries of this dtype/device."""
        return self.training and (self.p > 0 or (device.type == "cpu" and dtype == torch.bfloat16))

    def attention(self, q: Tensor, k: Tensor, v: Tensor, bias: KeyBias | None, mask: Tensor) -> tuple[Tensor, float]:
        """softmax(q k^T + bias) v (no 1/sqrt(d)) with keys outside mask [B, L] excluded: rows [B, S, H d], and the
        dropout scale 1 / (1 - p) not yet applied to them (1.0 outside training; `Block.out` applies it)."""
        # explicit in training: at p > 0 for the 1-byte dropout masks; at p = 0 in bf16 on CPU too (SDPA's bf16 CPU
        # backward is slow: a step ran 1.37x as fast explicit, benchmarks/training.py --dropout0). Under bf16 autocast
        # the scores stay bf16 (a float32 bias would promote them, the softmax, dropout and their backward)
        if self.explicit(q.dtype, q.device):
            if bias is None:
                s = (q @ k.transpose(-1, -2)).masked_fill_(~mask[:, None, None], float("-inf"))
            else:  # the bias and the mask's -inf in one term, added inside the matmul
                s = torch.baddbmm(bias.added.to(q.dtype), q.flatten(0, 1), k.flatten(0, 1).transpose(1, 2))
                s = s.unflatten(0, q.shape[:2])
            p, scale = dropout_unscaled(s.softmax(-1), self.p, self.training)
            y = p @ v
        else:
            m = mask[:, None, None] if bias is None else torch.where(mask[:, None, None], bias.bias,
                                                                     torch.finfo(bias.bias.dtype).min)
            y, scale = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=1.0), 1.0
        return y.transpose(1, 2).flatten(-2), scale

    @staticmethod
    def out(att: Attention, y: Tensor, scale: float) -> Tensor:
        """o(y * scale), the scale folded into o's weight ([D, H d] elements instead of y's)."""
        return att.o(y) if scale == 1.0 else F.linear(y, att.o.weight * scale)

    def plain_attention(self, bias: KeyBias, mask: Tensor) -> Attend:
        """Every position of a sequence over all its unmasked positions (the encoder): bias [1, H, S, S] (shared by
        the stack's layers: `KeyBias`)."""
        def attend(att: Attention, h: Tensor) -> Tensor:
            q, k, v = (att.heads(f(h)) for f in (att.q, att.k, att.v))
            return self.drop(self.out(att, *self.attention(q, k, v, bias, mask)))
        return attend

    def projected_cross(self, k: Tensor, v: Tensor, mask: Tensor) -> Attend:
        """Cross-attention over this layer's keys/values k, v [B, H, L, d] (`Tiger.cross_kv` projects all layers'
        at once) of the encoder states unmasked in mask [B, L]."""
        def attend(att: Attention, h: Tensor) -> Tensor:
            return self.drop(self.out(att, *self.attention(att.heads(att.q(h)), k, v, None, mask)))
        return attend

    def absorbed_cross(self, states: Tensor, mask: Tensor) -> Attend:
        """Cross-attention straight from the encoder states [B, L, D], no keys/values projected: per head
        q k_l = (q W_k) s_l and sum_l p_l v_l = (sum_l p_l s_l) W_v^T. Cheaper than projecting when a user's
        R queries are few (teacher forcing: R (d + L) < d L), and the same numbers up to rounding."""
        def attend(att: Attention, h: Tensor) -> Tensor:
            (B, R, D), H, d = h.shape, att.num_heads, att.d_kv
            q = torch.einsum("bhrd,hdD->bhrD", att.heads(att.q(h)), att.k.weight.view(H, d, D))
            s = (q.flatten(1, 2) @ states.transpose(1, 2)).masked_fill(~mask[:, None], float("-inf"))  # [B, H R, L]
            c = (self.drop(s.softmax(-1)) @ states).view(B, H, R, D)
            y = torch.einsum("bhrD,hdD->brhd", c, att.v.weight.view(H, d, D))  # [B, R, H, d]
            return self.drop(att.o(y.flatten(-2)))
        return attend

    def cross_kv_weight(self) -> Tensor:
        """The cross-attention's k and v weights stacked [2 H d, D] (`Tiger.cross_kv` projects all layers at once)."""
        return torch.cat([self.cross.k.weight, self.cross.v.weight])

    def weights(self) -> list[Tensor]:
        """The weights in `genrec.models.tiger_backward`'s order: self-attention norm, fused q/k/v,
        o; (decoder) cross-attention norm, q, o; feed-forward norm, wi, wo."""
        a = self.attn
        w = [self.attn_norm.weight, torch.cat([a.q.weight, a.k.weight, a.v.weight]), a.o.weight]
        if hasattr(self, "cross"):
            w += [self.cross_norm.weight, self.cross.q.weight, self.cross.o.weight]
        return w + [self.ff_norm.weight, self.ff.wi.weight, self.ff.wo.weight]
