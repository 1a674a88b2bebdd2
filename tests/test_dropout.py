"""The CPU dropout (1-byte masks from a seeded numpy generator) against its definition."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from genrec.models.dropout import (
    Dropout, as_dtype, dropout, dropout_unscaled, masked, relu_dropout_unscaled, replace_dropout)


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_masked_is_the_product_with_the_mask(dtype, layout):
    """x where keep, else 0, computed on x's bits: x * keep's values (zeros unsigned), for strided inputs too."""
    x = torch.randn(37, 41, dtype=torch.double).to(dtype)
    x[0, :5] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan")], dtype=dtype)
    keep = torch.rand(37, 41) > 0.3
    keep[0, :5] = True
    if layout == "transposed":
        x, keep = x.t(), keep.t()
    out = masked(x, keep)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, x * keep, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(out[~keep]), torch.zeros_like(out[~keep], dtype=torch.bool))
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -1.0], dtype=dtype)
    assert masked(special, torch.zeros(4, dtype=torch.bool)).tolist() == [0.0] * 4  # dropped: +0, not NaN or -0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_relu_dropout_is_relu_then_dropout(dtype):
    """relu(x) * keep from one pass over x (only keep & x > 0 kept for backward): the same draw, values and gradients,
    to the bit, as relu followed by `dropout_unscaled`; exact zeros and negative zeros of x get relu's zero gradient."""
    x = torch.randn(64, 48, dtype=torch.double).to(dtype)
    x[0, :4] = torch.tensor([0.0, -0.0, 1.0, -1.0], dtype=dtype)
    x.requires_grad_(True)
    w = torch.randn(64, 48, dtype=dtype)
    torch.manual_seed(7)
    ref, ref_scale = dropout_unscaled(x.relu(), 0.25)
    (ref * w).sum().backward()
    g, x.grad = x.grad.clone(), None
    torch.manual_seed(7)
    out, scale = relu_dropout_unscaled(x, 0.25)
    (out * w).sum().backward()
    assert scale == ref_scale == 1 / 0.75 and out.dtype == dtype
    assert torch.equal(out, ref) and torch.equal(x.grad, g)
    after = torch.rand(1)
    torch.manual_seed(7)
    dropout_unscaled(x.relu(), 0.25)
    assert torch.equal(torch.rand(1), after)  # as many draws from torch's RNG: training replays the same masks
    assert 0 < (out == 0).double().mean() - (x <= 0).double().mean() < 0.35  # dropped beyond relu's zeros


def test_relu_dropout_off():
    x = torch.randn(8, 5, requires_grad=True)
    for out, scale in (relu_dropout_unscaled(x, 0.25, training=False), relu_dropout_unscaled(x, 0.0)):
        assert scale == 1.0 and torch.equal(out, x.relu())
