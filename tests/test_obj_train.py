"""Every objective (and the YAML configs) trains the ToyBackbone: the loss falls, nothing is NaN."""

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from obj_helpers import case, make_ctx
from omegaconf import OmegaConf
from toy import ToyBackbone

CONF = Path(__file__).parents[1] / "conf" / "objective"

CASES = {
    "ce": {},
    "ce_eos": {"end_token": True},
    "msl": {},
    "apao_pointwise_paper": {"loss": "pointwise", "eta": 0.01},
    "apao_pairwise_paper": {"num_negatives": 8},
    "apao_pairwise_eos_popularity": {"num_negatives": 8, "end_token": True, "negatives": {"kind": "popularity"}},
    "apao_pairwise_hard": {"num_negatives": 4, "negatives": {"kind": "hard", "pool": 12}},
    "apao_pairwise_printed_beam": {"loss": "pairwise_printed", "num_negatives": 4, "negatives": {"kind": "beam"}},
    "apao_pairwise_printed_released": {"loss": "pairwise_printed", "weights": "released", "num_negatives": 8},
    "apao_hardmax_drop": {"loss": "pointwise", "weights": "hardmax", "drop_prefix": 1},
    "apao_bear": {"loss": "pointwise", "bear": {"lam": 0.1, "xi": 2.75, "widths": [2, 3]}},
    "bear_reweight": {},
    "bear_regularizer": {"form": "regularizer", "lam": 0.2, "widths": [2, 4]},
    "sdpo": {},
    "sdpo_bear": {"bear": {"lam": 0.1}, "num_negatives": 4},
}


@pytest.mark.parametrize("name", list(CASES))
def test_objective_trains(name):
    cfg = OmegaConf.load(CONF / f"{name.split('_')[0]}.yaml")
    cfg.pop("defaults")  # the evaluator's scoring default (Hydra composes it into eval)
    beam = {"beam": 3} if "beam" in cfg else {"bear": {"beam": 3}} if "bear" in cfg else {}  # ${eval.beam} in a run
    cfg = OmegaConf.merge(cfg, beam, CASES[name])
    torch.manual_seed(0)
    sids, trie, batch = case(num_items=30, batch=16)
    bb = ToyBackbone(sids.vocab_size, seed=2)
    obj = instantiate(cfg)
    obj.setup(make_ctx(sids, eval_beam=3, item_counts=torch.randint(0, 9, (sids.num_candidates,)).numpy()), bb)
    obj.on_epoch_start(0)
    params = [p for p in list(bb.parameters()) + list(obj.parameters()) if p.requires_grad]
    opt = torch.optim.Adam(params, lr=0.03)
    losses = []
    for _ in range(25):
        loss, terms = obj(batch, bb)
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in terms.values()), terms
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in params if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses
