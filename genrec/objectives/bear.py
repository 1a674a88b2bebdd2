"""BEAR: make the target token survive a width-B beam at every step.

beta_t^B = the B-th largest probability among the tokens the trie allows after the ground-truth
prefix (fewer than B valid children: the smallest valid one), detached; Delta_t = log beta_t^B - s^t.

form=regularizer (paper):  L = (1/n) [ -sum_t s^t + lam * sum_t log sigmoid(Delta_t / xi) ], averaged over b,
    i.e. the paper's L_SFT + lam L_reg (both SUMS over the item's tokens) divided by the n scored tokens
    (T, or T + 1 with end_token): our CE stays a per-token mean and a lam from the paper's grid has
    the paper's strength.
form=reweight (released):  trie-masked CE with detached per-token weights
    w_t = 1 + lam * sigmoid((s^t - log beta_t^B) / xi),
    L = -sum w_t s^t / sum w_t over the tokens with more than one valid child
    (a single valid child has s^t = 0 under the mask, so it carries no signal).
Both give the token the gradient weight (const + sigmoid((s^t - log beta)/xi)) on grad s^t;
with the same softmax (`masked=True`) they coincide for lam_reweight = lam_reg / xi.
`widths` (beyond the papers) averages the term over several beam widths. The share of targets
outside the top-B at each step is logged as `bear/out{t}@{B}`.

`BearTerm` is the term itself ({lam, xi, beam, widths}: one config shape), used here and by APAO
(`bear:`, on the positive) and S-DPO (`bear:`, +lam on the positive, -lam on the negatives).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genrec.models.base import Backbone
from genrec.objectives.ce import CE
from genrec.objectives.msl import allowed_masks


def threshold(logp: torch.Tensor, allowed: torch.Tensor, width: int) -> torch.Tensor:
    """log beta^B [...]: the width-th largest allowed log-prob of logp [..., V] (fewer allowed:
    the smallest allowed one), detached."""
    logp = logp.detach().masked_fill(~allowed, float("-inf"))
    top = logp.topk(min(width, logp.shape[-1]), dim=-1).values
    k = allowed.sum(-1).clamp(1, width) - 1
    return top.gather(-1, k[..., None]).squeeze(-1)


def deltas(logp: torch.Tensor, tokens: torch.Tensor, allowed: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """Delta [W, ..., T] = log beta^B - s for log-probs [..., T, V] of targets [..., T]."""
    s = logp.gather(-1, tokens[..., None]).squeeze(-1)
    return torch.stack([threshold(logp, allowed, b) - s for b in widths])


def regularizer(delta: torch.Tensor, xi: float) -> torch.Tensor:
    """L_reg [...] = sum_t log sigmoid(Delta_t / xi), averaged over the widths."""
    return F.logsigmoid(delta / xi).sum(-1).mean(0)


def outside_terms(delta: torch.Tensor, widths: list[int]) -> dict[str, torch.Tensor]:
    """Share of targets outside the top-B at each step (Delta > 0), per width."""
    out = (delta.detach() > 0).float().flatten(1, -2).mean(1)  # [W, T]
    return {f"bear/out{t + 1}@{b}": out[i, t] for i, b in enumerate(widths) for t in range(out.shape[1])}


class BearTerm:
    """BEAR's term: lam * L_reg with xi, against the top-B of every width in `widths` (default: [beam],
    beam null: the evaluation beam). `make_term` reads a config dict; lam = 0 turns it off."""

    def __init__(self, lam: float = 0.1, xi: float = 2.75, beam: int | None = None,
                 widths: list[int] | None = None) -> None:
        self.lam, self.xi, self.beam = lam, xi, beam
        self.widths = list(widths) if widths else None

    def setup(self, eval_beam: int) -> None:
        self.widths = self.widths or [self.beam or eval_beam]

    def deltas(self, logp: torch.Tensor, tokens: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Delta [W, ..., T] for step log-probs [..., T, V] of tokens [..., T] (allowed: their trie masks)."""
        return deltas(logp, tokens, allowed, self.widths)

    def regularizer(self, delta: torch.Tensor) -> torch.Tensor:
        """L_reg [...] (without lam)."""
        return regularizer(delta, self.xi)

    def outside(self, delta: torch.Tensor) -> dict[str, torch.Tensor]:
        return outside_terms(delta, self.widths)


def make_term(cfg: BearTerm | dict | None) -> BearTerm | None:
    """The term from a config dict ({lam, xi, beam, widths}; missing keys: BearTerm's defaults), an
    instance, or None / lam = 0 (no term)."""
    if cfg is None or isinstance(cfg, BearTerm):
        return cfg
    if not hasattr(cfg, "keys"):
        raise ValueError(f"objective.bear={cfg!r}: null or {{lam, xi, beam, widths}} (lam: 0 = off)")
    term = BearTerm(**cfg)
    return term if term.lam else None


def term_on(cfg) -> bool:
    """Whether a saved `objective.bear` value adds the term (older runs: S-DPO `true`, APAO `null`)."""
    return cfg is True or hasattr(cfg, "keys") and make_term(dict(cfg)) is not None


class BEAR(CE):
    order = 3
    ablations = {"form": "reweight", "widths": None}
    axes = (("lam", "xi"),)

    def __init__(
        self,
        form: str = "regularizer",
        lam: float = 0.1,
        xi: float = 2.75,
        beam: int | None = None,
        widths: list[int] | None = None,
        masked: bool = False,
        temperature: float = 1.0,
        end_token: bool = False,
    ) -> None:
        super().__init__(temperature, end_token)
        if form not in ("regularizer", "reweight"):
            raise ValueError(f"unknown BEAR form {form!r}")
        self.form, self.masked = form, masked
        self.term = BearTerm(lam, xi, beam, widths)

    def setup(self, ctx, backbone: Backbone) -> None:
        super().setup(ctx, backbone)
        self.term.setup(ctx.eval_beam)

    def forward(self, batch: dict, backbone: Backbone) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        target = batch["target"]
        T = target.shape[1]
        _, logits = self.teacher_forced(batch, backbone)
        allowed = allowed_masks(self.ctx.trie, target, self.end_token)
        z = logits.float() / self.temperature
        if self.masked or self.form == "reweight":
            z = z.masked_fill(~allowed, float("-inf"))
        logp = torch.log_softmax(z, -1)
        s = logp.gather(-1, self.scored(target)[..., None]).squeeze(-1)  # [B, T(+1)]
        term = self.term
        delta = term.deltas(logp[:, :T], target, allowed[:, :T])  # [W, B, T]
        terms = term.outside(delta)
        if self.form == "regularizer":
            ce, reg = -s.mean(), term.regularizer(delta).mean()
            loss = ce + term.lam * reg / s.shape[-1]  # = (paper's L_SFT + lam L_reg) / n
            terms.update({"bear/ce": ce.detach(), "bear/reg": reg.detach()})
        else:
            w = 1 + term.lam * torch.sigmoid(-delta.detach() / term.xi).mean(0)  # [B, T]
            multi = allowed[:, :T].sum(-1) > 1
            w = w * multi
            loss = -(w * s[:, :T]).sum() / w.sum().clamp(min=1e-12)
            terms["bear/w_mean"] = (w.sum() / multi.sum().clamp(min=1)).detach()
        return loss, terms
