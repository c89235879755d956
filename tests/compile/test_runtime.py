"""Runtime behaviour: results, kernel cache, fallbacks, and never a wrong answer."""

import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import brrr
from brrr.compile import cache as kernel_cache, fallbacks
from brrr.compile.backend import brrr_backend
from brrr.compile.runtime import compiled as runtime
from tests.compile.helpers import compiled


def test_pointwise_chain_matches_eager():
    x = torch.randn(1000)
    torch.testing.assert_close(compiled(lambda x: x.cos().cos() * 2 + 1)(x), x.cos().cos() * 2 + 1)


def test_registered_backend_name_and_brrr_compile():
    f = lambda x: torch.sigmoid(x) * x  # noqa: E731
    x = torch.randn(64)
    torch.testing.assert_close(brrr.compile(f)(x), f(x))
    torch._dynamo.reset()
    if "brrr" in torch._dynamo.list_backends(exclude_tags=()):
        torch.testing.assert_close(torch.compile(f, backend="brrr")(x), f(x))


def test_reductions_persistent_and_looped():
    x = torch.randn(4, 20000)      # > persistent limit: looped
    f = lambda x: torch.softmax(x, -1) + x.var(-1, keepdim=True)  # noqa: E731
    torch.testing.assert_close(compiled(f)(x), f(x), rtol=1e-4, atol=1e-5)
    y = torch.randn(300, 5)        # reduction over dim 0 with the inner dim kept
    torch.testing.assert_close(compiled(lambda y: y.sum(0) * y.amax(0))(y), y.sum(0) * y.amax(0), rtol=1e-4, atol=1e-5)


def test_non_contiguous_broadcast_and_zero_size():
    a = torch.randn(16, 8).t()            # non-contiguous
    b = torch.randn(1, 16)                # broadcast
    f = lambda a, b: (a * b).exp()[:, ::2] - a.sum(1, keepdim=True)  # noqa: E731
    torch.testing.assert_close(compiled(f)(a, b), f(a, b), rtol=1e-5, atol=1e-5)
    z = torch.randn(0, 8)
    out = compiled(lambda z: z.cos() + 1)(z)
    assert out.shape == (0, 8)
    torch.testing.assert_close(compiled(lambda z: z.sum(0))(z), z.sum(0))


def test_non_contiguous_output_strides():
    x = torch.randn(4, 6)
    f = lambda x: x.t().contiguous().t() * 2  # noqa: E731   output keeps eager's strides
    out = compiled(lambda x: (x * 2).t())(x)
    assert out.stride() == (x * 2).t().stride()
    torch.testing.assert_close(out, (x * 2).t())
    torch.testing.assert_close(compiled(f)(x), f(x))


def test_unlowered_op_falls_back_with_right_result():
    f = lambda x: torch.cumprod(x.cos(), 0) * 2  # noqa: E731
    x = torch.randn(50)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        torch.testing.assert_close(compiled(f)(x), f(x))


def test_dropout_uses_torch_seed():
    x = torch.ones(4096)
    f = lambda x: F.dropout(x, 0.5, training=True)  # noqa: E731
    cf = compiled(f)
    torch.manual_seed(1)
    a = cf(x)
    torch.manual_seed(1)
    b = cf(x)
    c = cf(x)
    torch.testing.assert_close(a, b)
    assert not torch.equal(b, c)
    kept = (a != 0).float().mean().item()
    assert 0.45 < kept < 0.55 and set(a.unique().tolist()) <= {0.0, 2.0}


