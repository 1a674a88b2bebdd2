"""Llama: a decoder-only backbone over SID tokens (built from config, never downloaded).

One causal sequence per user: the history tokens (ending with eos, left-padded), then the
target tokens. Position ids come from the attention mask (cumsum - 1, as HF generate does
with left padding), so padding never shifts positions; the logits at the history's last
(eos) position predict target token 1. The layers are `genrec.models.llama_block.Layer`s
(the Llama layer math, once). HF's Llama is the reference: `Llama.from_hf` / `to_hf` convert
weights both ways (the tests compare logits), and a new Llama draws its initial weights by
building HF's LlamaForCausalLM with the same config (so a seed gives the weights it always gave).
The history is prefilled once per user (`encode`) and the N target prefixes (or K beams) of a
user all attend to that one history cache: one score computation per user against the shared
history keys plus a small causal one over each row's own tokens, joined in one softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaConfig, LlamaForCausalLM

from genrec.models.base import BOS, EOS, PAD, Backbone
from genrec.models.head import float_logits, head_logprobs
from genrec.models.llama_block import Layer, RMSNorm, Rotary, heads_fit

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
    legacy_key = "model.embed_tokens.weight"  # checkpoints saved when Llama wrapped HF's LlamaForCausalLM
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
        init_from_hf: bool = True,
        **legacy,
    ) -> None:
        """`memory`: `checkpoint`: training on N > 1 candidates per user (pairwise APAO, S-DPO) runs
        `memory_users` users at a time and keeps only each layer's input, recomputing its
        activations in backward (one more candidate forward; Office, N = 100, batch 128: peak RSS
        13.9 GB -> see README); `none` keeps them. `init_from_hf`: draw the initial weights as HF's
        Llama does (False: leave them uninitialised, for `from_hf`). `legacy`: `remat_users` of
        configs saved before `memory` (null: none; n: checkpoint on n users)."""
        super().__init__()
        if "remat_users" in legacy:
            n = legacy.pop("remat_users")
            memory, memory_users = ("checkpoint", n) if n else ("none", memory_users)
        if legacy or memory not in ("checkpoint", "none"):
            raise ValueError(f"Llama: backbone.memory={memory} (checkpoint or none); unknown keys {sorted(legacy)}")
        if not heads_fit(hidden_size, num_heads, num_kv_heads):
            raise ValueError(f"Llama: hidden_size={hidden_size}, num_heads={num_heads}, num_kv_heads={num_kv_heads}: "
                             "heads must split hidden_size into an even head size (RoPE) and kv heads must divide heads")
        self.vocab_size, self.max_positions = vocab_size, max_positions
        self.memory, self.memory_users = memory, memory_users
        self.llama_config = LlamaConfig(
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
        hf = LlamaForCausalLM(self.llama_config) if init_from_hf else None  # HF's init draws, in HF's order
        with torch.device("meta"):  # no RNG draws, no memory: the weights come from `hf` or `from_hf`
            self.embed = nn.Embedding(vocab_size, hidden_size, padding_idx=PAD)  # pad: no gradient, as HF's
            self.layers = nn.ModuleList([Layer(hidden_size, num_heads, num_kv_heads, intermediate_size, dropout,
                                               rms_norm_eps) for _ in range(num_layers)])
            self.norm = RMSNorm(hidden_size, rms_norm_eps)
            self.head = None if tie_embeddings else nn.Linear(hidden_size, vocab_size, bias=False)
        self.to_empty(device="cpu")
        self.rotary = Rotary(hidden_size // num_heads, rope_theta)
        if hf is not None:
            self.load_state_dict(self._from_hf_state(hf.state_dict()))
        self._register_load_state_dict_pre_hook(self._upgrade_state)

    @property
    def head_weight(self) -> Tensor:
        """The output head [V, D] (the embeddings when tied)."""
        return self.embed.weight if self.head is None else self.head.weight

    # --- HF's Llama <-> Llama ----------------------------------------------------------------------------------
    def hf_names(self) -> dict[str, str]:
        """Each of our parameter names -> HF's LlamaForCausalLM name."""
        names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
        if self.head is not None:
            names["head.weight"] = "lm_head.weight"
        sub = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
               "attn.o": "self_attn.o_proj", "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj",
               "mlp.down": "mlp.down_proj", "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
        for i in range(len(self.layers)):
            for ours, hf in sub.items():
                names[f"layers.{i}.{ours}.weight"] = f"model.layers.{i}.{hf}.weight"
        return names

    @classmethod
    def from_hf(cls, hf: LlamaForCausalLM, max_positions: int = 0, **kwargs) -> Llama:
        """A Llama with HF's weights (no biases, SiLU, default RoPE, head_dim = hidden_size / num_heads)."""
        c = hf.config
        rope = c.rope_parameters or {}
        if (c.attention_bias or c.mlp_bias or c.hidden_act != "silu" or rope.get("rope_type", "default") != "default"
                or c.head_dim != c.hidden_size // c.num_attention_heads or c.pretraining_tp != 1):
            raise ValueError("Llama.from_hf: only Llama without biases, with SiLU, default RoPE and head_dim = "
                             "hidden_size / num_heads")
        model = cls(c.vocab_size, max_positions or c.max_position_embeddings, c.hidden_size, c.num_hidden_layers,
                    c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, rope["rope_theta"],
                    c.tie_word_embeddings, c.attention_dropout, c.rms_norm_eps, init_from_hf=False, **kwargs)
        model.load_state_dict(model._from_hf_state(hf.state_dict()))
        return model.to(hf.dtype)

    def to_hf(self) -> LlamaForCausalLM:
        """HF's Llama with these weights (generate, reference logits, export)."""
        return self._export_to(LlamaForCausalLM(self.llama_config))

    # --- the layers --------------------------------------------------------------------------------------------
    def _forward(
        self, tokens: Tensor, pos: Tensor, own_mask: Tensor | None, enc: LlamaEncoding | None, past: KV | None
    ) -> tuple[Tensor, KV]:
        """Final hidden states [B, N, S, D] of S new tokens per row (position ids `pos` [B, N, S])
        after each row's cached `past` tokens and the shared history `enc`; and the new cache."""
        x = self.embed(tokens)
        cos, sin = self.rotary(pos, x.dtype)
        remat = self._remat(tokens)
        cache = []
        for i, layer in enumerate(self.layers):
            args = (x, cos, sin, own_mask, None if enc is None else (*enc.kv[i], enc.mask),
                    None if past is None else past[i])
            x, k, v = checkpoint(layer, *args, use_reentrant=False) if remat else layer(*args)
            cache.append((k, v))
        return self.norm(x), cache

    def encode(self, history: Tensor, mask: Tensor) -> LlamaEncoding:
        mask = mask.bool()
        L = history.shape[1]
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(L, L, dtype=torch.bool, device=mask.device).tril()
        own = causal & (mask[:, None, :] | torch.eye(L, dtype=torch.bool, device=mask.device))  # pads see themselves
        x, cache = self._forward(history[:, None], pos[:, None], own[:, None, None], None, None)
        kv = [(k[:, 0], v[:, 0]) for k, v in cache]
        return LlamaEncoding(mask, mask.sum(-1), kv, float_logits(x[:, 0, -1], self.head_weight))

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
        return torch.cat([first, F.linear(self._prefix_states(enc, prefix), self.head_weight)], 2)

    def prefix_logprobs(self, enc: LlamaEncoding, prefix: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
        """Straight from the final hidden states (`genrec.models.head`: no [B, N, m + 1, V] tensor)."""
        B, N, m = prefix.shape
        z = enc.logits.to(torch.promote_types(enc.logits.dtype, torch.float32)) / temperature
        first = torch.log_softmax(z, -1).gather(1, tokens[..., 0])[..., None]  # [B, N, 1]
        if m == 0:
            return first
        rows = torch.arange(B * N * m, device=prefix.device).view(B, N, m)
        h = self._prefix_states(enc, prefix).flatten(0, 2)
        return torch.cat([first, head_logprobs(h, self.head_weight, rows, tokens[..., 1:], temperature)], -1)

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
        return float_logits(x[:, :, -1], self.head_weight), LlamaState(enc, cache)
