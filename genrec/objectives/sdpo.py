"""S-DPO (second stage): fine-tune a CE model against a frozen copy of itself with N negatives.

L = -log sigmoid( -log sum_j exp( beta_dpo [ (log pi(y_j) - log pi_ref(y_j)) - (log pi(y) - log pi_ref(y)) ] ) )
  = softplus( logsumexp_j beta_dpo (r_j - r_+) ),  r = log pi - log pi_ref,
log pi(.) the full-item log-prob S^T. At pi = pi_ref, L = log(1 + N).
`bear=True` adds +lam L_reg on the positive and -lam L_reg averaged over the negatives
(L_reg = sum_t log sigmoid(Delta_t / xi), each candidate against its own trie thresholds).

`setup` loads `ref_ckpt` (a Lightning checkpoint, or a run dir: <dir>/checkpoints/best.ckpt,
else last.ckpt) into the policy backbone and keeps a frozen deep copy as the reference
(requires_grad False, always in eval mode, scored under no_grad; the training loop optimises
only parameters that require grad). ref_ckpt=None: the reference is a copy of the backbone as
it is at setup. The reference is part of the objective's state_dict, so a resumed run gets the
same reference.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F

from genrec.eval.trie import Trie
from genrec.models.base import Backbone, token_logprobs
from genrec.objectives import bear as bear_lib
from genrec.objectives.base import Objective
from genrec.objectives.negatives import Negatives, make_negatives


def checkpoint_path(path: str | Path) -> Path:
    """A .ckpt file, or a run dir's checkpoints/best.ckpt falling back to last.ckpt."""
    path = Path(path)
    if path.is_dir():
        for name in ("best.ckpt", "last.ckpt"):
            if (path / "checkpoints" / name).is_file():
                return path / "checkpoints" / name
        raise FileNotFoundError(f"no checkpoints/best.ckpt or checkpoints/last.ckpt under {path}")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def load_backbone_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The backbone weights (keys `backbone.*`, prefix stripped) of a Lightning checkpoint."""
    try:
        path = checkpoint_path(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"S-DPO reference (objective.ref_ckpt): {e}") from None
    # Our own training checkpoint (Lightning pickles hyper-parameters alongside the weights).
    state = torch.load(path, map_location="cpu", weights_only=False).get("state_dict", {})
    weights = {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}
    if not weights:
        raise ValueError(f"{path} holds no backbone.* weights in its state_dict")
    return weights


class SDPO(Objective):
    label, order = "S-DPO", 2
    ablations = {"negatives.kind": "uniform"}
    axes = (("lam", "xi"),)

    @classmethod
    def report_row(cls, cfg: dict) -> tuple[float, str]:
        return (2.5, "S-DPO+BEAR") if cfg.get("bear") else (cls.order, cls.label)

    def __init__(
        self,
        ref_ckpt: str | None = None,
        beta_dpo: float = 1.0,
        num_negatives: int = 3,
        bear: bool = False,
        lam: float = 0.1,
        xi: float = 2.75,
        beam: int | None = None,
        negatives: Negatives | dict | None = None,
    ) -> None:
        super().__init__()
        self.ref_ckpt, self.beta_dpo, self.num_negatives = ref_ckpt, beta_dpo, num_negatives
        self.bear, self.lam, self.xi, self.beam = bear, lam, xi, beam
        self.negatives = make_negatives(negatives)

    def setup(self, ctx, backbone: Backbone) -> None:
        super().setup(ctx, backbone)
        if getattr(self, "ref", None) is not None:  # already set up: keep the trained policy
            return
        if self.ref_ckpt:
            backbone.load_state_dict(load_backbone_state(self.ref_ckpt))
        self.ref = copy.deepcopy(backbone).requires_grad_(False).eval()
        self.negatives.setup(ctx)
        self.widths = [self.beam or ctx.eval_beam]

    def on_epoch_start(self, epoch: int) -> None:
        self.negatives.set_epoch(epoch)

    def train(self, mode: bool = True) -> "SDPO":
        super().train(mode)
        if getattr(self, "ref", None) is not None:
            self.ref.eval()
        return self

    def forward(self, batch: dict, backbone: Backbone, trie: Trie) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        target = batch["target"]
        enc = backbone.encode(batch["history"], batch["mask"])
        negs = self.negatives.sample(batch, self.num_negatives, backbone, enc)
        tokens = torch.cat([target[:, None], self.negatives.cand_tokens.to(target.device)[negs]], 1)  # [B, 1 + N, T]
        if self.bear:  # BEAR needs every candidate's logits
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
        if self.bear:
            allowed = trie.target_masks(tokens.flatten(0, 1)).view(*tokens.shape, -1)
            delta = bear_lib.deltas(torch.log_softmax(logits.float(), -1), tokens, allowed, self.widths)
            reg = bear_lib.regularizer(delta, self.xi)  # [B, 1 + N]
            reg_pos, reg_neg = reg[:, 0].mean(), reg[:, 1:].mean()
            loss = loss + self.lam * (reg_pos - reg_neg)
            terms.update({"sdpo/reg_pos": reg_pos.detach(), "sdpo/reg_neg": reg_neg.detach()})
            terms.update(bear_lib.outside_terms(delta[:, :, 0], self.widths))
        return loss, terms
