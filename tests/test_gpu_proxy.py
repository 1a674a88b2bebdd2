"""CPU proxies for GPU runs: bf16 autocast (this CPU runs bf16 natively) against float32."""

import torch

import genrec.models.head as head


def _bf16_head_case(monkeypatch):
    monkeypatch.setattr(head, "CHUNK", 16)  # 40 rows: several chunks
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 32, generator=g)
    proj = torch.nn.Linear(32, 32)  # fp32 parameters, as under mixed precision
    w = (torch.randn(64, 32, generator=g) * 2).requires_grad_()
    rows, tokens = torch.randint(40, (5, 9), generator=g), torch.randint(64, (5, 9), generator=g)
    coef = torch.randn(5, 9, generator=g)
    return x, proj, w, rows, tokens, coef


def test_head_logprobs_under_bf16_autocast_match_float32(monkeypatch):
    """Autocast makes h bf16; the normalisers and their gradients must still be float32 math on
    those h values (not bf16 logits in forward and fp32 ones in backward)."""
    x, proj, w, rows, tokens, coef = _bf16_head_case(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = proj(x)
        assert h.dtype == torch.bfloat16
        out = head.head_logprobs(h, w, rows, tokens)
    h.retain_grad()
    (out * coef).sum().backward()  # Lightning runs backward outside the autocast context

    h32 = h.detach().float().requires_grad_()  # the same hidden values, everything else float32
    w32 = w.detach().clone().requires_grad_()
    ref = torch.log_softmax(h32 @ w32.T, -1)[rows, tokens]
    (ref * coef).sum().backward()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=0)
    torch.testing.assert_close(w.grad, w32.grad, atol=2e-5, rtol=1e-5)
    # h's gradient is bf16 (two bf16 terms summed): compared as a whole, at bf16's resolution.
    assert (h.grad.float() - h32.grad).norm() < 4e-3 * h32.grad.norm()
