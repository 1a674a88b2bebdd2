"""Token log-probs from hidden rows (`genrec.models.head`) against log_softmax of the full logits."""

import pytest
import torch

import genrec.models.head as head


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_head_logprobs_values_and_gradients(monkeypatch, tau):
    monkeypatch.setattr(head, "CHUNK", 4)  # 11 rows: chunks of 4, 4, 3
    g = torch.Generator().manual_seed(0)
    h = torch.randn(11, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(9, 6, dtype=torch.float64, generator=g, requires_grad=True)
    rows = torch.randint(11, (5, 7), generator=g)  # rows read by several scores, some by none
    tokens = torch.randint(9, (5, 7), generator=g)
    out = head.head_logprobs(h, w, rows, tokens, tau)
    coef = torch.randn(5, 7, dtype=torch.float64, generator=g)
    ours = torch.autograd.grad((out * coef).sum(), (h, w))

    ref = torch.empty(5, 7, dtype=torch.float64)
    for i in range(5):  # one score at a time: the row's full logits, log-softmax, pick
        for j in range(7):
            ref[i, j] = torch.log_softmax(w @ h[rows[i, j]] / tau, -1)[tokens[i, j]]
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    for a, b in zip(ours, torch.autograd.grad((ref * coef).sum(), (h, w))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(lambda h, w: head.logsumexp_linear(h, w, tau), (h, w))


def test_head_logprobs_float32_matches_logits_path():
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(300, 16, generator=g), torch.randn(50, 16, generator=g) * 3
    rows, tokens = torch.arange(300).view(3, 100), torch.randint(50, (3, 100), generator=g)
    ref = torch.log_softmax(h @ w.T, -1).gather(1, tokens.view(-1, 1)).view(3, 100)
    out = head.head_logprobs(h, w, rows, tokens)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
