"""CE and MSL: values and gradients against explicit loops over examples and tokens."""

import math

import pytest
import torch
from obj_helpers import CountingToy, FixedLogits, allowed_tokens, case, make_ctx

from genrec.models.base import EOS
from genrec.objectives.ce import CE
from genrec.objectives.msl import MSL


def _run(obj, logits, sids, trie, batch):
    bb = FixedLogits(logits)
    obj.setup(make_ctx(sids), bb)
    loss, terms = obj(batch, bb)
    loss.backward()
    return loss, terms, bb.logits.grad


def _reference(logits, sids, batch, tau, end_token, masked):
    z = logits.clone().requires_grad_()
    total, n = 0.0, 0
    for b, target in enumerate(batch["target"].tolist()):
        tokens = target + ([EOS] if end_token else [])
        for t, y in enumerate(tokens):
            row = z[b, 0, t] / tau
            if masked:
                row = row[allowed_tokens(sids, tokens[:t])] if t < len(target) else row[[EOS]]
                y = (allowed_tokens(sids, tokens[:t]) if t < len(target) else [EOS]).index(y)
            total = total - (row[y] - torch.logsumexp(row, 0))
            n += 1
    loss = total / n
    loss.backward()
    return loss, z.grad


@pytest.mark.parametrize("end_token", [False, True])
@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_ce_matches_loop(end_token, tau):
    sids, trie, batch = case()
    T, V = sids.num_levels, sids.vocab_size
    logits = 3 * torch.randn(len(batch["target"]), 1, T + 1, V, generator=torch.Generator().manual_seed(5))
    loss, terms, grad = _run(CE(tau, end_token), logits, sids, trie, batch)
    ref, ref_grad = _reference(logits, sids, batch, tau, end_token, masked=False)
    assert torch.allclose(loss, ref, atol=1e-5) and torch.allclose(terms["ce"], ref, atol=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    if not end_token:  # the eos position is never scored
        assert grad[:, :, T].abs().sum() == 0


@pytest.mark.parametrize("end_token", [False, True])
@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_msl_matches_loop(end_token, tau):
    sids, trie, batch = case(sizes=(3, 3, 4))
    T, V = sids.num_levels, sids.vocab_size
    logits = 3 * torch.randn(len(batch["target"]), 1, T + 1, V, generator=torch.Generator().manual_seed(6))
    loss, _, grad = _run(MSL(tau, end_token), logits, sids, trie, batch)
    ref, ref_grad = _reference(logits, sids, batch, tau, end_token, masked=True)
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    # The masked softmax is a different loss from CE on the same logits.
    ce, _, _ = _run(CE(tau, end_token), logits, sids, trie, batch)
    assert ce > loss


def test_msl_default_temperature_is_released_value():
    assert MSL().temperature == 2.0 and not MSL().end_token


def test_ce_one_encode_and_matches_target_logits():
    sids, trie, batch = case()
    bb = CountingToy(sids.vocab_size)
    obj = CE()
    obj.setup(make_ctx(sids), bb)
    loss, _ = obj(batch, bb)
    assert bb.encodes == 1 and len(bb.prefix_shapes) == 1
    logits = bb.target_logits(batch["history"], batch["mask"], batch["target"])
    ref = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["target"].flatten())
    assert math.isclose(loss.item(), ref.item(), rel_tol=1e-6)
