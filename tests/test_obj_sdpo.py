"""S-DPO: the frozen reference, log(1 + N) at pi = pi_ref, values against loops, +BEAR signs,
and loading the reference from a Lightning checkpoint or run dir."""

import math

import pytest
import torch
from obj_helpers import CountingToy, ToyBackbone, allowed_tokens, case, make_ctx
from torch import nn

from genrec.objectives.sdpo import SDPO
from genrec.runs import load_backbone_state


def _setup(N=4, **kw):
    sids, trie, batch = case(num_items=25, batch=6)
    bb = CountingToy(sids.vocab_size, seed=1)
    obj = SDPO(num_negatives=N, **kw)
    obj.setup(make_ctx(sids), bb)
    return sids, trie, batch, bb, obj


def test_policy_equals_reference_gives_log_one_plus_n():
    for N in (1, 3, 7):
        _, trie, batch, bb, obj = _setup(N)
        loss, _ = obj(batch, bb)
        assert math.isclose(loss.item(), math.log(1 + N), rel_tol=1e-6)
        assert bb.encodes == 1 and len(bb.prefix_shapes) == 1  # policy: one pass for all candidates


def _logp(model, batch, b, tokens):
    logits = model.target_logits(batch["history"][b : b + 1], batch["mask"][b : b + 1], tokens[None])[0]
    return sum(torch.log_softmax(logits[t], 0)[tokens[t]] for t in range(len(tokens)))


def _perturb(bb):
    with torch.no_grad():
        for p in bb.parameters():
            p.add_(0.3 * torch.randn_like(p))


def test_value_and_gradient_match_loop():
    beta, N = 0.7, 3
    sids, trie, batch, bb, obj = _setup(N, beta_dpo=beta)
    _perturb(bb)
    negs = obj.negatives.sample(batch, N)
    loss, _ = obj(batch, bb)
    grads = torch.autograd.grad(loss, list(bb.parameters()))
    tok = sids.cand_tokens()
    ref = 0.0
    for b in range(len(batch["target"])):
        pos = batch["target"][b]
        r_pos = _logp(bb, batch, b, pos) - _logp(obj.ref, batch, b, pos).detach()
        total = 0.0
        for j in range(N):
            y = tok[negs[b, j]]
            total = total + torch.exp(beta * ((_logp(bb, batch, b, y) - _logp(obj.ref, batch, b, y).detach()) - r_pos))
        ref = ref - torch.nn.functional.logsigmoid(-torch.log(total))
    ref = ref / len(batch["target"])
    assert math.isclose(loss.item(), ref.item(), rel_tol=1e-5)
    for g, r in zip(grads, torch.autograd.grad(ref, list(bb.parameters()))):
        assert torch.allclose(g, r, atol=1e-5)


def test_reference_is_frozen_and_excluded_from_training():
    sids, trie, batch, bb, obj = _setup(3)
    module = nn.ModuleDict({"backbone": bb, "objective": obj})  # like the LightningModule
    ref0 = {k: v.clone() for k, v in obj.ref.state_dict().items()}
    pol0 = {k: v.clone() for k, v in bb.state_dict().items()}
    assert all(not p.requires_grad for p in obj.ref.parameters())
    assert not any(p is q for p in obj.ref.parameters() for q in bb.parameters())
    module.train()
    assert not obj.ref.training and obj.training
    opt = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=0.05)
    for _ in range(3):
        loss, _ = obj(batch, bb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.grad is None for p in obj.ref.parameters())
    assert all(torch.equal(v, ref0[k]) for k, v in obj.ref.state_dict().items())
    assert any(not torch.equal(v, pol0[k]) for k, v in bb.state_dict().items())
    assert any(k.startswith("ref.") for k in obj.state_dict())  # a resumed run keeps its reference


def test_bear_sign_convention():
    lam, xi, N, width = 0.4, 1.5, 3, 2
    sids, trie, batch, bb, plain = _setup(N)
    _perturb(bb)
    with_bear = SDPO(num_negatives=N, bear={"lam": lam, "xi": xi, "beam": width})
    with_bear.setup(make_ctx(sids), bb)
    with_bear.ref.load_state_dict(plain.ref.state_dict())
    l0, _ = plain(batch, bb)
    l1, terms = with_bear(batch, bb)
    negs = plain.negatives.sample(batch, N)
    tok = sids.cand_tokens()

    def reg(b, y):  # sum_t log sigmoid((log beta_t - s_t) / xi), thresholds over y's own trie children
        logits = bb.target_logits(batch["history"][b : b + 1], batch["mask"][b : b + 1], y[None])[0]
        total = 0.0
        for t in range(len(y)):
            lp = torch.log_softmax(logits[t], 0)
            vals = sorted(lp[allowed_tokens(sids, y[:t].tolist())].tolist(), reverse=True)
            lb = vals[width - 1] if len(vals) >= width else vals[-1]
            total += torch.nn.functional.logsigmoid((lb - lp[y[t]]) / xi).item()
        return total

    B = len(batch["target"])
    pos = sum(reg(b, batch["target"][b]) for b in range(B)) / B
    neg = sum(reg(b, tok[negs[b, j]]) for b in range(B) for j in range(N)) / (B * N)
    assert math.isclose(terms["sdpo/reg_pos"].item(), pos, rel_tol=1e-5)
    assert math.isclose(terms["sdpo/reg_neg"].item(), neg, rel_tol=1e-5)
    assert math.isclose((l1 - l0).item(), lam * (pos - neg), rel_tol=1e-4)


def _lightning_ckpt(path, backbone, extra=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    state.update(extra or {})
    torch.save({"state_dict": state, "epoch": 3}, path)


def test_init_from_loads_best_else_last_and_is_the_reference(tmp_path):
    """init_from (a run dir: best.ckpt, else last.ckpt; or a .ckpt) sets the backbone before setup;
    S-DPO's reference is a frozen copy of that start."""
    sids, trie, batch = case(num_items=25)
    V = sids.vocab_size
    best, last = ToyBackbone(V, seed=11), ToyBackbone(V, seed=12)
    run = tmp_path / "run"
    _lightning_ckpt(run / "checkpoints" / "last.ckpt", last, {"objective.weights": torch.ones(3)})
    for path, expected in [(run, last), (run / "checkpoints" / "last.ckpt", last)]:
        policy = ToyBackbone(V, seed=0)
        policy.load_state_dict(load_backbone_state(path))
        obj = SDPO()
        obj.setup(make_ctx(sids), policy)
        for model in (policy, obj.ref):
            assert all(torch.equal(v, expected.state_dict()[k]) for k, v in model.state_dict().items())
        assert not any(p.requires_grad for p in obj.ref.parameters())
    _lightning_ckpt(run / "checkpoints" / "best.ckpt", best)
    assert torch.equal(load_backbone_state(run)["out.weight"], best.out.weight)


def test_missing_start_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="best.ckpt or checkpoints/last.ckpt"):
        load_backbone_state(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_backbone_state(tmp_path / "x.ckpt")
    (tmp_path / "metrics.json").write_text("{}")  # a committed run summary (docs/results/runs/...): no weights
    with pytest.raises(FileNotFoundError, match="a run summary, as committed: its weights are not kept"):
        load_backbone_state(tmp_path)
    torch.save({"state_dict": {"objective.w": torch.ones(1)}}, tmp_path / "bad.ckpt")
    with pytest.raises(ValueError, match="no backbone"):
        load_backbone_state(tmp_path / "bad.ckpt")
