"""TIGER's encoder blocks and decoder candidate blocks, with hand-written backward passes.

What autograd keeps for backward dominates training memory (~28 KB per position and layer at the
default size: every norm, projection, softmax and dropout output). These blocks keep the sub-layer
inputs, the fused self-attention q/k/v, the cross-attention queries, the attention log-normalisers
and the dropout seeds (~6-8 KB), and the encoder also its feed-forward hidden layer (4 KB: a history
has ~10x fewer positions than the candidates, and recomputing it would cost a CE step ~6%).
Backward re-derives the rest: norms, softmaxes and masks (elementwise), the attention
probabilities (one q k^T per attention) and, in the candidate blocks, the feed-forward hidden
layer (one matmul, wi); no other projection is recomputed.

`EncoderBlock`: one T5 encoder layer over a batch of histories (training pass of `Tiger.encode`).
`CandidateBlock`: one decoder layer over N candidate prefixes per user (pairwise APAO, S-DPO: N = 100
decodes ~300 positions per user). Same math and the same dropout draws, in the same order, as the
autograd references (`Tiger._candidate_block`, HF's encoder at dropout 0); tests compare values and
gradients (and gradcheck the encoder block with dropout). T5 layout: pre-norm residual sub-layers,
RMS norm without bias, no 1/sqrt(d) in attention, relative position bias in the self-attention,
ReLU feed-forward. Shapes: B users, L history tokens, model width D, H heads of width d,
F feed-forward width; candidate blocks: N candidates, m prefix positions plus the shared bos
(decoded once per user), R = 1 + N m rows per user. In the candidates' self-attention bos attends
to itself and prefix position j to bos and to its own candidate's positions <= j (causal -inf in `bias`).
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


def _scores(q: Tensor, k: Tensor, bias: Tensor | None, mask: Tensor) -> Tensor:
    """Attention scores q k^T (+ bias) [B, H, S, L] with the keys outside mask [B, L] at -inf."""
    s = q @ k.transpose(-1, -2)
    if bias is not None:
        s = s.add_(bias)
    return s.masked_fill_(~mask[:, None, None], float("-inf"))


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor, drop: _Masks, i: int):
    """softmax(q k^T + bias) with dropout mask i, times v: (y [B, H, S, d], lse [B, H, S, 1])."""
    s = _scores(q, k, bias, mask)
    lse = s.logsumexp(-1, keepdim=True)
    return drop.drop(i, s.sub_(lse).exp_()) @ v, lse


def _attend_backward(g_y: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor,
                     lse: Tensor, drop: _Masks, i: int):
    """`_attend`'s output y again and the gradients (d_q, d_k, d_v, d_scores) from g_y = dL/dy."""
    P = _scores(q, k, bias, mask).sub_(lse).exp_()
    keep = drop.keep(i, P.shape)
    Pd = drop.apply(P.clone(), keep)
    y, d_v = Pd @ v, Pd.transpose(-1, -2) @ g_y
    del Pd
    g_P = drop.apply(g_y @ v.transpose(-1, -2), keep)
    g_s = g_P.sub_((g_P * P).sum(-1, keepdim=True)).mul_(P)
    return y, g_s @ k, g_s.transpose(-1, -2) @ q, d_v, g_s


def _ff_hidden(z: Tensor, rf: Tensor, g_ff: Tensor, w_i: Tensor, drop: _Masks, i: int) -> Tensor:
    """The feed-forward hidden layer u = drop_i(relu(norm(z) g_ff wi^T)), norm(z) = z rf."""
    return drop.drop(i, ((z * rf * g_ff) @ w_i.T).relu_())


def _ff(z: Tensor, eps: float, g_ff: Tensor, w_i: Tensor, w_of: Tensor, drop: _Masks, i: int):
    """Feed-forward sub-layer z + drop_{i+1}(u wo^T): (output, norm's 1/RMS rf, hidden layer u)."""
    rf = _rstd(z, eps)
    u = _ff_hidden(z, rf, g_ff, w_i, drop, i)
    return drop.drop(i + 1, u @ w_of.T).add_(z), rf, u


