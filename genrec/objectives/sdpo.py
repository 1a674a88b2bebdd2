"""S-DPO (second stage): fine-tune a CE model against a frozen copy of itself with N negatives.

L = -log sigmoid( -log sum_j exp( beta_dpo [ (log pi(y_j) - log pi_ref(y_j)) - (log pi(y) - log pi_ref(y)) ] ) )
  = softplus( logsumexp_j beta_dpo (r_j - r_+) ),  r = log pi - log pi_ref,
log pi(.) the full-item log-prob S^T. At pi = pi_ref, L = log(1 + N).
`bear` = {lam, xi, beam, widths} (genrec/objectives/bear.py's BearTerm; lam = 0: off) adds
+lam L_reg on the positive and -lam L_reg averaged over the negatives (L_reg = sum_t
log sigmoid(Delta_t / xi), each candidate against its own trie thresholds).

`setup` keeps a frozen deep copy of the backbone as it is then as the reference (requires_grad
False, always in eval mode, scored under no_grad; the training loop optimises only parameters that
require grad): the run's start, a CE run's weights (`init_from`, or stage 1 of objective=sdpo_2stage),
loaded by the training loop before setup. The reference is part of the objective's state_dict, so a
resumed run gets the same reference.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from genrec.models.base import Backbone, token_logprobs
from genrec.objectives.base import Objective
from genrec.objectives.bear import BearTerm, make_term, term_on
from genrec.objectives.negatives import Negatives, make_negatives


class SDPO(Objective):
    label, order, fine_tunes = "S-DPO", 2, True
    ablations = {"negatives.kind": "uniform"}
    axes = (("lam", "xi"),)

    @classmethod
    def report_row(cls, cfg: dict) -> tuple[float, str]:
        return (2.5, "S-DPO+BEAR") if term_on(cfg.get("bear")) else (cls.order, cls.label)

    def __init__(
        self,
        beta_dpo: float = 1.0,
        num_negatives: int = 3,
        bear: BearTerm | dict | None = None,
        negatives: Negatives | dict | None = None,
    ) -> None:
        super().__init__()
        self.beta_dpo, self.num_negatives = beta_dpo, num_negatives
        self.bear = make_term(bear)
        self.negatives = make_negatives(negatives)

    def setup(self, ctx, backbone: Backbone) -> None:
        super().setup(ctx, backbone)
        if getattr(self, "ref", None) is not None:  # already set up: keep the trained policy
            return
        self.ref = copy.deepcopy(backbone).requires_grad_(False).eval()
        self.negatives.setup(ctx)
        if self.bear is not None:
            self.bear.setup(ctx.eval_beam)

    def on_epoch_start(self, epoch: int) -> None:
        self.negatives.set_epoch(epoch)

    def train(self, mode: bool = True) -> "SDPO":
        super().train(mode)
        if getattr(self, "ref", None) is not None:
            self.ref.eval()
        return self

    def forward(self, batch: dict, backbone: Backbone) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        enc = backbone.encode(batch["history"], batch["mask"])
        _, tokens = self.negatives.with_positive(batch, self.num_negatives, backbone, enc)  # [B, 1 + N, T]
        if self.bear is not None:  # BEAR needs every candidate's logits
            logits = backbone.prefix_logits(enc, tokens[..., :-1])
            logp = token_logprobs(logits, tokens).sum(-1)  # [B, 1 + N]
        else:
            logp = backbone.prefix_logprobs(enc, tokens[..., :-1], tokens).sum(-1)
        with torch.no_grad():
            ref_enc = self.ref.encode(batch["history"], batch["mask"])
            ref_logp = self.ref.prefix_logprobs(ref_enc, tokens[..., :-1], tokens).sum(-1)
        r = logp - ref_logp
        dpo = F.softplus(torch.logsumexp(self.beta_dpo * (r[:, 1:] - r[:, :1]), 1)).mean()
        terms = {"sdpo/dpo": dpo.detach(), "sdpo/margin": (r[:, :1] - r[:, 1:]).mean().detach()}
        loss = dpo
        if self.bear is not None:
            allowed = self.ctx.trie.target_masks(tokens.flatten(0, 1)).view(*tokens.shape, -1)
            delta = self.bear.deltas(torch.log_softmax(logits.float(), -1), tokens, allowed)
            reg = self.bear.regularizer(delta)  # [B, 1 + N]
            reg_pos, reg_neg = reg[:, 0].mean(), reg[:, 1:].mean()
            loss = loss + self.bear.lam * (reg_pos - reg_neg)
            terms.update({"sdpo/reg_pos": reg_pos.detach(), "sdpo/reg_neg": reg_neg.detach()})
            terms.update(self.bear.outside(delta[:, :, 0]))
        return loss, terms
