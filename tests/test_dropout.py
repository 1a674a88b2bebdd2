"""The CPU dropout (1-byte masks from a seeded numpy generator) against its definition."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from genrec.models.dropout import Dropout, as_dtype, dropout, dropout_unscaled, replace_dropout


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drop_rate_scale_and_gradient(p):
    x = torch.rand(400, 500, dtype=torch.double) + 0.5  # no zeros: dropped <=> output 0
    x.requires_grad_(True)
    torch.manual_seed(0)
    y = dropout(x, p)
    kept = y != 0
    assert abs(1 - kept.double().mean().item() - p) < 0.005
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))  # kept entries scaled by 1 / (1 - p)
    w = torch.randn_like(x)
    (y * w).sum().backward()
    torch.testing.assert_close(x.grad, w * kept / (1 - p))


def test_seeded_off_in_eval_and_replayed_by_checkpoint():
    x = torch.randn(64, 32, requires_grad=True)
    torch.manual_seed(3)
    a = dropout(x, 0.2)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.2), a)
    assert not torch.equal(dropout(x, 0.2), a)  # the next call draws a new mask
    assert dropout(x, 0.2, training=False) is x and dropout(x, 0.0) is x

    def f(t):
        return dropout(torch.tanh(t), 0.3) * 2

    torch.manual_seed(5)
    ref = f(x)
    ref.sum().backward()
    g, x.grad = x.grad.clone(), None
    torch.manual_seed(5)
    out = checkpoint(f, x, use_reentrant=False)
    out.sum().backward()
    assert torch.equal(out, ref) and torch.equal(x.grad, g)


def test_replace_dropout_swaps_modules():
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.25), nn.Sequential(nn.Dropout(0.5)))
    replace_dropout(net)
    assert [type(m) for m in net.modules()].count(Dropout) == 2 and net[1].p == 0.25 and net[2][0].p == 0.5
    net.eval()
    x = torch.randn(3, 4)
    assert torch.equal(net(x), net[0](x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.bool])
def test_as_dtype_is_the_cast(dtype):
    keep = torch.rand(37, 41) > 0.3
    out = as_dtype(keep, dtype)
    assert out.dtype == dtype and torch.equal(out, keep.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_unscaled_dropout_times_its_scale_is_dropout(dtype):
    """(x * keep, 1 / (1 - p)) from the same draw as `dropout`, and the scale applied after a product (as TIGER's
    feed-forward does) gives dropout's output and gradients."""
    x = (torch.rand(64, 48, dtype=torch.double) + 0.5).to(dtype).requires_grad_(True)
    w = torch.randn(48, 16, dtype=dtype)
    torch.manual_seed(7)
    ref = dropout(x, 0.25) @ w
    ref.sum().backward()
    g, x.grad = x.grad.clone(), None
    torch.manual_seed(7)
    h, scale = dropout_unscaled(x, 0.25)
    out = (h @ w) * scale
    out.sum().backward()
    assert scale == 1 / 0.75 and set(torch.unique(h / x).tolist()) == {0.0, 1.0}
    tol = {"atol": 1e-12, "rtol": 1e-12} if dtype == torch.float64 else {"atol": 0.05, "rtol": 0.02}  # bf16 rounding
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(x.grad, g, **tol)
    for off in (dropout_unscaled(x, 0.25, training=False), dropout_unscaled(x, 0.0)):
        assert off[0] is x and off[1] == 1.0
