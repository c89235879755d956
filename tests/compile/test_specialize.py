"""Changing shapes: a graph Dynamo captures with symbolic sizes is planned once at those sizes (sizes.py); one
brrr cannot plan so is compiled once per concrete shape (specialize.py), each with brrr's kernels, up to
MAX_SHAPES; past them it runs as captured."""

import warnings

import pytest
import torch

from brrr.compile import backend, fallbacks
from brrr.compile.backend import brrr_backend
from brrr.compile.passes import specialize


def norm_matmul(x, w):
    return torch.nn.functional.layer_norm(x, x.shape[-1:]) * x.var(-1, keepdim=True) @ w


def compiled_with_returns(fn, **options):
    returned = []

    def spy(gm, example_inputs):
        out = brrr_backend(gm, example_inputs, **options)
        returned.append(out)
        return out
    torch._dynamo.reset()
    return torch.compile(fn, backend=spy), returned


def check_step(cf, n, w):
    x = torch.randn(n, 16, dtype=torch.float64, requires_grad=True)
    out = cf(x, w)
    ref_x = x.detach().clone().requires_grad_()
    ref = norm_matmul(ref_x, w)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)


@pytest.fixture
def no_symbolic_plans(monkeypatch):
    """brrr cannot plan any graph at symbolic sizes: the per-shape path takes them."""
    real = backend.compile_graph

    def refuse(gm, example_inputs, *args, symbolic_sizes=False, **kw):
        if symbolic_sizes:
            raise fallbacks.GraphFallback("refused by the test")
        return real(gm, example_inputs, *args, **kw)
    monkeypatch.setattr(backend, "compile_graph", refuse)


def test_one_symbolic_compile_serves_every_later_shape(monkeypatch):
    planned = []
    real_plan = backend.plan_graph
    monkeypatch.setattr(backend, "plan_graph", lambda gm, *a, **k: planned.append(gm) or real_plan(gm, *a, **k))
    last = fallbacks.LOG[-1] if fallbacks.LOG else None   # the log keeps the latest 1000: watch its tail
    cf, returned = compiled_with_returns(norm_matmul, symbolic_sizes=True)
    w = torch.randn(16, 8, dtype=torch.float64)
    for n in (3, 5, 9, 5, 17):
        check_step(cf, n, w)
    assert len(returned) == 2 and not any(isinstance(r, specialize.PerShape) for r in returned)
    assert len(planned) == 2 * 2          # forward and backward: at 3, then at symbolic sizes for all others
    assert (fallbacks.LOG[-1] if fallbacks.LOG else None) is last


def test_each_new_shape_gets_brrrs_kernels_and_matches_eager(monkeypatch, no_symbolic_plans):
    planned = []
    real_plan = backend.plan_graph
    monkeypatch.setattr(backend, "plan_graph", lambda gm, *a, **k: planned.append(gm) or real_plan(gm, *a, **k))
    cf, returned = compiled_with_returns(norm_matmul)
    w = torch.randn(16, 8, dtype=torch.float64)
    for n in (3, 5, 9, 5, 17):
        check_step(cf, n, w)
    static, per_shape = returned        # one static graph, then one symbolic graph for every later length
    assert isinstance(per_shape, specialize.PerShape) and not isinstance(static, specialize.PerShape)
    assert len(per_shape.compiled) == 3                      # 5, 9 and 17: the second 5 reuses its compile
    assert all(fn is not per_shape.eager_forward for fn in per_shape.compiled.values())
    assert len(planned) == 4 * 2                              # forward and backward of each concrete shape
    refused = [f for f in fallbacks.LOG if f.reason == "refused by the test"]
    assert fallbacks.LOG[-1] is refused[-1]   # the log keeps the latest 1000: compare its tail, not its length


def test_past_the_bound_shapes_run_the_captured_graph(monkeypatch, no_symbolic_plans):
    monkeypatch.setattr(specialize, "MAX_SHAPES", 2)
    cf, returned = compiled_with_returns(norm_matmul)
    w = torch.randn(16, 8, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 5, 9, 11):
            check_step(cf, n, w)
    per_shape = returned[-1]
    fns = list(per_shape.compiled.values())
    assert [fn is per_shape.eager_forward for fn in fns] == [False, False, True]
    assert any("shapes of this graph already compiled" in str(c.message) for c in caught)


def test_signature_tells_sizes_strides_and_values_apart():
    x = torch.randn(4, 6)
    assert specialize.signature((x, 3)) != specialize.signature((x.t(), 3))
    assert specialize.signature((x, 3)) != specialize.signature((x, 4))
    assert specialize.signature((x, 3)) == specialize.signature((torch.randn(4, 6), 3))
