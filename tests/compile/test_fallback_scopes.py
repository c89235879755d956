"""Fallback scopes (brrr/compile/fallbacks.py): what brrr cannot compile runs as ATen at the smallest scope.

- graph: a graph whose planning raises (or with symbolic shapes, past the shapes specialize.py compiles)
  runs as Dynamo captured it: no
  decomposition, so none of the `prims.*` calls a core-ATen graph holds (each costs ~100 us of host time);
- kernel: a kernel that fails to generate or to launch has only its ops run as ATen, the rest stays compiled;
- op: a lowering refusal (tests/compile/test_mathops.py);
- an out-of-memory error is never a fallback.
"""

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import brrr
from brrr.compile import backend, fallbacks
from brrr.compile.backend import brrr_backend
from brrr.compile.codegen import triton as codegen
from brrr.compile.fallbacks import MAX_REPLANS
from brrr.compile.passes import specialize
from brrr.compile.runtime import compiled as runtime


class OpRecorder(TorchDispatchMode):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def recording_backend(seen, returned):
    """brrr's backend, with every call of what it returns run under an op recorder."""
    def spy(gm, example_inputs):
        fn = brrr_backend(gm, example_inputs)
        returned.append((gm, fn))

        def run(*args):
            with OpRecorder(seen):
                return fn(*args)
        return run
    return spy


def norm_and_var(x):
    # decomposes into prims.var / prims.broadcast_in_dim in a core-ATen graph
    return torch.nn.functional.layer_norm(x, x.shape[-1:]) * x.var(-1, keepdim=True)


def _runs_dynamo_graph(fn, returned):
    gm, compiled = returned[-1]
    return getattr(compiled, "__self__", None) is gm


def test_symbolic_graph_past_its_shape_bound_runs_dynamos_graph_without_decomposition(monkeypatch):
    monkeypatch.setattr(specialize, "MAX_SHAPES", 0)      # no shape gets its own compile (specialize.py)
    real = backend.compile_graph

    def no_symbolic_plan(gm, example_inputs, *args, symbolic_sizes=False, **kw):   # so PerShape takes the graph
        if symbolic_sizes:
            raise fallbacks.GraphFallback("refused by the test")
        return real(gm, example_inputs, *args, **kw)
    monkeypatch.setattr(backend, "compile_graph", no_symbolic_plan)
    seen, returned = [], []
    cf = torch.compile(norm_and_var, backend=recording_backend(seen, returned), dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x), norm_and_var(x))
    per_shape = returned[-1][1]
    assert all(fn is per_shape.eager_forward for fn in per_shape.compiled.values())
    assert any("layer_norm" in op for op in seen)         # eager's own op, not its decomposition
    assert not [op for op in seen if op.startswith("prims.")]


def test_planning_failure_runs_dynamos_graph(monkeypatch):
    monkeypatch.delenv("BRRR_DEBUG", raising=False)

    def planning_fails(gm, *args, **kwargs):
        raise RuntimeError("a planning bug")
    monkeypatch.setattr(backend, "plan_graph", planning_fails)
    seen, returned = [], []
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = torch.compile(norm_and_var, backend=recording_backend(seen, returned))(x)
    torch.testing.assert_close(out, norm_and_var(x))
    assert _runs_dynamo_graph(norm_and_var, returned)
    assert seen and not [op for op in seen if op.startswith("prims.")]
    assert any("planning failed" in str(m.message) and "a planning bug" in str(m.message) for m in w)
    assert fallbacks.LOG[-1].scope == "graph" and "a planning bug" in fallbacks.LOG[-1].reason


def two_kernels(x, y):
    # two iteration spaces, so two kernels: a row reduction of x and a pointwise kernel over y
    return (x.sin() + 1).sum(-1), y.cos() * 2


def _break_op(monkeypatch, name, when):
    """Codegen renders op `name` as Triton that fails `when` ("launch": an unknown function; "generate": raise)."""
    real = codegen.Codegen.op

    def broken(self, v, a, dts):
        if v.name == name and when == "generate":
            raise RuntimeError(f"cannot render {name}")
        out = real(self, v, a, dts)
        return f"tl.this_does_not_exist({out})" if v.name == name else out
    monkeypatch.setattr(codegen.Codegen, "op", broken)


def _built_graphs(monkeypatch):
    built = []
    real = runtime.build

    def spy(*args, **kw):
        compiled, kernels = real(*args, **kw)
        built.append(compiled)
        return compiled, kernels
    monkeypatch.setattr(runtime, "build", spy)
    return built


