"""TIGER: a T5 encoder-decoder over SID tokens (built from config, never downloaded).

Both stacks are `genrec.models.t5_block.Block`s (the T5 layer math, once). HF's T5 is the
reference: `Tiger.from_hf` / `to_hf` convert weights both ways (the tests compare logits), and a
new Tiger draws its initial weights by building HF's T5 with the same config (so a seed gives the
weights it always gave). The decoder lets the N target prefixes of a user share that user's
encoding: all N * (m + 1) decoder positions (or all K beams) of a user are the queries of one
cross-attention call, against every decoder layer's keys/values projected once per user
(`Tiger.cross_kv`: beam search, many candidates) or, when the queries are fewer than that
projection costs (teacher forcing of CE: 1 + m per user), straight against the encoder states
(`Block.absorbed_cross`: (q W_k) s^T, no K/V projected). The self-attention is causal within
each candidate (beam) and carries T5's relative position bias. Decoder input = bos + prefix.
Dropout is `genrec.models.dropout` (1-byte masks on CPU).

Memory in training (`memory`): `manual` runs every training encoder block, and on N > 1
candidates per user (pairwise APAO, S-DPO) every decoder block, through the hand-written backward
passes of `genrec.models.tiger_backward` (~6-8 KB per position and layer instead of autograd's ~28
KB; same math and dropout draws); `checkpoint` recomputes those blocks in backward
(`torch.utils.checkpoint`); `none` keeps autograd's activations.

`step` (beam search) is a one-position path through the same blocks. `start` projects every
layer's cross-attention K/V with one matmul (`cross_kv`) and fuses each layer's self-attention q/k/v
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
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import T5Config, T5ForConditionalGeneration

from genrec.models.base import BOS, EOS, PAD, Backbone
from genrec.models.dropout import dropout
from genrec.models.head import float_logits, head_logprobs
from genrec.models.t5_block import Attend, Attention, Block, KeyBias, Norm, RelativeBias
from genrec.models.tiger_backward import CandidateBlock, EncoderBlock


@dataclass
class TigerEncoding:
    mask: Tensor  # [B, L] bool
    states: Tensor  # [B, L, D] encoder output


@dataclass
class TigerState:
    enc: TigerEncoding
    cross_kv: Tensor  # [layers, 2, B, H, L, d_kv]: `Tiger.cross_kv`, projected once per search
    qkv: list[Tensor]  # per decoder layer: the fused self-attention q/k/v weight [3 * H * d_kv, D]
    cache: list[Tensor]  # per step s <= t: self-attention K, V of that step's beams [layers, 2, B, H, K_s, d_kv]
    anc: Tensor | None  # [t + 1, B, K]: each beam's ancestor among step s's beams (itself at s = t)


def absorbs(queries: int, keys: int, d_kv: int) -> bool:
    """Whether a user's `queries` decoder positions meet its `keys` encoder states directly (`Block.absorbed_cross`)
    rather than K/V projected from them: per head and layer the first costs ~queries (d_kv + keys) multiply-adds per
    model dimension, the projection ~d_kv keys."""
    return queries * (d_kv + keys) < d_kv * keys


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
    legacy_key = "shared.weight"  # checkpoints saved when Tiger wrapped HF's T5
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
        memory: str = "manual",
        memory_users: int | None = 16,
        memory_under_autocast: bool | None = None,
        init_from_hf: bool = True,
        **legacy,
    ) -> None:
        """`max_positions` is accepted for the common backbone signature; T5 positions are relative.
        `memory` (see the module docstring): how training saves activation memory, `manual` also
        under bf16-mixed (these blocks compute in float32). `memory_users`: users per decoder
        call of the saving path on N > 1 candidates (bounds the temporaries). `memory_under_autocast`:
        save under autocast too; None: on accelerators only (memory is their limit), not under CPU
        autocast, where bf16 autograd is faster than the float32 manual blocks (Office, batch 256,
        one core: 203 vs 161 samples per CPU second; float32: 104) and memory rarely the limit.
        `init_from_hf`: draw the initial weights as HF's T5 does (False: leave them uninitialised,
        for `from_hf`). `legacy`: `lean_users` / `lean_under_autocast` of configs saved before
        `memory` (lean_users null: none; n: manual on n users)."""
        super().__init__()
        if "lean_users" in legacy:
            n = legacy.pop("lean_users")
            memory, memory_users = ("manual", n) if n else ("none", memory_users)
        memory_under_autocast = legacy.pop("lean_under_autocast", memory_under_autocast)
        if legacy:
            raise TypeError(f"Tiger: unknown arguments {sorted(legacy)}")
        if feed_forward_proj != "relu":
            raise ValueError(f"backbone.feed_forward_proj={feed_forward_proj}: only relu (T5 v1.0) is implemented")
        if memory not in ("manual", "checkpoint", "none"):
            raise ValueError(f"backbone.memory={memory}: manual, checkpoint or none")
        self.vocab_size, self.max_positions, self.p = vocab_size, max_positions, dropout
        self.memory, self.memory_users, self.memory_under_autocast = memory, memory_users, memory_under_autocast
        self.t5_config = T5Config(
            vocab_size=vocab_size, d_model=d_model, num_layers=num_layers, num_decoder_layers=num_decoder_layers,
            d_ff=d_ff, d_kv=d_kv, num_heads=num_heads, dropout_rate=dropout, relative_attention_num_buckets=num_buckets,
            relative_attention_max_distance=max_distance, feed_forward_proj=feed_forward_proj, pad_token_id=PAD,
            eos_token_id=EOS, decoder_start_token_id=BOS)
        hf = T5ForConditionalGeneration(self.t5_config) if init_from_hf else None  # HF's init draws, in HF's order
        with torch.device("meta"):  # no RNG draws, no memory: the weights come from `hf` or `from_hf`
            self.embed = nn.Embedding(vocab_size, d_model)  # shared by both stacks and the (tied) head
            block = dict(d_model=d_model, num_heads=num_heads, d_kv=d_kv, d_ff=d_ff, p=dropout)
            self.encoder = nn.ModuleList(
                [Block(**block, bias=RelativeBias(num_heads, num_buckets, max_distance, True) if i == 0 else None)
                 for i in range(num_layers)])
            self.encoder_norm = Norm(d_model)
            self.decoder = nn.ModuleList(
                [Block(**block, cross=True, bias=RelativeBias(num_heads, num_buckets, max_distance, False)
                       if i == 0 else None) for i in range(num_decoder_layers)])
            self.decoder_norm = Norm(d_model)
        self.to_empty(device="cpu")
        if hf is not None:
            self.load_state_dict(self._from_hf_state(hf.state_dict()))
        self.n_heads, self.d_kv, self.head_scale = num_heads, d_kv, d_model**-0.5  # T5 rescales before the tied head
        self._register_load_state_dict_pre_hook(self._upgrade_state)

    # --- HF's T5 <-> Tiger -------------------------------------------------------------------------------------
    def hf_names(self) -> dict[str, str]:
        """Each of our parameter names -> HF's T5ForConditionalGeneration name."""
        names = {"embed.weight": "shared.weight", "encoder_norm.weight": "encoder.final_layer_norm.weight",
                 "decoder_norm.weight": "decoder.final_layer_norm.weight"}
        for stack in ("encoder", "decoder"):
            for i, blk in enumerate(getattr(self, stack)):
                ours, hf = f"{stack}.{i}.", f"{stack}.block.{i}.layer."
                ff = "2" if stack == "decoder" else "1"
                names[ours + "attn_norm.weight"] = hf + "0.layer_norm.weight"
                names[ours + "ff_norm.weight"] = hf + ff + ".layer_norm.weight"
                for w in ("wi", "wo"):
                    names[ours + f"ff.{w}.weight"] = hf + f"{ff}.DenseReluDense.{w}.weight"
                for w in "qkvo":
                    names[ours + f"attn.{w}.weight"] = hf + f"0.SelfAttention.{w}.weight"
                    if stack == "decoder":
                        names[ours + f"cross.{w}.weight"] = hf + f"1.EncDecAttention.{w}.weight"
                if stack == "decoder":
                    names[ours + "cross_norm.weight"] = hf + "1.layer_norm.weight"
                if i == 0:
                    names[ours + "attn.bias.relative_attention_bias.weight"] = \
                        hf + "0.SelfAttention.relative_attention_bias.weight"
        return names

    @classmethod
    def from_hf(cls, t5: T5ForConditionalGeneration, max_positions: int = 0, **kwargs) -> Tiger:
        """A Tiger with the weights of HF's T5 (tied head, ReLU feed-forward, T5 v1.0 layout)."""
        c = t5.config
        if not c.tie_word_embeddings or c.feed_forward_proj != "relu":
            raise ValueError("Tiger.from_hf: only T5 with tied embeddings and a ReLU feed-forward (T5 v1.0)")
        model = cls(c.vocab_size, max_positions, c.d_model, c.num_layers, c.num_decoder_layers, c.d_ff, c.d_kv,
                    c.num_heads, c.dropout_rate, c.relative_attention_num_buckets, c.relative_attention_max_distance,
                    init_from_hf=False, **kwargs)
        model.load_state_dict(model._from_hf_state(t5.state_dict()))
        return model.to(t5.dtype)

    def to_hf(self) -> T5ForConditionalGeneration:
        """HF's T5 with these weights (generate, reference logits, export)."""
        return self._export_to(T5ForConditionalGeneration(self.t5_config))

    # --- shared pieces -----------------------------------------------------------------------------------------
    def _heads(self, x: Tensor) -> Tensor:
        """[..., S, H * d] -> [..., H, S, d]."""
        return x.unflatten(-1, (self.n_heads, self.d_kv)).transpose(-2, -3)

    def _dropout(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def _saving(self) -> str:
        """The memory saving in effect: `self.memory` when training with gradients, else "none"."""
        device = self.embed.weight.device.type
        if not (self.training and torch.is_grad_enabled()) or (torch.is_autocast_enabled(device) and not (
                device != "cpu" if self.memory_under_autocast is None else self.memory_under_autocast)):
            return "none"
        return self.memory

    def encode(self, history: Tensor, mask: Tensor) -> TigerEncoding:
        mask, L = mask.bool(), history.shape[1]
        x = self._dropout(self.embed(history))
        bias = self.encoder[0].attn.bias(L, device=x.device)[None]  # [1, H, L, L]
        saving = self._saving()
        if saving == "manual":
            bias = bias.to(x.dtype)
            with torch.autocast(x.device.type, enabled=False):  # see `_decode`
                for blk in self.encoder:
                    x = EncoderBlock.apply(x, bias, mask, self.p, blk.attn_norm.eps, *blk.weights())
        else:
            bias = self._key_bias(self.encoder[0], bias, mask, x)
            for blk in self.encoder:
                attend = blk.plain_attention(bias, mask)
                x = checkpoint(blk, x, attend, use_reentrant=False) if saving == "checkpoint" else blk(x, attend)
        return TigerEncoding(mask, self._dropout(self.encoder_norm(x)))

    @staticmethod
    def _key_bias(blk: Block, bias: Tensor, mask: Tensor, x: Tensor) -> KeyBias:
        """A stack's `KeyBias` for `plain_attention` over x [B, S, D]: the scores' dtype is autocast's (float64 stays
        float64), else x's."""
        device = x.device.type
        autocast = torch.is_autocast_enabled(device) and x.dtype != torch.float64
        dtype = torch.get_autocast_dtype(device) if autocast else x.dtype
        return KeyBias(bias, mask, dtype if blk.explicit(dtype, x.device) else None)

    def cross_kv(self, enc: TigerEncoding) -> Tensor:
        """[layers, 2, B, H, L, d_kv]: every decoder layer's cross-attention K, V of the encoder states, one matmul.
        Training iterates it (unbind: one gradient stack); indexing it per layer would back-propagate through a
        zero-filled full-size gradient per layer (~8% of a TIGER CE step)."""
        w = torch.cat([blk.cross_kv_weight() for blk in self.decoder])
        kv = F.linear(enc.states, w).unflatten(-1, (len(self.decoder), 2, self.n_heads, self.d_kv))  # [B, L, layers, 2, H, d]
        return kv.permute(2, 3, 0, 4, 1, 5)

    def _self_bias(self, past: int, S: int, like: Tensor) -> Tensor:
        """Relative position bias + causal mask for S new positions after `past`: [H, S, past + S]."""
        bias = self.decoder[0].attn.bias(S, past, device=like.device).to(like.dtype)
        future = torch.arange(past + S, device=like.device) > past + torch.arange(S, device=like.device)[:, None]
        return bias.masked_fill(future, float("-inf"))

    def _head_input(self, x: Tensor) -> Tensor:
        """The head's input for decoder states x: final norm, dropout, T5's rescaling (tied embeddings)."""
        return self._dropout(self.decoder_norm(x)) * self.head_scale

    # --- teacher forcing and candidate scoring -------------------------------------------------------------------
    def prefix_logits(self, enc: TigerEncoding, prefix: Tensor) -> Tensor:
        B, N, m = prefix.shape
        z = F.linear(self._decode(enc, prefix), self.embed.weight)  # [B, 1 + N m, V]
        return torch.cat([z[:, :1, None].expand(B, N, 1, -1), z[:, 1:].view(B, N, m, z.shape[-1])], 2)

    def prefix_logprobs(self, enc: TigerEncoding, prefix: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
        """Straight from the head's input rows (`genrec.models.head`: no [B, N, m + 1, V] tensor)."""
        B, N, m = prefix.shape
        h = self._decode(enc, prefix)
        R = h.shape[1]
        pos = torch.cat([prefix.new_zeros(N, 1), 1 + torch.arange(N * m, device=prefix.device).view(N, m)], 1)
        rows = torch.arange(B, device=prefix.device)[:, None, None] * R + pos  # [B, N, m + 1]
        return head_logprobs(h.flatten(0, 1), self.embed.weight, rows, tokens, temperature)

    def _decode(self, enc: TigerEncoding, prefix: Tensor) -> Tensor:
        """The head's inputs [B, 1 + N m, D] for bos + prefix [B, N, m]: per user the bos row,
        then candidate n's position j at row 1 + n m + j. The bos position is the same for all N
        candidates of a user, so it is decoded once per user and its key/value shared by the
        candidates' self-attention (a quarter fewer decoder positions at T = 4). One candidate (N = 1, teacher
        forcing) is one causal sequence of m + 1 rows, attended as the encoder's (`Block.plain_attention`: ~7% of a
        CE training step on CPU against the candidates' pattern, same math)."""
        B, N, m = prefix.shape
        x0 = self._dropout(self.embed(prefix.new_full((B, 1, 1), BOS)))  # [B, 1, 1, D]
        x = self._dropout(self.embed(prefix))  # [B, N, m, D]
        bias = self._self_bias(0, m + 1, x)  # [H, m + 1, m + 1]
        z = torch.cat([x0.reshape(B, 1, -1), x.reshape(B, N * m, x.shape[-1])], 1)
        saving = self._saving() if N > 1 and m > 0 else "none"
        if saving == "manual":
            # The hand-written blocks compute in the parameters' dtype with autocast off (under
            # bf16-mixed too: their backward runs outside autocast, so forward must not run in bf16).
            users = self.memory_users or B
            for blk, (ck, cv) in zip(self.decoder, self.cross_kv(enc)):  # unbind, not indexing: see `cross_kv`
                w = blk.weights()
                ck, cv = ck.to(z.dtype), cv.to(z.dtype)  # bf16 from the encoder's autocast projection
                with torch.autocast(z.device.type, enabled=False):
                    z = torch.cat([CandidateBlock.apply(*g, bias, self.p, blk.attn_norm.eps, *w) for g in
                                   zip(z.split(users), ck.split(users), cv.split(users), enc.mask.split(users))])
        else:
            if absorbs(z.shape[1], enc.mask.shape[1], self.d_kv):
                crosses = [blk.absorbed_cross(enc.states, enc.mask) for blk in self.decoder]
            else:
                crosses = [blk.projected_cross(k, v, enc.mask) for blk, (k, v) in zip(self.decoder, self.cross_kv(enc))]
            if N == 1:  # one candidate (teacher forcing): bos + prefix is one causal sequence, attended as the encoder's
                ones = z.new_ones(z.shape[:2], dtype=torch.bool)
                causal = self._key_bias(self.decoder[0], bias[None], ones, z)
            for blk, cross in zip(self.decoder, crosses):
                attend = blk.plain_attention(causal, ones) if N == 1 else self._candidate_attention(blk, bias, N, m)
                args = (z, attend, cross)
                z = checkpoint(blk, *args, use_reentrant=False) if saving == "checkpoint" else blk(*args)
        return self._head_input(z)

    def _candidate_attention(self, blk: Block, bias: Tensor, N: int, m: int) -> Attend:
        """Self-attention over rows [B, 1 + N m, D] (the shared bos, then the candidates' positions):
        bos attends to itself; prefix position j to bos and to its own candidate's positions <= j."""
        def attend(att: Attention, h: Tensor) -> Tensor:
            B, _, D = h.shape
            h0, h = h[:, :1, None], h[:, 1:].view(B, N, m, D)
            q0, k0, v0 = (att.heads(f(h0)) for f in (att.q, att.k, att.v))  # [B, 1, H, 1, d]
            q, k, v = (att.heads(f(h)) for f in (att.q, att.k, att.v))  # [B, N, H, m, d]
            y0 = blk.drop((q0 @ k0.transpose(-1, -2) + bias[:, :1, :1]).softmax(-1)) @ v0  # T5: no 1/sqrt(d)
            s = torch.cat([(q * k0).sum(-1, keepdim=True), q @ k.transpose(-1, -2)], -1) + bias[:, 1:]
            a = blk.drop(s.softmax(-1))
            y = a[..., :1] * v0 + a[..., 1:] @ v
            y0 = blk.drop(att.o(y0.transpose(-2, -3).flatten(-2))).reshape(B, 1, D)
            return torch.cat([y0, blk.drop(att.o(y.transpose(-2, -3).flatten(-2))).reshape(B, N * m, D)], 1)
        return attend

    # --- beam search -------------------------------------------------------------------------------------------
    def start(self, enc: TigerEncoding) -> TigerState:
        return TigerState(enc, self.cross_kv(enc),
                          [torch.cat([b.attn.q.weight, b.attn.k.weight, b.attn.v.weight]) for b in self.decoder], [], None)

    def step(self, state: TigerState, tokens: Tensor | None, parents: Tensor | None) -> tuple[Tensor, TigerState]:
        """One new position for K beams; `state` is never modified (it may be stepped again)."""
        enc, B, H, d = state.enc, state.enc.mask.shape[0], self.n_heads, self.d_kv
        if tokens is None:  # first step: bos, one beam
            tokens = enc.mask.new_full((B, 1), BOS, dtype=torch.long)
        t, K = len(state.cache), tokens.shape[1]
        here = torch.arange(K, device=tokens.device).expand(1, B, K)
        anc = here if t == 0 else torch.cat([state.anc.gather(2, parents.expand(t, -1, -1)), here])  # [t + 1, B, K]
        idx = anc[..., None, :, None].expand(-1, -1, H, -1, 1)  # [t + 1, B, H, K, 1]
        x = self._dropout(self.embed(tokens))  # [B, K, D]
        kv = x.new_empty(len(state.qkv), 2, B, H, K, d)  # this step's self-attention K, V, all layers
        cache = [*state.cache, kv]
        bias = self._self_bias(t, 1, x)  # [H, 1, t + 1]
        for i, (blk, wqkv) in enumerate(zip(self.decoder, state.qkv)):
            cross = blk.projected_cross(*state.cross_kv[i], enc.mask)
            x = blk(x, self._beam_attention(blk, wqkv, i, kv, cache, idx, bias), cross)
        return float_logits(self._head_input(x), self.embed.weight), TigerState(enc, state.cross_kv, state.qkv, cache, anc)

    def _beam_attention(self, blk: Block, wqkv: Tensor, i: int, kv: Tensor, cache: list[Tensor], idx: Tensor,
                        bias: Tensor) -> Attend:
        """Self-attention of K beams' new positions [B, K, D] over their ancestors' cached K/V (layer i);
        stores this step's K/V in kv[i]."""
        def attend(att: Attention, h: Tensor) -> Tensor:
            B, K, _ = h.shape
            qkv = F.linear(h, wqkv).view(B, K, 3, self.n_heads, self.d_kv)
            kv[i] = qkv[:, :, 1:].permute(2, 0, 3, 1, 4)
            q = qkv[:, :, 0].transpose(1, 2).contiguous()  # [B, H, K, d]
            w = torch.cat([_dots(q, c[i, 0], j) for c, j in zip(cache, idx)], -1)  # T5: no 1/sqrt(d)
            p = blk.drop((w + bias).softmax(-1))  # [B, H, K, t + 1]
            y = sum(_mix(p[..., s : s + 1], c[i, 1], j) for s, (c, j) in enumerate(zip(cache, idx)))  # [B, H, K, d]
            return blk.drop(att.o(y.transpose(1, 2).flatten(-2)))
        return attend
