"""APAO (one stage): L = L_CE + beta * sum_{m=1..T} w_m L_m over the target's prefix lengths m.

S^m = sum_{t<=m} s^t / tau_p (tau_p = `prefix_temperature`; s^t at the CE temperature).
loss:
  pointwise  L_m = -(1/m) S^m_+ (re-uses the CE logits: no extra forward).
  pairwise   L_m = -(1/m) log( e^{S_+} / (e^{S_+} + c_m sum_j e^{S_j}) ), N negatives j scored
             together with the positive in one `prefix_logits` call on one history encoding.
             At level m a negative whose m-prefix equals the positive's or an earlier negative's
             is masked (`mask_collisions`), and c_m = (P_m - 1) / #unmasked negatives, P_m the
             number of distinct m-prefixes in the catalogue (`correction`).
  pairwise_printed  the pairwise formula exactly as the paper prints it: the plain sampled softmax
             -log softmax([S_+, S_j])_+ per prefix length over the unmasked negatives, without c_m and
             1/m (not a new loss; `listwise`, its former name, is an error naming this one).
weights (detached):
  paper      w on the simplex as training state (a buffer: checkpointed), uniform at start; each
             training step w_m <- w_m exp(eta L_m) / Z with this batch's L_m (averaged over
             processes), then the updated w weights this batch's losses (as in group DRO). A training
             step is one micro-batch (Lightning's training_step): trainer.accumulate updates per
             optimizer step, as the release's loop recomputes its weights per micro-batch.
             Under a recipe that counts its micro-batches (protocol.micro_batches, e.g. the APAO
             release's 8 x 128 per step run as 2 processes x 256 x 2), w takes the recipe's updates
             instead: every process's micro-batch is cut into equal chunks (the recipe's micro-batches),
             and w steps once per chunk, through all processes' chunks in rank order, each chunk's
             losses weighted by w after its own step.
  released   what the APAO release's code runs (its T5/Llama_APAO_* models): recomputed per batch, no state,
             w_m ∝ L_m exp(eta L_m) (∝ L_m at eta = 0; at eta <= 1e-4 and L_m ~ 1.5-6, within 0.05% of it).
             Under protocol.micro_batches, from each of the recipe's micro-batches (chunks) alone.
  uniform    1 / T.     hardmax    one-hot on argmax_m L_m.
`drop_prefix` = m removes prefix length m from the sum (ablation). `bear` = {lam, xi, beam,
widths} (genrec/objectives/bear.py's BearTerm; lam = 0: off) adds BEAR's regularizer on the
positive (APAO + BEAR).
Logged: apao/ce, apao/prefix (sum_m w_m L_m), apao/L{m}, apao/w{m}.
"""

from __future__ import annotations

from itertools import accumulate

import torch
import torch.distributed as dist

from genrec.models.base import Backbone, token_logprobs
from genrec.objectives.bear import BearTerm, make_term, term_on
from genrec.objectives.ce import CE
from genrec.objectives.negatives import Negatives, make_negatives


def prefix_sums(x: torch.Tensor) -> torch.Tensor:
    """Running sums over the last (T-long) dim. Not `cumsum`: CUDA torch < 2.6 has no deterministic
    float cumsum and raises under `deterministic: true`; T adds are as cheap."""
    return torch.stack(list(accumulate(x.unbind(-1))), -1)