def test_corrupted_cache_entry_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    src = "import triton\nimport triton.language as tl\n\n@triton.jit\ndef kx(p, XBLOCK: tl.constexpr):\n    pass\n"
    k = kernel_cache.load_kernel(src, "kx", "cpu")
    (path,) = list((tmp_path / "kernels").glob("brrr_*.py"))
    kernel_cache._MODULES.clear()
    path.write_text(src[: len(src) // 2])            # half-written entry
    assert kernel_cache.load_kernel(src, "kx", "cpu") is not None
    assert path.read_text() == src
    kernel_cache._MODULES.clear()
    path.write_bytes(b"\xff\xfe garbage")              # not even text
    assert kernel_cache.load_kernel(src, "kx", "cpu") is not None
    assert path.read_text() == src
    assert k is not None


def test_end_to_end_with_fresh_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    kernel_cache._MODULES.clear()
    x = torch.randn(33, 7)
    torch.testing.assert_close(compiled(lambda x: torch.log_softmax(x, -1))(x), torch.log_softmax(x, -1))
    entries = list((tmp_path / "kernels").glob("brrr_*.py"))
    assert entries
    for e in entries:                                  # corrupt every entry; a recompile must still be right
        e.write_text("this is not python (")
    kernel_cache._MODULES.clear()
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(lambda x: torch.log_softmax(x, -1))(x), torch.log_softmax(x, -1))


def test_cpu_without_interpreter_runs_aten(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(64)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fallbacks._WARNED.clear()
        torch.testing.assert_close(compiled(lambda x: x.cos() + 1)(x), x.cos() + 1)
    assert any("no GPU" in str(m.message) for m in w)


def test_dynamic_shapes_never_wrong():
    f = lambda x: (x * 2).sum(-1)  # noqa: E731
    cf = torch.compile(f, backend=brrr_backend, dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(n, 4)
        torch.testing.assert_close(cf(x), f(x))


def built_graph(fn, *args):
    """The CompiledGraph brrr builds for `fn(*args)` (the last one, where Dynamo hands it several)."""
    seen = {}
    real = runtime.build

    def spy(plan, gm, cuda_graphs=False, **kw):
        c, ks = real(plan, gm, cuda_graphs, **kw)
        seen["graph"] = c
        return c, ks
    try:
        runtime.build = spy   # the backend looks build up at call time
        compiled(fn)(*args)
    finally:
        runtime.build = real
    return seen["graph"]


def test_generated_call_is_readable_python():
    src = built_graph(lambda x, w: F.linear(x, w).relu(), torch.randn(4, 8), torch.randn(8, 8)).source
    assert "def call(args, owned=False):" in src and "extern" in src and "# grid (" in src


def test_compiled_graph_knows_its_kind():
    # the kind names the graph in fallback logs and explain; a step's kind ("kernel", "aten") once shadowed it
    assert built_graph(lambda x: (x.relu() + 1).sum(1), torch.randn(4, 8)).kind == "inference"
    x = torch.randn(4, 8, requires_grad=True)
    assert built_graph(lambda x: (x.relu() + 1).sum(1), x).kind == "backward"


def test_a_graph_knows_which_of_its_inputs_are_parameters():
    """AOTAutograd's static inputs (parameters and buffers) are what a CUDA graph reads in place; the input
    batch is copied in. A backward's inputs are not described there."""
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with torch.no_grad():
        graph = built_graph(lin, x)
    inputs = [n.meta["val"] for n in graph.gm.graph.nodes if n.op == "placeholder"]
    assert graph.kind == "inference" and len(inputs) == 3
    assert sorted(tuple(inputs[i].shape) for i in graph.static_inputs) == [(8,), (8, 8)]   # weight and bias
    backward = built_graph(lin, x)   # parameters that require grad: the last graph built is the backward
    assert backward.kind == "backward" and backward.static_inputs is None


def test_launchers_know_which_arguments_the_call_allocated():
    call = built_graph(lambda x: (x.relu() + 1).sum(1), torch.randn(4, 8)).call
    launchers = [v for v in call.__globals__.values() if isinstance(v, runtime.Launcher)]
    # one kernel reads the graph input (slot 0, checked per launch) and writes a buffer the call allocates
    assert [sorted(k.fresh_slots) for k in launchers] == [[1]]


def test_split_reductions_for_few_long_rows():
    x = torch.randn(70001)
    for f in (lambda x: x.sum(), lambda x: x.amax(), lambda x: x.var(), lambda x: (x > 3).any(),
              lambda x: x[:70000].reshape(2, 35000).mean(-1), lambda x: x.half().sum()):
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(f)(x), f(x), rtol=1e-4, atol=1e-3)
    from brrr.compile.explain import explain
    ex = explain(lambda x: x.sum(), x)
    assert len(ex.kernels) == 2      # partial sums over chunks, then the partials


def test_embedding_backward_accumulates_duplicates_with_atomics():
    w = torch.randn(10, 4, requires_grad=True)
    idx = torch.tensor([[1, 3, 1], [9, 1, 0]])
    f = lambda w, i: F.embedding(i, w).exp()  # noqa: E731
    out = compiled(f)(w, idx)
    (g,) = torch.autograd.grad(out.sum(), w)
    (gr,) = torch.autograd.grad(f(w, idx).sum(), w)
    torch.testing.assert_close(g, gr)
    from brrr.compile.explain import explain
    ex = explain(f, w, idx, train=True)
    assert not ex.fallbacks
    assert any("atomic_add" in k.source for k in ex.kernels)


def test_split_column_reductions(small_column_splits):
    x = torch.randn(261, 600)
    for f in (lambda x: x.sum(0), lambda x: x.amax(0, keepdim=True), lambda x: x.reshape(261, 6, 100).mean((0, 1)),
              lambda x: x.var(0)):
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(f)(x), f(x), rtol=1e-4, atol=1e-4)


def test_intermediates_are_deleted_after_their_last_use():
    lines = ["def call(args):", "    x, = args", "    buf_a = f(x)", "    buf_b = g(buf_a)", "    # a comment",
             "    k0(buf_b, buf_a2)", "    res_c = h(buf_b)", "    buf_d = res_c[0]", "    return (buf_d,)"]
    got = runtime.free_dead_buffers(lines)
    assert got == ["def call(args):", "    x, = args", "    buf_a = f(x)", "    buf_b = g(buf_a)", "    del buf_a",
                   "    # a comment", "    k0(buf_b, buf_a2)", "    del buf_a2", "    res_c = h(buf_b)", "    del buf_b",
                   "    buf_d = res_c[0]", "    del res_c", "    return (buf_d,)"]


def test_chains_of_views_become_one_as_strided_and_the_middle_goes():
    lines = ["def call(args):", "    x, = args", "    buf_v1 = x.view((4, 4))  # view aten.view.default",
             "    buf_v2 = x.as_strided((4, 4), (1, 4))  # view aten.permute.default", "    res_mm = mm(buf_v2, x)",
             "    return (res_mm,)"]
    assert runtime.drop_unused_views(lines) == lines[:2] + lines[3:]


def test_folded_views_match_eager_on_extern_inputs():
    def f(x, w):
        y = torch.mm(x, w)                                      # an extern: its output is materialized
        z = y.view(4, 2, 8).permute(1, 0, 2).reshape(2, 32)     # a chain of views feeding another extern
        return torch.mm(z.t(), z[:, 3:11].contiguous().t().contiguous().t())
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    torch.testing.assert_close(compiled(f)(x, w), f(x, w))


def test_flip_is_computed_not_folded_into_a_view():
    # flip has no strides that express it: as a "view" its chain with permute folded into one as_strided
    # and the flip disappeared (rot90 was wrong in 80% of its elements)
    t = torch.randn(5, 4, 3)
    for f in (lambda t: (t * 2).flip([0]).permute(2, 1, 0), lambda t: torch.rot90(t * 2, 1, [0, 2]),
              lambda t: torch.rot90(t, 2, [1, 2]), lambda t: (t + 1).flip([0, 2]).t() if t.dim() == 2 else t):
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(f)(t), f(t))
    plan = brrr.explain(lambda t: (t * 2).flip([0]).permute(2, 1, 0), t)
    assert any("flip" in k.ops for k in plan.kernels)