def _ff_backward(g: Tensor, z: Tensor, rf: Tensor, u: Tensor, g_ff: Tensor, w_i: Tensor, w_of: Tensor, drop: _Masks,
                 i: int):
    """`_ff`'s gradients (d_z, d_gff, d_wi, d_wof) from g = dL/d(output)."""
    hf = z * rf * g_ff
    gw = drop.drop(i + 1, g.clone())
    d_wof = _wgrad(gw, u)
    g_pre = torch.ops.aten.threshold_backward(gw @ w_of, u, 0).mul_(drop.scale if drop.p else 1.0)  # relu passed, kept
    d_wi, g_hf = _wgrad(g_pre, hf), g_pre @ w_i
    del g_pre
    d_gff = _rowsum(g_hf * z * rf)
    return _norm_backward(g_hf.mul_(g_ff), z, rf).add_(g), d_gff, d_wi, d_wof


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


def _heads(x: Tensor, H: int) -> Tensor:
    """[B, S, H d] -> [B, H, S, d]."""
    return x.unflatten(-1, (H, -1)).transpose(1, 2)


def _rows(y: Tensor) -> Tensor:
    """[B, H, S, d] -> [B, S, H d]."""
    return y.transpose(1, 2).flatten(-2)


class EncoderBlock(torch.autograd.Function):
    """`EncoderBlock.apply(x, bias, mask, p, eps, *weights)` -> x'.

    x [B, L, D] the histories' states; bias [1, H, L, L] relative position bias (its gradient is
    returned: it is a learned embedding); mask [B, L] bool, the real tokens (padding keys get
    -inf); p the dropout rate; eps the norms' epsilon. weights: self-attention norm [D], fused
    q/k/v [3 H d, D], o [D, H d]; feed-forward norm [D], wi [F, D], wo [D, F]. Dropout masks: 0
    attention probabilities, 1 attention output, 2 feed-forward hidden, 3 feed-forward output."""

    @staticmethod
    def forward(ctx, x, bias, mask, p, eps, *weights):
        g_sa, w_qkv, w_o, g_ff, w_i, w_of = weights
        H = bias.shape[1]
        drop = _Masks(p, x)
        rs = _rstd(x, eps)
        qkv = (x * rs * g_sa) @ w_qkv.T
        q, k, v = (_heads(t, H) for t in qkv.chunk(3, -1))
        y, lse = _attend(q, k, v, bias, mask, drop, 0)
        x1 = drop.drop(1, _rows(y) @ w_o.T).add_(x)
        out, rf, u = _ff(x1, eps, g_ff, w_i, w_of, drop, 2)
        ctx.save_for_backward(x, rs, qkv, lse, x1, rf, u, bias, mask, *weights)
        ctx.seeds, ctx.p = drop.seeds, p
        return out

    @staticmethod
    def backward(ctx, g):
        x, rs, qkv, lse, x1, rf, u, bias, mask, *weights = ctx.saved_tensors
        g_sa, w_qkv, w_o, g_ff, w_i, w_of = weights
        H = bias.shape[1]
        drop = _Masks(ctx.p, x, ctx.seeds)
        g_x1, d_gff, d_wi, d_wof = _ff_backward(g, x1, rf, u, g_ff, w_i, w_of, drop, 2)
        q, k, v = (_heads(t, H) for t in qkv.chunk(3, -1))
        gw = drop.drop(1, g_x1.clone())
        g_y = _heads(gw @ w_o, H)
        y, d_q, d_k, d_v, g_s = _attend_backward(g_y, q, k, v, bias, mask, lse, drop, 0)
        d_wo = _wgrad(gw, _rows(y))
        d_bias = g_s.sum(0, keepdim=True)
        g_qkv = torch.cat([_rows(d_q), _rows(d_k), _rows(d_v)], -1)
        hs = x * rs * g_sa
        d_wqkv, g_hs = _wgrad(g_qkv, hs), g_qkv @ w_qkv
        d_gsa = _rowsum(g_hs * x * rs)
        g_x = _norm_backward(g_hs.mul_(g_sa), x, rs).add_(g_x1)
        return g_x, d_bias, None, None, None, d_gsa, d_wqkv, d_wo, d_gff, d_wi, d_wof


