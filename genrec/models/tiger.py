"""TIGER: a T5 encoder-decoder over SID tokens (built from config, never downloaded).

The HF model is kept as `self.hf` (so `self.hf.generate` runs on the same weights). The
encoder is HF's own; the decoder is re-written here on HF's modules so that the N target
prefixes of a user share that user's encoding: each decoder layer's cross-attention
keys/values are projected once per user in `encode`, and all N * (m + 1) decoder positions
(or all K beams) of a user are the queries of one attention call against them. The
self-attention is causal within each candidate (beam) and carries T5's relative position
bias. Decoder input = bos + prefix. The math (and dropout placement) follows
`transformers.models.t5.modeling_t5`; tests check it against `self.hf(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import T5Config, T5ForConditionalGeneration

from genrec.models.base import BOS, EOS, PAD, Backbone

KV = list[tuple[Tensor, Tensor]]  # per decoder layer (keys, values)


@dataclass
class TigerEncoding:
    mask: Tensor  # [B, L] bool
    states: Tensor  # [B, L, D] encoder output
    cross_kv: KV  # per decoder layer: cross-attention K, V [B, H, L, d_kv]


@dataclass
class TigerState:
    enc: TigerEncoding
    cache: KV | None  # per decoder layer: self-attention K, V [B, K, H, t, d_kv] of bos + beam tokens


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
    ) -> None:
        """`max_positions` is accepted for the common backbone signature; T5 positions are relative."""
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
        self.n_heads, self.d_kv = num_heads, d_kv

    def _heads(self, x: Tensor) -> Tensor:
        """[..., S, H * d] -> [..., H, S, d]."""
        return x.unflatten(-1, (self.n_heads, self.d_kv)).transpose(-2, -3)

    def _dropout(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.hf.config.dropout_rate, self.training)

    def encode(self, history: Tensor, mask: Tensor) -> TigerEncoding:
        mask = mask.bool()
        states = self.hf.encoder(input_ids=history, attention_mask=mask).last_hidden_state
        cross = [blk.layer[1].EncDecAttention for blk in self.hf.decoder.block]
        return TigerEncoding(mask, states, [(self._heads(a.k(states)), self._heads(a.v(states))) for a in cross])

    def _self_bias(self, past: int, S: int, like: Tensor) -> Tensor:
        """Relative position bias + causal mask for S new positions after `past`: [1, H, S, past + S]."""
        att = self.hf.decoder.block[0].layer[0].SelfAttention
        bias = att.compute_bias(S, past + S, device=like.device, past_seen_tokens=past).to(like.dtype)
        future = torch.arange(past + S, device=like.device) > past + torch.arange(S, device=like.device)[:, None]
        return bias.masked_fill(future, float("-inf"))

    def _decode(self, enc: TigerEncoding, tokens: Tensor, past: KV | None) -> tuple[Tensor, KV]:
        """Decoder logits [B, N, S, V] for S new tokens per row [B, N, S] after the cached `past`."""
        B, N, S = tokens.shape
        p_att = self.hf.config.dropout_rate if self.training else 0.0
        x = self._dropout(self.hf.decoder.embed_tokens(tokens))  # [B, N, S, D]
        bias = self._self_bias(0 if past is None else past[0][0].shape[-2], S, x)
        cache = []
        for i, (blk, (ck, cv)) in enumerate(zip(self.hf.decoder.block, enc.cross_kv)):
            sa, ca, ff = blk.layer
            # self-attention within each row: [B, N, H, S, d] queries over [B, N, H, t, d] keys
            h, att = sa.layer_norm(x), sa.SelfAttention
            q, k, v = self._heads(att.q(h)), self._heads(att.k(h)), self._heads(att.v(h))
            if past is not None:
                k, v = torch.cat([past[i][0], k], -2), torch.cat([past[i][1], v], -2)
            cache.append((k, v))
            y = F.dropout((q @ k.transpose(-1, -2) + bias).softmax(-1), p_att, self.training) @ v  # T5: no 1/sqrt(d)
            x = x + self._dropout(att.o(y.transpose(-2, -3).flatten(-2)))
            # cross-attention: the N * S positions of a user are the queries of one call
            h, att = ca.layer_norm(x), ca.EncDecAttention
            q = self._heads(att.q(h).reshape(B, N * S, -1))  # [B, H, N * S, d]
            y = F.scaled_dot_product_attention(q, ck, cv, attn_mask=enc.mask[:, None, None], dropout_p=p_att, scale=1.0)
            x = x + self._dropout(att.o(y.transpose(1, 2).reshape(B, N, S, -1)))
            x = ff(x)  # T5LayerFF: norm, wi, act, dropout, wo, dropout, residual
        x = self._dropout(self.hf.decoder.final_layer_norm(x))
        if self.hf.config.scale_decoder_outputs:  # tied embeddings: T5 rescales before lm_head
            x = x * self.hf.config.d_model**-0.5
        return self.hf.lm_head(x), cache

    def prefix_logits(self, enc: TigerEncoding, prefix: Tensor) -> Tensor:
        bos = prefix.new_full((*prefix.shape[:2], 1), BOS)
        return self._decode(enc, torch.cat([bos, prefix], -1), None)[0]

    def start(self, enc: TigerEncoding) -> TigerState:
        return TigerState(enc, None)

    def step(self, state: TigerState, tokens: Tensor | None, parents: Tensor | None) -> tuple[Tensor, TigerState]:
        enc = state.enc
        if tokens is None:  # first step: bos, one beam, empty cache
            tokens, cache = enc.mask.new_full((enc.mask.shape[0], 1), BOS, dtype=torch.long), None
        else:  # re-order the (small) self-attention cache; the cross-attention K/V stay shared
            rows = torch.arange(parents.shape[0], device=parents.device)[:, None]
            cache = [(k[rows, parents], v[rows, parents]) for k, v in state.cache]
        logits, cache = self._decode(enc, tokens[..., None], cache)
        return logits[:, :, -1], TigerState(enc, cache)
