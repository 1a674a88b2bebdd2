"""BEAR: thresholds, both forms against loops, their shared gradient, lam = 0, logged shares."""

import math

import pytest
import torch
from obj_helpers import FixedLogits, allowed_tokens, case, make_ctx

from genrec.objectives.bear import BEAR, threshold
from genrec.objectives.ce import CE


def test_threshold_is_bth_largest_allowed_or_smallest_valid():
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(50, 12, generator=g), -1)
    allowed = torch.rand(50, 12, generator=g) < 0.35
    allowed[:, 0] = True  # at least one child
    counts = allowed.sum(-1)
    assert (counts < 4).any() and (counts >= 4).any()  # both rules are exercised
    got = threshold(logp, allowed, 4)
    for i in range(50):
        vals = sorted(logp[i][allowed[i]].tolist(), reverse=True)
        expected = vals[3] if len(vals) >= 4 else vals[-1]
        assert got[i].item() == expected
    assert not threshold(logp.requires_grad_(), allowed, 4).requires_grad


def _setup(sizes=(4, 3, 3)):
    sids, trie, batch = case(num_items=22, sizes=sizes, batch=7)
    B, T, V = len(batch["target"]), sids.num_levels, sids.vocab_size
    logits = 2 * torch.randn(B, 1, T + 1, V, generator=torch.Generator().manual_seed(9))
    return sids, trie, batch, logits


def _run(obj, sids, trie, batch, logits, eval_beam=3):
    bb = FixedLogits(logits)
    obj.setup(make_ctx(sids, eval_beam=eval_beam), bb)
    loss, terms = obj(batch, bb)
    loss.backward()
    return loss, terms, bb.logits.grad


def _loop_terms(z, sids, batch, width, masked):
    """Per (b, t): s (log-prob of the target), log beta (B-th largest allowed, detached), #children."""
    out = []
    for b, target in enumerate(batch["target"].tolist()):
        row = []
        for t, y in enumerate(target):
            ok = allowed_tokens(sids, target[:t])
            lp = torch.log_softmax(z[b, 0, t][ok], 0) if masked else torch.log_softmax(z[b, 0, t], 0)[ok]
            vals = sorted(lp.tolist(), reverse=True)
            log_beta = vals[width - 1] if len(vals) >= width else vals[-1]
            row.append((lp[ok.index(y)], log_beta, len(ok)))
        out.append(row)
    return out


@pytest.mark.parametrize("masked", [False, True])
def test_regularizer_matches_loop(masked):
    sids, trie, batch, logits = _setup()
    lam, xi, width = 0.3, 1.5, 3
    loss, terms, grad = _run(BEAR("regularizer", lam, xi, masked=masked), sids, trie, batch, logits, eval_beam=width)
    z = logits.clone().requires_grad_()
    rows = _loop_terms(z, sids, batch, width, masked)
    B, T = len(rows), len(rows[0])
    assert any(n < width for r in rows for _, _, n in r)  # the fewer-than-B rule is used
    # the paper: L_SFT + lam L_reg, both sums over the T tokens; genrec divides by T (its CE is a mean)
    sft = -sum(s for r in rows for s, _, _ in r) / B
    reg = sum(torch.nn.functional.logsigmoid((lb - s) / xi) for r in rows for s, lb, _ in r) / B
    ref = (sft + lam * reg) / T
    ref.backward()
    assert math.isclose(loss.item(), ref.item(), rel_tol=1e-5)
    assert torch.allclose(grad, z.grad, atol=1e-6)
    for t in range(T):
        out = sum(float(lb - s.item() > 0) for s, lb, _ in (r[t] for r in rows)) / B
        assert math.isclose(terms[f"bear/out{t + 1}@{width}"].item(), out, abs_tol=1e-6)


def test_reweight_matches_loop():
    sids, trie, batch, logits = _setup()
    lam, xi, width = 0.25, 2.75, 2
    loss, _, grad = _run(BEAR("reweight", lam, xi, beam=width), sids, trie, batch, logits)
    z = logits.clone().requires_grad_()
    rows = _loop_terms(z, sids, batch, width, masked=True)
    num, den = 0.0, 0.0
    for r in rows:
        for s, lb, n in r:
            if n > 1:
                w = 1 + lam * torch.sigmoid((s.detach() - lb) / xi)
                num, den = num - w * s, den + w
    ref = num / den
    ref.backward()
    assert math.isclose(loss.item(), ref.item(), rel_tol=1e-5)
    assert torch.allclose(grad, z.grad, atol=1e-6)