class CandidateBlock(torch.autograd.Function):
    """`CandidateBlock.apply(z, ck, cv, enc_mask, bias, p, eps, *weights)` -> z'.

    z [B, R, D]: per user the bos row, then the N candidates' m positions (row 1 + n m + j);
    ck, cv [B, H, L, d] this layer's cross-attention keys/values; enc_mask [B, L] bool; bias
    [H, m + 1, m + 1] relative position bias with the causal -inf; p the dropout rate; eps the
    norms' epsilon. weights: self-attention norm [D], fused q/k/v [3 H d, D], o [D, H d];
    cross-attention norm [D], q [H d, D], o [D, H d]; feed-forward norm [D], wi [F, D], wo [D, F].
    Dropout masks: 0-3 self-attention (see `_self_attention`, `_row_keep`), 4 cross-attention
    probabilities, 5 cross-attention output, 6 feed-forward hidden, 7 feed-forward output."""

    @staticmethod
    def forward(ctx, z, ck, cv, enc_mask, bias, p, eps, *weights):
        g_sa, w_qkv, w_o, g_ca, w_qc, w_oc, g_ff, w_i, w_of = weights
        (B, R, D), H, m = z.shape, ck.shape[1], bias.shape[-1] - 1
        N = (R - 1) // m
        drop = _Masks(p, z)
        rs = _rstd(z, eps)
        qkv = (z * rs * g_sa) @ w_qkv.T
        _, _, rows, _ = _self_attention(qkv, bias, drop, N, m)
        z1 = drop.apply(rows @ w_o.T, _row_keep(drop, B, N, m, D)).add_(z)
        rc = _rstd(z1, eps)
        qc = _heads((z1 * rc * g_ca) @ w_qc.T, H)  # [B, H, R, d]
        yc, lse = _attend(qc, ck, cv, None, enc_mask, drop, 4)
        z2 = drop.drop(5, _rows(yc) @ w_oc.T).add_(z1)
        out, rf, _ = _ff(z2, eps, g_ff, w_i, w_of, drop, 6)  # u: recomputed in backward (~300 positions per user)
        ctx.save_for_backward(z, rs, qkv, z1, rc, qc, lse, z2, rf, ck, cv, enc_mask, bias, *weights)
        ctx.seeds, ctx.p, ctx.N = drop.seeds, p, N
        return out

    @staticmethod
    def backward(ctx, g):
        z, rs, qkv, z1, rc, qc, lse, z2, rf, ck, cv, enc_mask, bias, *weights = ctx.saved_tensors
        g_sa, w_qkv, w_o, g_ca, w_qc, w_oc, g_ff, w_i, w_of = weights
        (B, R, D), (H, d), m, N = z.shape, ck.shape[1::2], bias.shape[-1] - 1, ctx.N
        drop = _Masks(ctx.p, z, ctx.seeds)

        u = _ff_hidden(z2, rf, g_ff, w_i, drop, 6)
        g_z2, d_gff, d_wi, d_wof = _ff_backward(g, z2, rf, u, g_ff, w_i, w_of, drop, 6)
        del u

        # cross-attention: z2 = z1 + drop5(yc wo^T), yc = attention of qc = norm(z1) g_ca wq^T over ck, cv
        gw = drop.drop(5, g_z2.clone())
        yc, d_qc, d_ck, d_cv, _ = _attend_backward(_heads(gw @ w_oc, H), qc, ck, cv, None, enc_mask, lse, drop, 4)
        d_woc = _wgrad(gw, _rows(yc))
        g_qc = _rows(d_qc)  # [B, R, H d]
        hc = z1 * rc * g_ca
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
