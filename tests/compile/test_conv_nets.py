"""Conv nets: pooling as window reductions and a ResNet-style block in channels_last, forward and backward,
against eager (values, strides), with no op left to ATen but the convolutions."""

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import brrr
from tests.compile.helpers import compiled
from tests.compile.test_layout import plans

POOLS = {
    "max_pool": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max_pool_dilated": lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2),
    "max_pool_ceil": lambda x: F.max_pool2d(x, 3, 2, 0, ceil_mode=True),
    "avg_pool": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg_pool_no_pad_count": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    "avg_pool_divisor": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "adaptive_avg_pool_1": lambda x: F.adaptive_avg_pool2d(x, 1),
    "adaptive_avg_pool_uneven": lambda x: F.adaptive_avg_pool2d(x, (4, 5)),
}
FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", list(POOLS))
def test_pooling_forward_and_backward_match_eager(name, fmt):
    f = POOLS[name]
    x = torch.randn(2, 4, 7, 9).to(memory_format=FORMATS[fmt])
    if name.startswith("max"):
        x[0, 0, 1, 1] = float("nan")            # NaN wins the window, as in eager
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = f(xr)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # no op runs as ATen
        out = compiled(f)(xc)
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(g)
    torch.testing.assert_close(out, ref, equal_nan=True)
    torch.testing.assert_close(xc.grad, xr.grad)
    assert out.stride() == ref.stride() and xc.grad.stride() == xr.grad.stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_max_pool_indices_match_eager_on_ties_and_nans(dtype):
    f = lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)   # noqa: E731
    x = torch.randint(-2, 2, (2, 4, 7, 9)).to(dtype).to(memory_format=torch.channels_last)
    x[0, 0, 1, 1:3] = float("nan")     # the last NaN of a window is its index
    x[1, 1] = float("-inf")            # all -inf: the first element inside the input
    (values, indices), (ref_values, ref_indices) = compiled(f)(x), f(x)
    assert torch.equal(indices, ref_indices) and indices.stride() == ref_indices.stride()
    torch.testing.assert_close(values, ref_values, equal_nan=True)


@pytest.mark.parametrize("name", ["max_pool", "max_pool_dilated", "avg_pool", "avg_pool_no_pad_count"])
def test_channels_last_pooling_unrolls_its_window(name):
    # as an [XBLOCK, RBLOCK] tile a 3x3 window ran at ~2% of copy bandwidth on the H100 (index arithmetic
    # per window element, 7 of 16 lanes empty); unrolled, each window element is one load at a constant offset
    # along the channels
    x = torch.randn(2, 16, 9, 9).to(memory_format=torch.channels_last)
    (kernel,) = [k for k in brrr.explain(POOLS[name], x).kernels if "pool" in k.name]
    assert "rindex" not in kernel.source and "RBLOCK)" not in kernel.source
    assert kernel.source.count("tl.load(") == 9


REDUCTIONS = {
    "sum": lambda x: x.sum(0), "mean": lambda x: x.mean(0), "prod": lambda x: x.prod(0),
    "amax": lambda x: x.amax(0), "amin": lambda x: x.amin(0), "any": lambda x: (x > 0.5).any(0),
    "all": lambda x: (x > -1.0).all(0), "int_sum": lambda x: (x * 4).to(torch.int32).sum(0),
    "softmax_of_columns": lambda x: torch.softmax(x, 0), "var": lambda x: x.var(0),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_small_column_reductions_unroll_and_match_eager(name):
    # five rows reduced per column: the reduced dim is outermost in memory, so each is unrolled in the source
    f = REDUCTIONS[name]
    x = torch.randn(5, 3, 70, dtype=torch.float64)
    x[2, 1, 3] = float("nan")   # max/min/sum/softmax propagate it as eager does
    x[:, 2, 5] = float("-inf")
    kernels = brrr.explain(f, x).kernels
    assert kernels and all("rindex" not in k.source for k in kernels if k.space.count("reducing"))
    out, ref = compiled(f)(x), f(x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, equal_nan=True)


class Block(nn.Module):
    """conv, BN, ReLU, conv, BN, residual add, ReLU, max-pool (ResNet's basic block and stem pool)."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.pool(F.relu(y + x))


def _block(seed=0):
    torch.manual_seed(seed)
    model = Block().to(memory_format=torch.channels_last)
    x = torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last)
    return model, x


def test_resnet_block_channels_last_training_matches_eager():
    model, x = _block()
    twin, _ = _block()
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        out = compiled(model)(xc)
    ref = twin(xr)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert out.stride() == ref.stride() and xc.grad.stride() == xr.grad.stride()
    torch.testing.assert_close(xc.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    for a, b in zip(model.buffers(), twin.buffers()):   # running statistics
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_resnet_block_channels_last_inference_has_no_layout_changes():
    model, x = _block()
    model.eval()
    with torch.no_grad():
        ref = model(x)
        out = compiled(model)(x)
        planned = plans(model, x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert out.stride() == ref.stride()
    (kind, plan, kernels), = planned
    externs = [step.fx.target.__name__ for step_kind, step in plan.steps if step_kind == "aten"]
    assert all(name.startswith("convolution") for name in externs)   # nothing else runs as ATen
    for step_kind, k in plan.steps:
        if step_kind == "kernel":
            assert not k.tile                                     # no kernel converts between layouts
    assert any("bn" in ks.name and "relu" in ks.name for ks in kernels.values())
    ex = brrr.explain(model, x)
    assert not ex.fallbacks and any("max_pool2d" in k.name for k in ex.kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_inference_batch_norm_takes_one_rsqrt_per_element_and_matches_eager(dtype):
    """The decomposition's `1 / sqrt(var + eps)` renders as one rsqrt in fp32 compute (fp64 keeps the division);
    values stay eager's against a float64 reference."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 5, 5).to(dtype).contiguous(memory_format=torch.channels_last)
    mean, var = torch.randn(16).to(dtype), (torch.rand(16) + 0.25).to(dtype)
    weight, bias = torch.randn(16).to(dtype), torch.randn(16).to(dtype)

    def f(x, mean, var, weight, bias):
        return F.relu(F.batch_norm(x, mean, var, weight, bias, training=False, eps=1e-5))

    args = (x, mean, var, weight, bias)
    (kernel,) = brrr.explain(f, *args).kernels
    if dtype == torch.float64:
        assert "tl.rsqrt(" not in kernel.source and "tl.sqrt(" in kernel.source
    else:
        assert "tl.rsqrt(" in kernel.source and "tl.sqrt(" not in kernel.source
    got, want = compiled(f)(*args), f(*args)
    ref = f(*(a.double() for a in args))
    err, eager_err = (got.double() - ref).abs().max().item(), (want.double() - ref).abs().max().item()
    assert err <= 2 * eager_err + (1e-6 if dtype == torch.float32 else 1e-12), (err, eager_err)