def test_every_host_view_aliases_its_input():
    from brrr.compile.ir import nodes as ir

    class Target:
        def __init__(self, name, is_view):
            self.__name__, self.is_view = name, is_view
    assert ir.aliases_input(torch.ops.aten.permute.default) and ir.aliases_input(torch.ops.aten._unsafe_view.default)
    assert not ir.aliases_input(torch.ops.aten.flip.default) and not ir.aliases_input(Target("roll", False))


def test_as_strided_of_a_graph_input_reads_the_callers_storage():
    # as_strided addresses the input's storage: a graph input's storage offset is the caller's (an autograd
    # tangent's differs from the traced one), so a kernel reading at the traced offset read outside the tensor
    from torch.fx.experimental.proxy_tensor import make_fx

    from brrr.compile.backend import compile_graph
    f = lambda x: (torch.as_strided(x, (3,), (1,), 0) * 2,)  # noqa: E731
    gm = make_fx(f, tracing_mode="fake")(torch.randn(4)[1:])    # traced with storage offset 1
    x = torch.randn(3)                                          # called with storage offset 0
    torch.testing.assert_close(compile_graph(gm, [x])([x]), f(x))


def test_reductions_of_index_values_reduce_in_int64():
    # an arange is an int32 index in registers: a min with int64's identity did not fit (multilabel_margin_loss)
    x = torch.randn(3, 7)
    f = lambda x: torch.where(x > 0, torch.arange(7), 7).amin(-1) + torch.arange(7).expand(3, 7).sum(-1)  # noqa: E731
    torch.testing.assert_close(compiled(f)(x), f(x))
    u = torch.rand(3, 7)   # ...while an arg-reduction over floats compares the floats, not their integer parts
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(lambda u: u.max(-1))(u), u.max(-1))


@pytest.mark.parametrize("ord", [2, 1, float("inf"), float("-inf"), 0, 3, 0.5, -1])
def test_vector_norms_of_every_order_run_in_kernels(ord):
    x = torch.randn(6, 33)
    x[0, :5] = 0
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        f = lambda x: torch.linalg.vector_norm(x, ord, dim=-1) + torch.linalg.vector_norm(x, ord, dim=0).sum()  # noqa: E731
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(f)(x.to(dtype)), f(x.to(dtype)), rtol=tol, atol=tol)
    assert not brrr.explain(f, x).fallbacks


def test_slice_select_diagonal_scatters_and_repeat_run_in_kernels():
    x, s = torch.randn(7, 9), torch.randn(7, 3)
    aten = torch.ops.aten
    fs = [lambda x, s: aten.slice_scatter(x, s, 1, 1, 8, 3), lambda x, s: aten.slice_scatter(x, s, 1, -8, None, 3),
          lambda x, s: aten.slice_scatter(x, x[:2] * 3, 0, 5, 100),
          lambda x, s: aten.select_scatter(x, s[:, 1], 1, -2), lambda x, s: aten.diagonal_scatter(x, s[:6, 0], -1),
          lambda x, s: aten.diagonal_scatter(x, s[:, 0], 2), lambda x, s: s.repeat(2, 1, 3) * 2]
    for f in fs:
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(f)(x, s), f(x, s))
        assert not brrr.explain(f, x, s).fallbacks
