"""One TIGER decoder block over N candidate prefixes per user, with a hand-written backward.

Training on N > 1 candidates (pairwise APAO, S-DPO: N = 100) decodes ~300 positions per user,
so what autograd keeps for backward dominates memory (~28 KB per position and layer: every
norm, projection, softmax and dropout output). This block keeps ~8 KB: the three sub-layer
inputs, the self-attention q/k/v, the cross-attention queries and log-normalisers, and the
dropout seeds. Backward re-derives the rest: norms, softmaxes and masks (elementwise), the
feed-forward hidden layer (one matmul, wi) and the cross-attention scores and outputs (over
the history); no projection but wi is recomputed.

Same math and the same dropout draws, in the same order, as `Tiger._candidate_block` (the
autograd reference; tests compare values and gradients). T5 layout: pre-norm residual
sub-layers, RMS norm without bias, no 1/sqrt(d) in attention, relative position bias in the
self-attention, ReLU feed-forward. Shapes: B users, N candidates, m prefix positions plus the
shared bos (decoded once per user), R = 1 + N m rows per user, model width D, H heads of
width d, L history tokens, F feed-forward width. In the self-attention bos attends to itself
and prefix position j to bos and to its own candidate's positions <= j (causal -inf in `bias`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from genrec.models.dropout import draw_seed, keep_mask


def _rstd(z: Tensor, eps: float) -> Tensor:
    """1 / RMS(z) [..., 1], the variance in float32 as in HF's T5LayerNorm."""
    return torch.rsqrt(z.float().pow(2).mean(-1, keepdim=True) + eps)


def _norm_backward(gn: Tensor, z: Tensor, r: Tensor) -> Tensor:
    """dL/dz of n = z r, r = (mean(z^2) + eps)^-1/2, from gn = dL/dn."""
    return r * (gn - z * (r * r) * (gn * z).mean(-1, keepdim=True))


def _wgrad(g: Tensor, x: Tensor) -> Tensor:
    """dL/dW [out, in] of y = x W^T from g = dL/dy [..., out] and x [..., in]."""
    return g.flatten(0, -2).T @ x.flatten(0, -2)


def _rowsum(t: Tensor) -> Tensor:
    return t.flatten(0, -2).sum(0)


class _Masks:
    """A block's dropout: mask i is drawn from the i-th seed (drawn from torch's RNG in forward,
    in call order; replayed in backward). `keep(i, shape)` is the 0/1 keep-mask in the block's
    dtype (None at p = 0); `drop(i, x)` applies it with the 1/(1-p) scale, in place (x is a
    temporary)."""

    def __init__(self, p: float, like: Tensor, seeds: list[int] | None = None) -> None:
        self.p, self.device, self.dtype, self.scale = p, like.device, like.dtype, 1.0 / (1.0 - p)
        self.replay, self.seeds = seeds is not None, seeds if seeds is not None else []

    def keep(self, i: int, shape) -> Tensor | None:
        if self.p == 0:
            return None
        if not self.replay:
            self.seeds.append(draw_seed())
        return keep_mask(self.seeds[i], shape, self.p, self.device, self.dtype)

    def apply(self, x: Tensor, keep: Tensor | None) -> Tensor:
        return x if keep is None else x.mul_(keep).mul_(self.scale)

    def drop(self, i: int, x: Tensor) -> Tensor:
        return self.apply(x, self.keep(i, x.shape))


def _self_attention(qkv: Tensor, bias: Tensor, drop: _Masks, N: int, m: int):
    """Candidates' self-attention from the fused projections qkv [B, R, 3 H d] (bos first): the
    probabilities a [B, N, H, m, m + 1] (key 0 = bos), their dropped version ad, the outputs as
    rows [B, R, H d], and q, k, v [B, N, H, m, d], k0, v0 [B, 1, H, 1, d] and bos's dropped
    probability p0 [B, 1, H, 1, 1] (dropout masks 0 and 1)."""
    B, R = qkv.shape[:2]
    H = bias.shape[0]
    d = qkv.shape[-1] // (3 * H)
    qkv = qkv.unflatten(-1, (3, H, d))
    _, k0, v0 = qkv[:, 0, :, None, :, None].unbind(1)  # bos: [B, 1, H, 1, d]
    q, k, v = qkv[:, 1:].view(B, N, m, 3, H, d).permute(3, 0, 1, 4, 2, 5)  # [B, N, H, m, d]
    keep0 = drop.keep(0, (B, 1, H, 1, 1))  # bos attends only to itself: probability 1, dropped
    p0 = v0.new_ones(()) if keep0 is None else keep0 * drop.scale
    s = torch.cat([(q * k0).sum(-1, keepdim=True), q @ k.transpose(-1, -2)], -1).add_(bias[:, 1:])
    a = s.softmax(-1)
    ad = drop.drop(1, a.clone())
    rows = qkv.new_empty(B, R, H, d)
    rows[:, :1] = (p0 * v0)[:, :, :, 0]
    rows[:, 1:].view(B, N, m, H, d).copy_((ad[..., :1] * v0).add_(ad[..., 1:] @ v).transpose(2, 3))
    return a, ad, rows.flatten(-2), (q, k, v, k0, v0, p0)