def collision_mask(pid: torch.Tensor) -> torch.Tensor:
    """pid [B, K, T]: prefix ids of K candidates per row (positive first) at each level ->
    bool [B, K, T], True where the m-prefix equals that of an earlier candidate in the row."""
    ordered, order = pid.sort(dim=1, stable=True)
    dup = torch.zeros_like(ordered, dtype=torch.bool)
    dup[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return torch.empty_like(dup).scatter_(1, order, dup)


def softmax_prefix_loss(S: torch.Tensor, masked: torch.Tensor, log_c: torch.Tensor | None) -> torch.Tensor:
    """-log( e^{S_+} / (e^{S_+} + c sum_j e^{S_j}) ) [B, T] for S [B, 1 + N, T] (positive first),
    masked [B, N, T] negatives left out, log_c [B, T] (None: c = 1)."""
    pos, neg = S[:, 0], S[:, 1:].masked_fill(masked, float("-inf"))
    if log_c is not None:
        neg = neg + log_c[:, None]
    return torch.logsumexp(torch.cat([pos[:, None], neg], 1), 1) - pos


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _process_mean(x: torch.Tensor) -> torch.Tensor:
    if _distributed():
        x = x.clone()
        dist.all_reduce(x)
        x = x / dist.get_world_size()
    return x


def _process_cat(x: torch.Tensor) -> torch.Tensor:
    """Every process's x, concatenated along dim 0 in rank order (x itself in one process)."""
    if not _distributed():
        return x
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


class APAO(CE):
    order = 4
    ablations = {"weights": "paper", "negatives.kind": "uniform", "drop_prefix": None}
    axes = (("beta", "eta"), ("bear.lam", "bear.xi"))
    LOSSES = ("pointwise", "pairwise", "pairwise_printed")

    @classmethod
    def report_row(cls, cfg: dict) -> tuple[float, str]:
        """"APAO-pointwise", "APAO-pairwise+BEAR", ...: one row per loss, pointwise first."""
        loss = cfg.get("loss", "pairwise")
        order = cls.order + (cls.LOSSES.index(loss) / 10 if loss in cls.LOSSES else 0.9)
        bear = term_on(cfg.get("bear"))
        return order + (0.05 if bear else 0), f"APAO-{loss}" + ("+BEAR" if bear else "")

    @classmethod
    def ablation_defaults(cls, protocol: dict) -> dict:
        """The weights a preset asks for (protocol.prefix_weights: the release's in office_cpu / apao_*) are the
        plain row; the other forms are ablations."""
        return {**cls.ablations, "weights": protocol.get("prefix_weights") or cls.ablations["weights"]}

    @classmethod
    def state_per_micro_batch(cls, cfg: dict) -> str | None:
        weights = cfg.get("weights", "paper")
        if cfg.get("beta") and (weights == "released" or (weights == "paper" and cfg.get("eta"))):
            return f"its prefix weights (objective.weights={weights})"
        return None

    def __init__(
        self,
        loss: str = "pairwise",
        weights: str = "paper",
        beta: float = 0.1,
        eta: float = 1e-5,
        prefix_temperature: float = 1.0,
        num_negatives: int = 100,
        correction: bool = True,
        mask_collisions: bool = True,
        drop_prefix: int | None = None,
        negatives: Negatives | dict | None = None,
        bear: BearTerm | dict | None = None,
        temperature: float = 1.0,
        end_token: bool = False,
    ) -> None:
        super().__init__(temperature, end_token)
        if loss == "listwise":
            raise ValueError("objective.loss=listwise is now called pairwise_printed (the paper's printed pairwise "
                             "formula: no 1/m, no c_m)")
        if loss not in ("pointwise", "pairwise", "pairwise_printed"):
            raise ValueError(f"unknown APAO loss {loss!r}")
        if weights not in ("paper", "released", "uniform", "hardmax"):
            raise ValueError(f"unknown APAO weights {weights!r}")
        self.loss, self.weighting, self.beta, self.eta = loss, weights, beta, eta
        self.prefix_temperature, self.num_negatives = prefix_temperature, num_negatives
        self.correction, self.mask_collisions, self.drop_prefix = correction, mask_collisions, drop_prefix
        self.negatives = make_negatives(negatives)
        self.bear = make_term(bear)

    def setup(self, ctx, backbone: Backbone) -> None:
        super().setup(ctx, backbone)
        T = ctx.sids.num_levels
        keep = torch.ones(T, dtype=torch.bool)
        if self.drop_prefix is not None:
            keep[self.drop_prefix - 1] = False
        self.register_buffer("keep", keep, persistent=False)
        others = [ctx.trie.num_prefixes(k) - 1 for k in range(1, T + 1)]  # P_m - 1 (on the device: no copy per step)
        self.register_buffer("others", torch.tensor(others), persistent=False)
        if "weights" not in self._buffers:  # training state: restored from a checkpoint after setup
            self.register_buffer("weights", keep.double() / keep.sum())
        if self.loss != "pointwise":
            self.negatives.setup(ctx)
        if self.bear is not None:
            self.bear.setup(ctx.eval_beam)

    def on_epoch_start(self, epoch: int) -> None:
        self.negatives.set_epoch(epoch)

    def weighted_prefix(self, Lx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """sum_m w_m L_m for per-example prefix losses Lx [B, T], with this batch's L [T] and the w [T] to log."""
        L = Lx.mean(0)
        steps = self.ctx.updates_per_micro_batch
        if self.weighting not in ("paper", "released") or steps is None or not (self.training and torch.is_grad_enabled()):
            w = self.prefix_weights(L.detach())
            return (w * L).sum(), L, w
        rank, world = (dist.get_rank(), dist.get_world_size()) if _distributed() else (0, 1)
        per_process = steps / world
        if per_process < 1 or per_process != int(per_process):
            raise ValueError(f"APAO: protocol.micro_batches / trainer.accumulate = {steps:g} of the recipe's "
                             f"micro-batches per micro-batch do not split evenly over {world} process(es)")
        chunks = Lx.tensor_split(int(per_process))  # this process's share of the recipe's micro-batches
        Lc = torch.stack([c.mean(0) if len(c) else torch.zeros_like(L) for c in chunks])  # [C, T]; empty: no step
        share = torch.tensor([len(c) / len(Lx) for c in chunks], dtype=L.dtype, device=L.device)
        if self.weighting == "released":  # recomputed from each of the recipe's micro-batches alone
            mine = torch.stack([self.prefix_weights(Lk) for Lk in Lc.detach()])  # [C, T]
            return (share[:, None] * mine * Lc).sum(), L, (share[:, None] * mine).sum(0)
        w, ws = self.weights, []
        for Lk in _process_cat(Lc.detach().double()):  # the recipe's micro-batches in order: one step each
            w = w * torch.exp(self.eta * Lk)
            w = w / w.sum()
            ws.append(w)
        self.weights.copy_(w)
        mine = torch.stack(ws[rank * len(chunks):(rank + 1) * len(chunks)]).to(L.dtype)  # [C, T]
        return (share[:, None] * mine * Lc).sum(), L, self.weights.to(L.dtype, copy=True)

    def prefix_weights(self, L: torch.Tensor) -> torch.Tensor:
        """w [T] (detached) for this batch's prefix losses L [T] (detached)."""
        keep = self.keep.to(L.device)
        if self.weighting == "paper":
            if self.training and torch.is_grad_enabled():
                w = self.weights * torch.exp(self.eta * _process_mean(L).double())
                self.weights.copy_(w / w.sum())
            return self.weights.to(L.dtype, copy=True)
        if self.weighting == "released":
            w = L * keep * torch.exp(self.eta * L)
            return torch.where(w.sum() > 0, w / w.sum().clamp(min=1e-30), keep / keep.sum())
        if self.weighting == "uniform":
            return keep.to(L.dtype) / keep.sum()
        return torch.nn.functional.one_hot(L.masked_fill(~keep, float("-inf")).argmax(), len(L)).to(L.dtype)

    def forward(self, batch: dict, backbone: Backbone) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        target = batch["target"]
        T = target.shape[1]
        m = torch.arange(1, T + 1, device=target.device)
        if self.loss == "pointwise":
            _, logits = self.teacher_forced(batch, backbone)
            s = token_logprobs(logits, self.scored(target), self.temperature)  # [B, T(+1)]
            ce, pos_logits = -s.mean(), logits
            Lx = -(prefix_sums(s[:, :T]) / m) / self.prefix_temperature  # [B, T]
        else:
            enc = backbone.encode(batch["history"], batch["mask"])
            negs, tokens = self.negatives.with_positive(batch, self.num_negatives, backbone, enc)  # [B, N], [B, 1 + N, T]
            if self.bear is None:  # log-probs without the [B, 1 + N, T(+1), V] logits
                s = backbone.prefix_logprobs(enc, self.prefixes(tokens), self.scored(tokens), self.temperature)
            else:  # BEAR needs the positive's logits
                logits = backbone.prefix_logits(enc, self.prefixes(tokens))
                s, pos_logits = token_logprobs(logits, self.scored(tokens), self.temperature), logits[:, 0]
            ce = -s[:, 0].mean()
            S = prefix_sums(s[..., :T]) / self.prefix_temperature  # [B, 1 + N, T]
            cands = torch.cat([batch["target_cand"][:, None], negs], 1)
            masked = collision_mask(self.ctx.trie.cand_prefix_id[cands][..., 1:])[:, 1:]
            if not self.mask_collisions:
                masked = torch.zeros_like(masked)
            log_c = None
            if self.loss == "pairwise" and self.correction:
                log_c = torch.log(self.others / (~masked).sum(1).clamp(min=1))  # [B, T]
            Lx = softmax_prefix_loss(S, masked, log_c)
            Lx = Lx / m if self.loss == "pairwise" else Lx
        prefix, L, w = self.weighted_prefix(Lx)
        loss = ce + self.beta * prefix
        terms = {"apao/ce": ce.detach(), "apao/prefix": prefix.detach()}
        terms.update({f"apao/L{k + 1}": L[k].detach() for k in range(T)})
        terms.update({f"apao/w{k + 1}": w[k].detach() for k in range(T)})
        if self.bear is not None:
            logp = torch.log_softmax(pos_logits[:, :T].float() / self.temperature, -1)
            delta = self.bear.deltas(logp, target, self.ctx.trie.target_masks(target))
            reg = self.bear.regularizer(delta).mean()
            loss = loss + self.bear.lam * reg / s.shape[-1]  # lam: the BEAR paper's (see bear.py)
            terms["apao/bear_reg"] = reg.detach()
            terms.update(self.bear.outside(delta))
        return loss, terms