def test_lam_zero_is_ce_and_masked_ce():
    sids, trie, batch, logits = _setup()
    loss, _, grad = _run(BEAR("regularizer", lam=0.0), sids, trie, batch, logits)
    ce, _, ce_grad = _run(CE(), sids, trie, batch, logits)
    assert torch.equal(loss, ce) and torch.allclose(grad, ce_grad, atol=1e-7)
    loss, _, _ = _run(BEAR("reweight", lam=0.0), sids, trie, batch, logits)
    rows = _loop_terms(logits, sids, batch, 3, masked=True)
    multi = [s for r in rows for s, _, n in r if n > 1]
    assert math.isclose(loss.item(), -sum(multi).item() / len(multi), rel_tol=1e-5)


def test_two_forms_share_the_per_token_gradient():
    """Same softmax (masked): regularizer with a detached threshold and released re-weighting give
    every token a gradient along -grad s^t; with lam' = lam / xi the weights agree up to one
    global constant, so the whole gradients are proportional."""
    sids, trie, batch, logits = _setup(sizes=(3, 3, 4))
    T, lam, xi = sids.num_levels, 0.4, 1.3
    _, _, g_reg = _run(BEAR("regularizer", lam, xi, beam=3, masked=True), sids, trie, batch, logits)
    _, _, g_rew = _run(BEAR("reweight", lam / xi, xi, beam=3), sids, trie, batch, logits)
    g_reg, g_rew = g_reg[:, 0, :T].flatten(0, 1), g_rew[:, 0, :T].flatten(0, 1)  # [B*T, V]
    live = g_rew.norm(dim=-1) > 0
    assert live.sum() > 5 and torch.equal(live, g_reg.norm(dim=-1) > 0)
    cos = torch.nn.functional.cosine_similarity(g_reg[live], g_rew[live], dim=-1)
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-5)  # per token: same direction
    ratio = g_reg[live].norm(dim=-1) / g_rew[live].norm(dim=-1)
    assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4)  # and one global scale
    # A different lam' changes the relative token weights (the check above is not vacuous).
    _, _, g_other = _run(BEAR("reweight", 5 * lam / xi, xi, beam=3), sids, trie, batch, logits)
    other = g_reg[live].norm(dim=-1) / g_other[:, 0, :T].flatten(0, 1)[live].norm(dim=-1)
    assert not torch.allclose(other, other[0].expand_as(other), rtol=1e-3)


def test_several_widths_average():
    sids, trie, batch, logits = _setup()
    both, terms, _ = _run(BEAR("regularizer", 0.5, 2.0, widths=[2, 3]), sids, trie, batch, logits)
    one = [_run(BEAR("regularizer", 0.5, 2.0, beam=b), sids, trie, batch, logits)[0] for b in (2, 3)]
    assert math.isclose(both.item(), (one[0].item() + one[1].item()) / 2, rel_tol=1e-6)
    assert "bear/out1@2" in terms and "bear/out3@3" in terms


def test_beam_defaults_to_eval_beam():
    sids, trie, batch, logits = _setup()
    obj = BEAR()
    obj.setup(make_ctx(sids, eval_beam=7), FixedLogits(logits))
    assert obj.term.widths == [7]


def test_one_term_one_config_shape_in_bear_apao_and_sdpo():
    """BEAR, APAO's `bear:` and S-DPO's `bear:` build the same BearTerm from {lam, xi, beam, widths};
    lam = 0 or null is no term; a missing beam is the evaluation beam."""
    from genrec.objectives.apao import APAO
    from genrec.objectives.bear import BearTerm
    from genrec.objectives.sdpo import SDPO

    shape = {"lam": 0.3, "xi": 1.5, "beam": None, "widths": [2, 4]}
    terms = [BEAR("regularizer", **shape).term, APAO(bear=shape).bear, SDPO(bear=shape).bear]
    assert all(type(t) is BearTerm and (t.lam, t.xi, t.widths) == (0.3, 1.5, [2, 4]) for t in terms)
    assert APAO(bear={**shape, "lam": 0.0}).bear is None and SDPO(bear=None).bear is None
    term = SDPO(bear={"lam": 0.1}).bear
    term.setup(eval_beam=7)
    assert term.widths == [7]