def _row_keep(drop: _Masks, B: int, N: int, m: int, D: int) -> Tensor | None:
    """The self-attention output's residual dropout as rows [B, R, D]: bos (mask 2), then the
    candidates (mask 3), drawn in the reference's shapes."""
    k0, k = drop.keep(2, (B, 1, 1, D)), drop.keep(3, (B, N, m, D))
    return None if k0 is None else torch.cat([k0.reshape(B, 1, D), k.reshape(B, N * m, D)], 1)


class CandidateBlock(torch.autograd.Function):
    """`CandidateBlock.apply(z, ck, cv, enc_mask, bias, p, eps, *weights)` -> z'.

    z [B, R, D]: per user the bos row, then the N candidates' m positions (row 1 + n m + j);
    ck, cv [B, H, L, d] this layer's cross-attention keys/values; enc_mask [B, L] bool; bias
    [H, m + 1, m + 1] relative position bias with the causal -inf; p the dropout rate; eps the
    norms' epsilon. weights: self-attention norm [D], fused q/k/v [3 H d, D], o [D, H d];
    cross-attention norm [D], q [H d, D], o [D, H d]; feed-forward norm [D], wi [F, D], wo [D, F]."""

    @staticmethod
    def forward(ctx, z, ck, cv, enc_mask, bias, p, eps, *weights):
        g_sa, w_qkv, w_o, g_ca, w_qc, w_oc, g_ff, w_i, w_of = weights
        (B, R, D), (H, d), m = z.shape, ck.shape[1::2], bias.shape[-1] - 1
        N = (R - 1) // m
        drop = _Masks(p, z)
        rs = _rstd(z, eps)
        qkv = (z * rs * g_sa) @ w_qkv.T
        _, _, rows, _ = _self_attention(qkv, bias, drop, N, m)
        z1 = drop.apply(rows @ w_o.T, _row_keep(drop, B, N, m, D)).add_(z)
        rc = _rstd(z1, eps)
        qc = ((z1 * rc * g_ca) @ w_qc.T).unflatten(-1, (H, d)).transpose(1, 2)  # [B, H, R, d]
        P = (qc @ ck.transpose(-1, -2)).masked_fill_(~enc_mask[:, None, None], float("-inf"))
        lse = P.logsumexp(-1, keepdim=True)  # [B, H, R, 1]
        yc = drop.drop(4, P.sub_(lse).exp_()) @ cv
        z2 = drop.drop(5, yc.transpose(1, 2).flatten(-2) @ w_oc.T).add_(z1)
        rf = _rstd(z2, eps)
        u = drop.drop(6, ((z2 * rf * g_ff) @ w_i.T).relu_())
        out = drop.drop(7, u @ w_of.T).add_(z2)
        ctx.save_for_backward(z, rs, qkv, z1, rc, qc, lse, z2, rf, ck, cv, enc_mask, bias, *weights)
        ctx.seeds, ctx.p, ctx.N = drop.seeds, p, N
        return out

    @staticmethod
    def backward(ctx, g):
        z, rs, qkv, z1, rc, qc, lse, z2, rf, ck, cv, enc_mask, bias, *weights = ctx.saved_tensors
        g_sa, w_qkv, w_o, g_ca, w_qc, w_oc, g_ff, w_i, w_of = weights
        (B, R, D), (H, d), m, N = z.shape, ck.shape[1::2], bias.shape[-1] - 1, ctx.N
        drop = _Masks(ctx.p, z, ctx.seeds)

        # feed-forward: out = z2 + drop7(u wo^T), u = drop6(relu(hf wi^T)), hf = norm(z2) g_ff
        hf = z2 * rf * g_ff
        u = drop.drop(6, (hf @ w_i.T).relu_())
        gw = drop.drop(7, g.clone())
        d_wof = _wgrad(gw, u)
        g_pre = torch.ops.aten.threshold_backward(gw @ w_of, u, 0).mul_(drop.scale if ctx.p else 1.0)  # relu passed, kept
        del u
        d_wi, g_hf = _wgrad(g_pre, hf), g_pre @ w_i
        del g_pre
        d_gff = _rowsum(g_hf * z2 * rf)
        g_z2 = _norm_backward(g_hf.mul_(g_ff), z2, rf).add_(g)

        # cross-attention: z2 = z1 + drop5(yc wo^T), yc = drop4(P) cv, P = softmax(qc ck^T)
        hc = z1 * rc * g_ca
        P = (qc @ ck.transpose(-1, -2)).masked_fill_(~enc_mask[:, None, None], float("-inf")).sub_(lse).exp_()
        k4 = drop.keep(4, P.shape)
        Pd = drop.apply(P.clone(), k4)
        gw = drop.drop(5, g_z2.clone())
        d_woc = _wgrad(gw, (Pd @ cv).transpose(1, 2).flatten(-2))
        g_yc = (gw @ w_oc).unflatten(-1, (H, d)).transpose(1, 2)  # [B, H, R, d]
        d_cv = Pd.transpose(-1, -2) @ g_yc
        del Pd
        g_P = drop.apply(g_yc @ cv.transpose(-1, -2), k4)
        g_s = g_P.sub_((g_P * P).sum(-1, keepdim=True)).mul_(P)
        del P, g_P
        d_ck = g_s.transpose(-1, -2) @ qc
        g_qc = (g_s @ ck).transpose(1, 2).flatten(-2)  # [B, R, H d]
        del g_s
        d_wqc, g_hc = _wgrad(g_qc, hc), g_qc @ w_qc
        d_gca = _rowsum(g_hc * z1 * rc)
        g_z1 = _norm_backward(g_hc.mul_(g_ca), z1, rc).add_(g_z2)

        # self-attention: z1 = z + drop2,3(rows wo^T), rows = attention outputs of q/k/v(norm(z) g_sa)
        a, ad, rows, (q, k, v, k0, v0, p0) = _self_attention(qkv, bias, drop, N, m)
        gw = drop.apply(g_z1.clone(), _row_keep(drop, B, N, m, D))
        d_wo = _wgrad(gw, rows)
        g_rows = (gw @ w_o).view(B, R, H, d)
        g_y0 = g_rows[:, :1, :, None]  # [B, 1, H, 1, d]
        g_y = g_rows[:, 1:].view(B, N, m, H, d).transpose(2, 3)  # [B, N, H, m, d]
        g_a = torch.cat([(g_y * v0).sum(-1, keepdim=True), g_y @ v.transpose(-1, -2)], -1)
        keep1 = drop.keep(1, a.shape)
        g_a = drop.apply(g_a, keep1)
        g_s = g_a.sub_((g_a * a).sum(-1, keepdim=True)).mul_(a)
        d_bias = torch.zeros_like(bias)
        d_bias[:, 1:] = g_s.sum((0, 1))
        g_qkv = qkv.new_empty(B, R, 3, H, d)
        g_qkv[:, 0, 0] = 0
        g_qkv[:, 0, 1] = (g_s[..., :1] * q).sum((1, 3))  # bos key, bos value
        g_qkv[:, 0, 2] = (ad[..., :1] * g_y).sum((1, 3)) + (p0 * g_y0)[:, 0, :, 0]
        g_q, g_k, g_v = g_qkv[:, 1:].view(B, N, m, 3, H, d).permute(3, 0, 1, 4, 2, 5)
        g_q.copy_(g_s[..., 1:] @ k).add_(g_s[..., :1] * k0)
        g_k.copy_(g_s[..., 1:].transpose(-1, -2) @ q)
        g_v.copy_(ad[..., 1:].transpose(-1, -2) @ g_y)
        g_qkv = g_qkv.flatten(-3)
        hs = z * rs * g_sa
        d_wqkv, g_hs = _wgrad(g_qkv, hs), g_qkv @ w_qkv
        d_gsa = _rowsum(g_hs * z * rs)
        g_z = _norm_backward(g_hs.mul_(g_sa), z, rs).add_(g_z1)
        return g_z, d_ck, d_cv, None, d_bias, None, None, d_gsa, d_wqkv, d_wo, d_gca, d_wqc, d_woc, d_gff, d_wi, d_wof
