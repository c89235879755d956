"""A column split's partial sums taken by the kernel that produces what they sum (lower.split_reduction records
the producer, schedule.Scheduler.take_partial_sums moves its kernel onto the partial space): a bias gradient is
summed as the activation gradient is written, not read back. Values against eager (float64 for bf16), and the
kernels and bytes explain reports."""

import pytest
import torch

import brrr
from brrr.compile import lower
from brrr.compile.codegen import triton as triton_codegen


@pytest.fixture
def small_splits(monkeypatch):
    """Column splits at test sizes (the GPU's thresholds need millions of elements)."""
    monkeypatch.setattr(lower, "SPLIT_COLUMN_MIN_R", 64)
    monkeypatch.setattr(lower, "SPLIT_COLUMN_MIN_NUMEL", 1024)


class MLP(torch.nn.Module):
    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.up, self.down = torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def _backward_kernels(model, x):
    return [k for k in brrr.explain(model, x, train=True).kernels if k.graph == "backward"]


@pytest.mark.parametrize("looped", [False, True])   # the partial's rows held whole, or looped over
def test_bias_gradient_is_summed_where_the_activation_gradient_is_written(small_splits, monkeypatch, looped):
    rows = 512
    if looped:
        monkeypatch.setattr(triton_codegen, "FEW_COLUMNS", 16)
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(2, rows // 2, 32)
    kernels = _backward_kernels(model, x)
    fused = [k for k in kernels if "gelu_backward" in k.ops or "erf" in k.ops]
    assert len(fused) == 1 and "sum" in fused[0].ops and fused[0].space.endswith("reducing dims [1]")
    grad_bytes = rows * 64 * 4
    assert fused[0].bytes_read == 2 * grad_bytes                  # the pre-activation and its output's gradient
    assert grad_bytes <= fused[0].bytes_written < grad_bytes + 64 * 4 * 8   # the gradient, and partial sums
    # no other kernel reads the activation gradient back for its sum
    assert not any(k is not fused[0] and k.space.startswith(f"[{rows}, 64]") for k in kernels)
    # looped: the gradient is stored in the same pass over the rows that sums it, not in a second one
    assert fused[0].source.count("for roffset") == int(looped)

    model.zero_grad()   # explain's capture may leave gradients behind
    brrr.compile(model)(x).square().sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(x).square().sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-4)


def test_in_bf16_the_fused_sums_match_eager_against_float64(small_splits):
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(2, 256, 32)
    ref = MLP().double()
    ref.load_state_dict(model.state_dict())
    ref(x.double()).square().sum().backward()
    model = model.to(torch.bfloat16)
    eager = MLP().to(torch.bfloat16)
    eager.load_state_dict(model.state_dict())
    eager(x.bfloat16()).square().sum().backward()
    brrr.compile(model)(x.bfloat16()).square().sum().backward()
    for (n, p), q, r in zip(model.named_parameters(), eager.parameters(), ref.parameters()):
        scale = r.grad.abs().max().item()
        err, eager_err = (p.grad.double() - r.grad).abs().max().item(), (q.grad.double() - r.grad).abs().max().item()
        assert err <= 2 * eager_err + 1e-3 * scale, (n, err, eager_err)


def test_a_sum_over_its_producer_unreshaped_is_taken_too(small_splits):
    def f(a, b):
        y = a * b + 1
        return y, y.sum(0)
    a, b = torch.randn(512, 48), torch.randn(512, 48)
    kernels = brrr.explain(f, a, b).kernels
    assert [k.space for k in kernels][0].endswith("reducing dims [1]") and len(kernels) == 2   # partials, final
    y, s = brrr.compile(f)(a, b)
    torch.testing.assert_close(y, a * b + 1)
    torch.testing.assert_close(s, (a * b + 1).sum(0), rtol=1e-5, atol=1e-4)


def test_a_producer_stored_in_another_layout_keeps_its_own_kernel(small_splits):
    """An output eager lays out transposed: walking the partial space would store it a sector per element."""
    def f(a, b):
        y = (a * b).t().contiguous().t()
        return y, y.sum(0)
    a, b = torch.randn(512, 48), torch.randn(512, 48)
    y, s = brrr.compile(f)(a, b)
    torch.testing.assert_close(y, a * b)
    assert y.stride() == (a * b).t().contiguous().t().stride()
    torch.testing.assert_close(s, (a * b).sum(0), rtol=1e-5, atol=1e-4)
