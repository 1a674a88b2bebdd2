"""TIGER: a T5 encoder-decoder over SID tokens (built from config, never downloaded).

The HF model is kept as `self.hf` (so `self.hf.generate` runs on the same weights). The
encoder is HF's own (in training, the same math in `EncoderBlock`s); the decoder is re-written
here on HF's modules so that the N target prefixes of a user share that user's encoding: each
decoder layer's cross-attention keys/values are projected once per user in `encode`, and all
N * (m + 1) decoder positions (or all K beams) of a user are the queries of one attention call
against them. The
self-attention is causal within each candidate (beam) and carries T5's relative position
bias. Decoder input = bos + prefix. The math (and dropout placement) follows
`transformers.models.t5.modeling_t5`; tests check it against `self.hf(...)`. Dropout is
`genrec.models.dropout` (1-byte masks on CPU). Training on N > 1 candidates (pairwise APAO,
S-DPO) runs each decoder block as `genrec.models.tiger_backward.CandidateBlock`, and every
training encoder pass its blocks as `EncoderBlock`: hand-written backward passes that keep
~6-8 KB per position and layer instead of autograd's ~28 KB.

`step` (beam search) is a separate one-position path. `encode` projects every layer's
cross-attention K/V with one matmul; `start` fuses each layer's self-attention q/k/v
weights. The self-attention cache is never copied or re-ordered: each step stores its
beams' K/V once, and each beam keeps the index of its ancestor among every earlier step's
beams. With few beams in a step (beam search), a beam's query meets all of them in one
small batched matmul and its ancestor's score is picked out (the values are summed back
through the same pick); with many (exact full ranking), the ancestors' K/V are gathered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import T5Config, T5ForConditionalGeneration

from genrec.models.base import BOS, EOS, PAD, Backbone
from genrec.models.dropout import dropout, replace_dropout
from genrec.models.head import float_logits, head_logprobs
from genrec.models.tiger_backward import CandidateBlock, EncoderBlock


@dataclass
class TigerEncoding:
    mask: Tensor  # [B, L] bool
    states: Tensor  # [B, L, D] encoder output
    cross_kv: Tensor  # [layers, 2, B, H, L, d_kv]: each decoder layer's cross-attention K, V


@dataclass
class TigerState:
    enc: TigerEncoding
    qkv: list[Tensor]  # per decoder layer: the fused self-attention q/k/v weight [3 * H * d_kv, D]
    cache: list[Tensor]  # per step s <= t: self-attention K, V of that step's beams [layers, 2, B, H, K_s, d_kv]
    anc: Tensor | None  # [t + 1, B, K]: each beam's ancestor among step s's beams (itself at s = t)


def _dots(q: Tensor, k: Tensor, j: Tensor) -> Tensor:
    """q [B, H, K, d] . the key of each beam's ancestor j [B, H, K, 1] among k's beams [B, H, K_s, d]: [B, H, K, 1]."""
    if k.shape[-2] <= 32:  # few beams (beam search): all pairs in one small matmul, then the ancestor's column
        return (q @ k.transpose(-1, -2)).gather(-1, j)
    return (q * k.gather(-2, j.expand_as(q))).sum(-1, keepdim=True)


def _mix(p: Tensor, v: Tensor, j: Tensor) -> Tensor:
    """p [B, H, K, 1] times the value of each beam's ancestor j among v's beams [B, H, K_s, d]: [B, H, K, d]."""
    if v.shape[-2] <= 32:
        return v.new_zeros(*p.shape[:-1], v.shape[-2]).scatter_(-1, j, p) @ v
    return p * v.gather(-2, j.expand(*j.shape[:-1], v.shape[-1]))


class Tiger(Backbone):
    def __init__(
        self,
        vocab_size: int,
        max_positions: int,
        d_model: int = 128,
        num_layers: int = 4,
        num_decoder_layers: int = 4,
        d_ff: int = 1024,
        d_kv: int = 64,
        num_heads: int = 6,
        dropout: float = 0.1,
        num_buckets: int = 32,
        max_distance: int = 128,
        feed_forward_proj: str = "relu",
        lean_users: int | None = 16,
        lean_under_autocast: bool | None = None,
    ) -> None:
        """`max_positions` is accepted for the common backbone signature; T5 positions are relative.
        `lean_users`: training (also under bf16-mixed: these blocks compute in float32) runs the
        encoder blocks and, on N > 1 candidates per user (pairwise APAO, S-DPO), the decoder blocks
        with hand-written backward passes (`genrec.models.tiger_backward`: about a quarter of
        autograd's activation memory), the candidate blocks on this many users per call (bounding
        the temporaries); null: autograd through the HF modules. `lean_under_autocast`: use them
        under autocast too; None: on accelerators only (memory is their limit), not under CPU
        autocast, where bf16 autograd is faster than these float32 blocks (Office, batch 256, one
        core: 203 vs 161 samples per CPU second; float32: 104) and memory rarely the limit."""
        super().__init__()
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        config = T5Config(
            vocab_size=vocab_size,
            d_model=d_model,
            num_layers=num_layers,
            num_decoder_layers=num_decoder_layers,
            d_ff=d_ff,
            d_kv=d_kv,
            num_heads=num_heads,
            dropout_rate=dropout,
            relative_attention_num_buckets=num_buckets,
            relative_attention_max_distance=max_distance,
            feed_forward_proj=feed_forward_proj,
            pad_token_id=PAD,
            eos_token_id=EOS,
            decoder_start_token_id=BOS,
        )
        self.hf = T5ForConditionalGeneration(config)
        replace_dropout(self.hf)
        self.n_heads, self.d_kv, self.lean_users = num_heads, d_kv, lean_users
        self.lean_under_autocast = lean_under_autocast

    def _heads(self, x: Tensor) -> Tensor:
        """[..., S, H * d] -> [..., H, S, d]."""
        return x.unflatten(-1, (self.n_heads, self.d_kv)).transpose(-2, -3)

    def _dropout(self, x: Tensor) -> Tensor:
        return dropout(x, self.hf.config.dropout_rate, self.training)

    def _lean(self) -> bool:
        """Train through the hand-written block backward (`genrec.models.tiger_backward`)?"""
        device = self.hf.shared.weight.device.type
        if torch.is_autocast_enabled(device) and not (
                device != "cpu" if self.lean_under_autocast is None else self.lean_under_autocast):
            return False
        return bool(self.lean_users and self.training and torch.is_grad_enabled()
                    and self.hf.config.feed_forward_proj == "relu")

    def encode(self, history: Tensor, mask: Tensor) -> TigerEncoding:
        mask = mask.bool()
        if self._lean():
            states = self._lean_encoder(history, mask)
        else:
            states = self.hf.encoder(input_ids=history, attention_mask=mask).last_hidden_state
        cross = [blk.layer[1].EncDecAttention for blk in self.hf.decoder.block]
        w = torch.cat([torch.cat([a.k.weight, a.v.weight]) for a in cross])  # all layers' K, V: one matmul
        kv = F.linear(states, w).unflatten(-1, (len(cross), 2, self.n_heads, self.d_kv))  # [B, L, layers, 2, H, d]
        return TigerEncoding(mask, states, kv.permute(2, 3, 0, 4, 1, 5))

    def _lean_encoder(self, history: Tensor, mask: Tensor) -> Tensor:
        """HF's T5 encoder forward, its blocks as `EncoderBlock`s."""
        enc, L = self.hf.encoder, history.shape[1]
        x = self._dropout(enc.embed_tokens(history))
        bias = enc.block[0].layer[0].SelfAttention.compute_bias(L, L, device=x.device).to(x.dtype)  # [1, H, L, L]
        with torch.autocast(x.device.type, enabled=False):  # see `_decode`
            for blk in enc.block:
                eps = blk.layer[0].layer_norm.variance_epsilon
                x = EncoderBlock.apply(x, bias, mask, self.hf.config.dropout_rate, eps, *self._block_weights(blk))
        return self._dropout(enc.final_layer_norm(x))

    def _self_bias(self, past: int, S: int, like: Tensor) -> Tensor:
        """Relative position bias + causal mask for S new positions after `past`: [H, S, past + S]."""
        att = self.hf.decoder.block[0].layer[0].SelfAttention
        bias = att.compute_bias(S, past + S, device=like.device, past_seen_tokens=past)[0].to(like.dtype)
        future = torch.arange(past + S, device=like.device) > past + torch.arange(S, device=like.device)[:, None]
        return bias.masked_fill(future, float("-inf"))

    def _cross_ff(self, blk, x: Tensor, enc: TigerEncoding, i: int) -> Tensor:
        """Cross-attention then feed-forward of decoder block `blk` (layer i) for x [B, R, D]:
        the R positions of a user are the queries of one attention call."""
        _, ca, ff = blk.layer
        h, att = ca.layer_norm(x), ca.EncDecAttention
        q, (ck, cv) = self._heads(att.q(h)), enc.cross_kv[i]
        if self.training and self.hf.config.dropout_rate > 0:  # explicit, for the 1-byte dropout mask
            s = (q @ ck.transpose(-1, -2)).masked_fill(~enc.mask[:, None, None], float("-inf"))
            y = self._dropout(s.softmax(-1)) @ cv
        else:
            y = F.scaled_dot_product_attention(q, ck, cv, attn_mask=enc.mask[:, None, None], scale=1.0)
        x = x + self._dropout(att.o(y.transpose(1, 2).flatten(-2)))
        return ff(x)  # T5LayerFF: norm, wi, act, dropout, wo, dropout, residual

    def _head_input(self, x: Tensor) -> Tensor:
        """The lm_head's input for decoder states x: final norm, dropout, T5's rescaling."""
        x = self._dropout(self.hf.decoder.final_layer_norm(x))
        if self.hf.config.scale_decoder_outputs:  # tied embeddings: T5 rescales before lm_head
            x = x * self.hf.config.d_model**-0.5
        return x

    def prefix_logits(self, enc: TigerEncoding, prefix: Tensor) -> Tensor:
        B, N, m = prefix.shape
        z = self.hf.lm_head(self._decode(enc, prefix))  # [B, 1 + N m, V]
        return torch.cat([z[:, :1, None].expand(B, N, 1, -1), z[:, 1:].view(B, N, m, z.shape[-1])], 2)

    def prefix_logprobs(self, enc: TigerEncoding, prefix: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
        """Straight from the head's input rows (`genrec.models.head`: no [B, N, m + 1, V] tensor)."""
        B, N, m = prefix.shape
        h = self._decode(enc, prefix)
        R = h.shape[1]
        pos = torch.cat([prefix.new_zeros(N, 1), 1 + torch.arange(N * m, device=prefix.device).view(N, m)], 1)
        rows = torch.arange(B, device=prefix.device)[:, None, None] * R + pos  # [B, N, m + 1]
        return head_logprobs(h.flatten(0, 1), self.hf.lm_head.weight, rows, tokens, temperature)

    def _decode(self, enc: TigerEncoding, prefix: Tensor) -> Tensor:
        """The lm_head's inputs [B, 1 + N m, D] for bos + prefix [B, N, m]: per user the bos row,
        then candidate n's position j at row 1 + n m + j. The bos position is the same for all N
        candidates of a user, so it is decoded once per user and its key/value shared by the
        candidates' self-attention (a quarter fewer decoder positions at T = 4)."""
        B, N, m = prefix.shape
        x0 = self._dropout(self.hf.decoder.embed_tokens(prefix.new_full((B, 1, 1), BOS)))  # [B, 1, 1, D]
        x = self._dropout(self.hf.decoder.embed_tokens(prefix))  # [B, N, m, D]
        bias = self._self_bias(0, m + 1, x)  # [H, m + 1, m + 1]
        z = torch.cat([x0.reshape(B, 1, -1), x.reshape(B, N * m, x.shape[-1])], 1)
        if N > 1 and m > 0 and self._lean():
            # The hand-written blocks compute in the parameters' dtype with autocast off (under
            # bf16-mixed too: their backward runs outside autocast, so forward must not run in bf16).
            p, users = self.hf.config.dropout_rate, self.lean_users
            for i, blk in enumerate(self.hf.decoder.block):
                w, eps, (ck, cv) = self._block_weights(blk), blk.layer[0].layer_norm.variance_epsilon, enc.cross_kv[i]
                ck, cv = ck.to(z.dtype), cv.to(z.dtype)  # bf16 from the encoder's autocast projection
                with torch.autocast(z.device.type, enabled=False):
                    z = torch.cat([CandidateBlock.apply(*g, bias, p, eps, *w) for g in
                                   zip(z.split(users), ck.split(users), cv.split(users), enc.mask.split(users))])
        else:
            for i, blk in enumerate(self.hf.decoder.block):
                z = self._candidate_block(blk, i, enc, bias, z, N, m)
        return self._head_input(z)

    @staticmethod
    def _block_weights(blk) -> list[Tensor]:
        """A block's weights in `EncoderBlock`'s / `CandidateBlock`'s order (a decoder block also
        has its cross-attention's, between the self-attention's and the feed-forward's)."""
        sa, *cross, ff = blk.layer
        att = sa.SelfAttention
        weights = [sa.layer_norm.weight, torch.cat([att.q.weight, att.k.weight, att.v.weight]), att.o.weight]
        for ca in cross:
            weights += [ca.layer_norm.weight, ca.EncDecAttention.q.weight, ca.EncDecAttention.o.weight]
        return weights + [ff.layer_norm.weight, ff.DenseReluDense.wi.weight, ff.DenseReluDense.wo.weight]

    def _candidate_block(self, blk, i: int, enc: TigerEncoding, bias: Tensor, z: Tensor, N: int, m: int) -> Tensor:
        """Decoder layer i (autograd) for rows z [B, 1 + N m, D]: the shared bos, then the candidates' positions."""
        B, _, D = z.shape
        sa, att = blk.layer[0], blk.layer[0].SelfAttention
        h = sa.layer_norm(z)
        h0, h = h[:, :1, None], h[:, 1:].view(B, N, m, D)
        q0, k0, v0 = (self._heads(f(h0)) for f in (att.q, att.k, att.v))  # [B, 1, H, 1, d]
        q, k, v = (self._heads(f(h)) for f in (att.q, att.k, att.v))  # [B, N, H, m, d]
        # bos attends to itself; prefix position j to bos and to its own row's positions <= j (T5: no 1/sqrt(d))
        y0 = self._dropout((q0 @ k0.transpose(-1, -2) + bias[:, :1, :1]).softmax(-1)) @ v0
        s = torch.cat([(q * k0).sum(-1, keepdim=True), q @ k.transpose(-1, -2)], -1) + bias[:, 1:]
        a = self._dropout(s.softmax(-1))
        y = a[..., :1] * v0 + a[..., 1:] @ v
        x0 = z[:, :1] + self._dropout(att.o(y0.transpose(-2, -3).flatten(-2))).reshape(B, 1, D)
        x = z[:, 1:] + self._dropout(att.o(y.transpose(-2, -3).flatten(-2))).reshape(B, N * m, D)
        return self._cross_ff(blk, torch.cat([x0, x], 1), enc, i)

    def start(self, enc: TigerEncoding) -> TigerState:
        atts = [blk.layer[0].SelfAttention for blk in self.hf.decoder.block]
        return TigerState(enc, [torch.cat([a.q.weight, a.k.weight, a.v.weight]) for a in atts], [], None)

    def step(self, state: TigerState, tokens: Tensor | None, parents: Tensor | None) -> tuple[Tensor, TigerState]:
        """One new position for K beams; `state` is never modified (it may be stepped again)."""
        enc, B, H, d = state.enc, state.enc.mask.shape[0], self.n_heads, self.d_kv
        if tokens is None:  # first step: bos, one beam
            tokens = enc.mask.new_full((B, 1), BOS, dtype=torch.long)
        t, K = len(state.cache), tokens.shape[1]
        here = torch.arange(K, device=tokens.device).expand(1, B, K)
        anc = here if t == 0 else torch.cat([state.anc.gather(2, parents.expand(t, -1, -1)), here])  # [t + 1, B, K]
        idx = anc[..., None, :, None].expand(-1, -1, H, -1, 1)  # [t + 1, B, H, K, 1]
        x = self._dropout(self.hf.decoder.embed_tokens(tokens))  # [B, K, D]
        kv = x.new_empty(len(state.qkv), 2, B, H, K, d)  # this step's self-attention K, V, all layers
        cache = [*state.cache, kv]
        bias = self._self_bias(t, 1, x)  # [H, 1, t + 1]
        for i, (blk, wqkv) in enumerate(zip(self.hf.decoder.block, state.qkv)):
            sa = blk.layer[0]
            qkv = F.linear(sa.layer_norm(x), wqkv).view(B, K, 3, H, d)
            kv[i] = qkv[:, :, 1:].permute(2, 0, 3, 1, 4)
            q = qkv[:, :, 0].transpose(1, 2).contiguous()  # [B, H, K, d]
            w = torch.cat([_dots(q, c[i, 0], j) for c, j in zip(cache, idx)], -1)  # T5: no 1/sqrt(d)
            p = self._dropout((w + bias).softmax(-1))  # [B, H, K, t + 1]
            y = sum(_mix(p[..., s : s + 1], c[i, 1], j) for s, (c, j) in enumerate(zip(cache, idx)))  # [B, H, K, d]
            x = x + self._dropout(sa.SelfAttention.o(y.transpose(1, 2).flatten(-2)))
            x = self._cross_ff(blk, x, enc, i)
        return float_logits(self._head_input(x), self.hf.lm_head.weight), TigerState(enc, state.qkv, cache, anc)
