"""Llama: a decoder-only backbone over SID tokens (built from config, never downloaded).

One causal sequence per user: the history tokens (ending with eos, left-padded), then the
target tokens. Position ids come from the attention mask (cumsum - 1, as HF generate does
with left padding), so padding never shifts positions; the logits at the history's last
(eos) position predict target token 1. The HF model is kept as `self.hf`; the forward is
re-written here on its modules so that the history is prefilled once per user (`encode`)
and the N target prefixes (or K beams) of a user all attend to that one history cache: one
score computation per user against the shared history keys plus a small causal one over
each row's own tokens, joined in one softmax. The math follows
`transformers.models.llama.modeling_llama`; tests check it against `self.hf(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from genrec.models.base import BOS, EOS, PAD, Backbone
from genrec.models.head import float_logits, head_logprobs

KV = list[tuple[Tensor, Tensor]]  # per layer (keys, values)


@dataclass
class LlamaEncoding:
    mask: Tensor  # [B, L] bool
    length: Tensor  # [B] history tokens = position id of target token 1
    kv: KV  # per layer: history K (after RoPE), V [B, H, L, d] (repeated to all query heads)
    logits: Tensor  # [B, V] at the last history position (predicts target token 1)

    def split(self, size: int) -> list[LlamaEncoding]:
        """Groups of `size` users."""
        groups = [slice(i, i + size) for i in range(0, len(self.mask), size)]
        return [LlamaEncoding(self.mask[g], self.length[g], [(k[g], v[g]) for k, v in self.kv], self.logits[g])
                for g in groups]


@dataclass
class LlamaState:
    enc: LlamaEncoding
    cache: KV | None  # per layer: K, V [B, K, H, t, d] of each beam's target tokens


class Llama(Backbone):
    def __init__(
        self,
        vocab_size: int,
        max_positions: int,
        hidden_size: int = 128,
        num_layers: int = 8,
        num_heads: int = 8,
        num_kv_heads: int = 8,
        intermediate_size: int = 1024,
        rope_theta: float = 5e5,
        tie_embeddings: bool = True,
        dropout: float = 0.0,
        rms_norm_eps: float = 1e-6,
        memory: str = "checkpoint",
        memory_users: int | None = 16,
        **legacy,
    ) -> None:
        """`memory`: `checkpoint`: training on N > 1 candidates per user (pairwise APAO, S-DPO) runs
        `memory_users` users at a time and keeps only each layer's input, recomputing its
        activations in backward (one more candidate forward; Office, N = 100, batch 128: peak RSS
        13.9 GB -> see README); `none` keeps them. `legacy`: `remat_users` of configs saved before
        `memory` (null: none; n: checkpoint on n users)."""
        super().__init__()
        if "remat_users" in legacy:
            n = legacy.pop("remat_users")
            memory, memory_users = ("checkpoint", n) if n else ("none", memory_users)
        if legacy or memory not in ("checkpoint", "none"):
            raise ValueError(f"Llama: backbone.memory={memory} (checkpoint or none); unknown keys {sorted(legacy)}")
        self.vocab_size = vocab_size
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            max_position_embeddings=max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
            tie_word_embeddings=tie_embeddings,
            attention_dropout=dropout,
            rms_norm_eps=rms_norm_eps,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
        )
        self.hf = LlamaForCausalLM(config)
        self.n_rep, self.head_dim = num_heads // num_kv_heads, config.head_dim
        self.memory, self.memory_users = memory, memory_users

    def _heads(self, x: Tensor) -> Tensor:
        """[..., S, h * d] -> [..., h, S, d]."""
        return x.unflatten(-1, (-1, self.head_dim)).transpose(-2, -3)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, own_mask: Tensor | None, enc: LlamaEncoding | None, i: int):
        """q [B, N, H, S, d] over each row's own keys k, v [B, N, H, t, d] (masked by `own_mask`)
        and, if `enc`, the user's shared history K/V [B, H, L, d] (layer i): one softmax over both."""
        p = self.hf.config.attention_dropout if self.training else 0.0
        if enc is None:  # history prefill (N = 1); SDPA's fused CPU kernel wants 4-D inputs
            y = F.scaled_dot_product_attention(*(x.flatten(0, 1) for x in (q, k, v, own_mask)), dropout_p=p)
            return y.unflatten(0, q.shape[:2])
        B, N, H, S, d = q.shape
        (hk, hv), L = enc.kv[i], enc.mask.shape[1]
        own = q @ k.transpose(-1, -2) * d**-0.5  # [B, N, H, S, t]
        if own_mask is not None:
            own = own.masked_fill(~own_mask, float("-inf"))
        qh = q.transpose(1, 2).reshape(B, H, N * S, d)  # all rows of a user are queries of one product
        hist = (qh @ hk.transpose(-1, -2) * d**-0.5).masked_fill(~enc.mask[:, None, None], float("-inf"))
        scores = torch.cat([hist.view(B, H, N, S, L).transpose(1, 2), own], -1)  # [B, N, H, S, L + t]
        a = F.dropout(scores.softmax(-1), p, self.training)
        yh = a[..., :L].transpose(1, 2).reshape(B, H, N * S, L) @ hv  # [B, H, N * S, d]
        return yh.view(B, H, N, S, d).transpose(1, 2) + a[..., L:] @ v

    def _forward(
        self, tokens: Tensor, pos: Tensor, own_mask: Tensor | None, enc: LlamaEncoding | None, past: KV | None
    ) -> tuple[Tensor, KV]:
        """Final hidden states [B, N, S, D] of S new tokens per row (position ids `pos` [B, N, S])
        after each row's cached `past` tokens and the shared history `enc`; and the new cache."""
        model = self.hf.model
        x = model.embed_tokens(tokens)
        cos, sin = model.rotary_emb(x, pos)
        remat = self._remat(tokens)
        cache = []
        for i in range(len(model.layers)):
            args = (i, x, cos, sin, own_mask, enc, None if past is None else past[i])
            x, k, v = checkpoint(self._layer, *args, use_reentrant=False) if remat else self._layer(*args)
            cache.append((k, v))
        return model.norm(x), cache

    def _layer(self, i: int, x: Tensor, cos: Tensor, sin: Tensor, own_mask: Tensor | None, enc: LlamaEncoding | None,
               past: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor]:
        """Decoder layer i: the new states x and the rows' own keys/values (after `past`)."""
        layer = self.hf.model.layers[i]
        att = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = self._heads(att.q_proj(h)), self._heads(att.k_proj(h)), self._heads(att.v_proj(h))
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=-3)
        k, v = k.repeat_interleave(self.n_rep, -3), v.repeat_interleave(self.n_rep, -3)
        if past is not None:
            k, v = torch.cat([past[0], k], -2), torch.cat([past[1], v], -2)
        y = self._attend(q, k, v, own_mask, enc, i)
        x = x + att.o_proj(y.transpose(-2, -3).flatten(-2))
        return x + layer.mlp(layer.post_attention_layernorm(x)), k, v

    def encode(self, history: Tensor, mask: Tensor) -> LlamaEncoding:
        mask = mask.bool()
        L = history.shape[1]
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(L, L, dtype=torch.bool, device=mask.device).tril()
        own = causal & (mask[:, None, :] | torch.eye(L, dtype=torch.bool, device=mask.device))  # pads see themselves
        x, cache = self._forward(history[:, None], pos[:, None], own[:, None, None], None, None)
        kv = [(k[:, 0], v[:, 0]) for k, v in cache]
        return LlamaEncoding(mask, mask.sum(-1), kv, float_logits(x[:, 0, -1], self.hf.lm_head.weight))

    def _remat(self, tokens: Tensor) -> bool:
        """Recompute the candidates' layer activations in backward (training on N > 1 candidates)?"""
        return self.memory == "checkpoint" and tokens.shape[1] > 1 and self.training and torch.is_grad_enabled()

    def _prefix_states(self, enc: LlamaEncoding, prefix: Tensor) -> Tensor:
        """Final hidden states [B, N, m, D] of the N prefixes [B, N, m] after the shared history."""
        users = self.memory_users
        if self._remat(prefix) and users and len(prefix) > users:  # a group of users at a time
            return torch.cat([self._prefix_states(e, p) for e, p in zip(enc.split(users), prefix.split(users))])
        m = prefix.shape[-1]
        pos = enc.length[:, None, None] + torch.arange(m, device=prefix.device)
        causal = torch.ones(m, m, dtype=torch.bool, device=prefix.device).tril()
        return self._forward(prefix, pos, causal, enc, None)[0]

    def prefix_logits(self, enc: LlamaEncoding, prefix: Tensor) -> Tensor:
        B, N, m = prefix.shape
        first = enc.logits[:, None, None].expand(B, N, 1, -1)
        if m == 0:
            return first
        return torch.cat([first, self.hf.lm_head(self._prefix_states(enc, prefix))], 2)

    def prefix_logprobs(self, enc: LlamaEncoding, prefix: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
        """Straight from the final hidden states (`genrec.models.head`: no [B, N, m + 1, V] tensor)."""
        B, N, m = prefix.shape
        z = enc.logits.to(torch.promote_types(enc.logits.dtype, torch.float32)) / temperature
        first = torch.log_softmax(z, -1).gather(1, tokens[..., 0])[..., None]  # [B, N, 1]
        if m == 0:
            return first
        rows = torch.arange(B * N * m, device=prefix.device).view(B, N, m)
        h = self._prefix_states(enc, prefix).flatten(0, 2)
        return torch.cat([first, head_logprobs(h, self.hf.lm_head.weight, rows, tokens[..., 1:], temperature)], -1)

    def start(self, enc: LlamaEncoding) -> LlamaState:
        return LlamaState(enc, None)

    def step(self, state: LlamaState, tokens: Tensor | None, parents: Tensor | None) -> tuple[Tensor, LlamaState]:
        enc = state.enc
        if tokens is None:  # first step: the history's last logits, one beam
            return enc.logits[:, None], LlamaState(enc, None)
        cache, t = None, 0
        if state.cache is not None:  # re-order the beams' own cache; the history cache stays shared
            rows = torch.arange(parents.shape[0], device=parents.device)[:, None]
            cache = [(k[rows, parents], v[rows, parents]) for k, v in state.cache]
            t = cache[0][0].shape[-2]
        pos = (enc.length + t)[:, None, None].expand(*tokens.shape, 1)
        x, cache = self._forward(tokens[..., None], pos, None, enc, cache)
        return float_logits(x[:, :, -1], self.hf.lm_head.weight), LlamaState(enc, cache)