@pytest.mark.parametrize("when", ["launch", "generate"])
def test_failing_kernel_runs_its_ops_as_aten_and_the_rest_stays_compiled(monkeypatch, when):
    monkeypatch.delenv("BRRR_DEBUG", raising=False)
    _break_op(monkeypatch, "cos", when)
    built = _built_graphs(monkeypatch)
    x, y = torch.randn(8, 32), torch.randn(5, 7)
    fallbacks._WARNED.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = torch.compile(two_kernels, backend=brrr_backend, dynamic=False)(x, y)
    for o, r in zip(out, two_kernels(x, y)):
        torch.testing.assert_close(o, r)
    source = built[0].source   # the first graph built, after its re-plan
    assert "fallback: kernel" in source and "aten.cos" in source          # cos: an ATen call now
    assert source.count("# grid") == 1                                      # the sin+sum kernel still runs
    assert any("op(s) run as ATen, the rest of the graph stays compiled" in str(m.message) for m in w)
    assert fallbacks.LOG[-1].scope == "kernel" and when in fallbacks.LOG[-1].reason
    assert built[0].call is not built[0]._aten_call


def many_kernels(a, b, c, d, e):
    return a.cos(), (b.cos() * 2).sum(0), c.cos() + 1, d.cos().sum(-1), e.cos() - 3


def test_kernels_failing_past_the_replans_run_dynamos_graph(monkeypatch):
    monkeypatch.delenv("BRRR_DEBUG", raising=False)
    _break_op(monkeypatch, "cos", "generate")
    seen, returned = [], []
    args = [torch.randn(n, n + 1) for n in (2, 3, 4, 5, 6)]
    out = torch.compile(many_kernels, backend=recording_backend(seen, returned), dynamic=False)(*args)
    for o, r in zip(out, many_kernels(*args)):
        torch.testing.assert_close(o, r)
    assert MAX_REPLANS < 5 and _runs_dynamo_graph(many_kernels, returned)
    assert [f.scope for f in fallbacks.LOG[-MAX_REPLANS - 1:]] == ["kernel"] * MAX_REPLANS + ["graph"]


def test_explain_lists_fallbacks_with_their_scope(monkeypatch):
    x = torch.arange(-6, 6, dtype=torch.int64)
    ex = brrr.explain(lambda x: x ** 7 + 1, x)
    assert [(f.op, f.scope) for f in ex.fallbacks] == [("aten.pow.Tensor_Scalar", "op")]
    assert "op: aten.pow.Tensor_Scalar" in str(ex)

    monkeypatch.delenv("BRRR_DEBUG", raising=False)
    _break_op(monkeypatch, "cos", "generate")
    ex = brrr.explain(two_kernels, torch.randn(8, 32), torch.randn(5, 7))
    assert {f.scope for f in ex.fallbacks} == {"kernel"} and any(f.op == "aten.cos.default" for f in ex.fallbacks)
    assert len(ex.kernels) == 1 and "kernel: aten.cos.default" in str(ex)

    torch._dynamo.reset()   # planned at symbolic sizes (the default): brrr's kernels, no fallback
    ex = brrr.explain(norm_and_var, torch.randn(8, 16), dynamic=True)
    assert not ex.fallbacks and ex.kernels

    torch._dynamo.reset()   # per shape: explain has no shape to plan at, and says so
    monkeypatch.setenv("BRRR_SYMBOLIC_SIZES", "0")
    ex = brrr.explain(norm_and_var, torch.randn(8, 16), dynamic=True)
    assert [(f.scope, f.graph) for f in ex.fallbacks] == [("graph", "dynamo")]
    assert "dynamic shapes" in ex.fallbacks[0].reason and "graph: whole graph" in str(ex)


def test_a_compile_logs_its_op_fallbacks_process_wide_and_explain_does_not():
    """What the zoo records per configuration: every op a compile ran as ATen, with its graph and reason."""
    x = torch.arange(-6, 6, dtype=torch.int64)
    before = len(fallbacks.LOG)
    brrr.explain(lambda x: x ** 7 + 1, x)
    assert len(fallbacks.LOG) == before                   # planning for explain is not a compile
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x ** 7 + 1, backend=brrr_backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(fn(x), x ** 7 + 1)
    logged = fallbacks.LOG[before:]
    assert [(f.scope, f.graph, f.what) for f in logged] == [("op", "inference", "aten.pow.Tensor_Scalar")]
    assert logged[0].reason


def test_out_of_memory_in_a_kernel_is_torchs_error_not_a_fallback(monkeypatch):
    monkeypatch.delenv("BRRR_DEBUG", raising=False)
    from brrr.compile.runtime import launch

    def out_of_memory(self, *args):
        raise torch.OutOfMemoryError("CUDA out of memory (test double)")
    monkeypatch.setattr(launch.Launcher, "__call__", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        torch.compile(two_kernels, backend=brrr_backend, dynamic=False)(torch.randn(8, 32), torch.randn(5, 7))
