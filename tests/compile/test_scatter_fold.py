"""Scatters that combine (scatter_add, scatter_reduce, index_reduce, index_add: atomics into an accumulator,
lowering/scatter.py) and F.fold / F.unfold (col2im as a gather, im2col as a pointwise kernel, windows.py): equal to
eager with repeated indices, forward and backward, and run as brrr kernels, not ATen."""

import pytest
import torch
import torch.nn.functional as F

from brrr.compile.explain import explain
from tests.compile.helpers import compiled

INDEX = torch.tensor([[0, 2, 0, 1], [4, 0, 0, 1], [0, 0, 3, 3], [0, 4, 0, 0]])   # row 0 hit up to 4 times
REDUCES = ["sum", "mean", "amax", "amin"]


def _inputs(dtype, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, generator=g).to(dtype).requires_grad_(requires_grad)
    src = torch.randn(4, 4, generator=g).to(dtype).requires_grad_(requires_grad)
    return x, src


def _scatter(reduce, include_self):
    if reduce == "add":
        return lambda x, src: x.scatter_add(0, INDEX, src) * 1
    return lambda x, src: x.scatter_reduce(0, INDEX, src, reduce, include_self=include_self) * 1


def _no_fallbacks(fn, *args, train=False):
    ex = explain(fn, *args, train=train)
    assert not ex.fallbacks, [(f.op, f.reason) for f in ex.fallbacks]
    return ex


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["add"] + REDUCES)
def test_scatter_float32_forward_and_backward_equal_eager(reduce, include_self):
    if reduce == "add" and not include_self:
        pytest.skip("scatter_add always includes self")
    fn = _scatter(reduce, include_self)
    x, src = _inputs(torch.float32, requires_grad=True)
    torch._dynamo.reset()
    out, ref = compiled(fn)(x, src), fn(x, src)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(out, (x, src), grad), torch.autograd.grad(ref, (x, src), grad)):
        torch.testing.assert_close(got, want)
    ex = _no_fallbacks(fn, x, src, train=True)
    assert any("tl.atomic_" in k.source for k in ex.kernels)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["add"] + REDUCES)
def test_scatter_half_types_as_accurate_as_eager(reduce, include_self, dtype):
    """Half types accumulate in float32 and round once: against a float64 reference, never further off than
    eager (which adds in the half type) or than rounding the exact answer."""
    if reduce == "add" and not include_self:
        pytest.skip("scatter_add always includes self")
    fn = _scatter(reduce, include_self)
    x, src = _inputs(dtype)
    torch._dynamo.reset()
    out, eager, exact = compiled(fn)(x, src), fn(x, src), fn(x.double(), src.double())
    assert out.dtype == dtype
    err = (out.double() - exact).abs().max()
    allowed = max((eager.double() - exact).abs().max(), (exact.to(dtype).double() - exact).abs().max())
    assert err <= allowed, (err, allowed)
    _no_fallbacks(fn, x, src)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_nan_wins_max_and_min_as_in_eager(reduce, include_self):
    fn = _scatter(reduce, include_self)
    x, src = _inputs(torch.float32)
    src[0, 0] = float("nan")
    src[3, 2] = -(torch.tensor(float("inf")) - float("inf"))   # the NaN an x86 CPU makes has its sign bit set
    x[2, 1] = float("nan")
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(fn)(x, src), fn(x, src), equal_nan=True)


def test_integer_scatters_are_exact():
    x, src = torch.randint(-50, 50, (5, 4)), torch.randint(-50, 50, (4, 4))
    for reduce in REDUCES:
        for include_self in (True, False):
            fn = _scatter(reduce, include_self)
            torch._dynamo.reset()
            assert torch.equal(compiled(fn)(x, src), fn(x, src)), (reduce, include_self)
    fn = _scatter("add", True)
    x8, src8 = torch.full((5, 4), 100, dtype=torch.int8), torch.full((4, 4), 100, dtype=torch.int8)
    torch._dynamo.reset()
    assert torch.equal(compiled(fn)(x8, src8), fn(x8, src8))   # wraps as eager's int8 adds do


def test_prod_stays_aten_with_its_reason():
    fn = _scatter("prod", True)
    x, src = _inputs(torch.float32)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(fn)(x, src), fn(x, src))
    ex = explain(fn, x, src)
    assert [f.op for f in ex.fallbacks] == ["aten.scatter_reduce.two"]
    assert "no atomic prod" in ex.fallbacks[0].reason


def test_index_reduce_and_index_add():
    x, src = _inputs(torch.float32)
    index = torch.tensor([0, 2, 0, 0])
    for reduce in ("mean", "amax", "amin"):
        for include_self in (True, False):
            fn = lambda x, s: x.index_reduce(0, index, s, reduce, include_self=include_self) * 1  # noqa: E731
            torch._dynamo.reset()
            torch.testing.assert_close(compiled(fn)(x, src), fn(x, src))
            _no_fallbacks(fn, x, src)
    added = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float32, torch.bfloat16):   # index_add decomposes into index_put(accumulate=True)
        fn = lambda x, s: x.index_add(1, index, s, alpha=2) * 1  # noqa: E731
        xd, sd = x.to(dtype), added.to(dtype)
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(fn)(xd, sd), fn(xd, sd))
        _no_fallbacks(fn, xd, sd)


def test_index_reduce_into_a_0_dim_tensor_runs_as_aten_with_its_reason():
    fn = lambda x, s: x.index_reduce(0, torch.tensor([0]), s, "mean") * 1  # noqa: E731
    x, s = torch.tensor(2.0), torch.tensor(5.0)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(fn)(x, s), fn(x, s))
    assert [f.reason for f in explain(fn, x, s).fallbacks] == ["index_reduce into a 0-dim tensor"]


def test_one_value_scattered_at_repeated_positions():
    x, _ = _inputs(torch.float32)
    fn = lambda x: x.scatter(0, INDEX, 0.5) + 1  # noqa: E731
    torch._dynamo.reset()
    assert torch.equal(compiled(fn)(x), fn(x))
    _no_fallbacks(fn, x)


def test_empty_index_and_out_of_range_indices():
    x, src = _inputs(torch.float32)
    empty = torch.zeros(0, 4, dtype=torch.long)
    for reduce in ("sum", "amax"):
        fn = lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=False) * 1  # noqa: E731
        torch._dynamo.reset()
        assert torch.equal(compiled(fn)(x, empty, src), fn(x, empty, src))
    fn = lambda x, i, s: x.scatter_add(0, i, s) * 1  # noqa: E731
    torch._dynamo.reset()
    c = compiled(fn)
    torch.testing.assert_close(c(x, INDEX, src), fn(x, INDEX, src))
    for value in (5, -1):
        bad = INDEX.clone()
        bad[1, 2] = value
        with pytest.raises(RuntimeError):
            fn(x, bad, src)        # eager refuses it ...
        with pytest.raises(RuntimeError, match="out of range"):
            c(x, bad, src)         # ... and so does brrr, instead of writing outside x


FOLDS = [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=4, stride=4),
         dict(kernel_size=(2, 3), dilation=(2, 1), stride=(1, 2), padding=(1, 0)),
         dict(kernel_size=3, dilation=2, stride=2, padding=2)]


@pytest.mark.parametrize("case", range(len(FOLDS)))
def test_fold_and_unfold_equal_eager_forward_and_backward(case):
    kw = FOLDS[case]
    for shape in [(2, 3, 7, 6), (3, 6, 5)]:
        image = torch.randn(*shape, requires_grad=True)
        unfold = lambda x: F.unfold(x, **kw)  # noqa: E731
        fold = lambda c: F.fold(c, shape[-2:], **kw)  # noqa: E731
        cols = unfold(image).detach().clone().requires_grad_(True)
        for fn, x in ((unfold, image), (fold, cols)):
            torch._dynamo.reset()
            out, ref = compiled(fn)(x), fn(x)
            torch.testing.assert_close(out, ref)
            grad = torch.randn_like(ref)
            torch.testing.assert_close(torch.autograd.grad(out, x, grad)[0], torch.autograd.grad(ref, x, grad)[0])


def test_fold_is_one_gather_kernel_without_index_put():
    cols = torch.randn(2, 3 * 9, 9, requires_grad=True)
    fold = lambda c: F.fold(c, (6, 6), 3, padding=1, stride=2) * 2  # noqa: E731
    ex = _no_fallbacks(fold, cols, train=True)
    assert [k.graph for k in ex.kernels] == ["forward", "backward"], [(k.graph, k.ops) for k in ex.kernels]
    assert "col2im" in ex.kernels[0].ops and "im2col" in ex.kernels[1].ops
    assert not any("atomic" in k.source for k in ex.kernels)
    x = torch.randn(2, 3, 6, 6, dtype=torch.bfloat16)
    unfold = lambda x: F.unfold(x, 3, padding=1) + 1  # noqa: E731
    torch._dynamo.reset()
    assert torch.equal(compiled(unfold)(x), unfold(x))
    assert len(_no_fallbacks(unfold, x).kernels) == 1


@pytest.mark.parametrize("width", [1, 4, 40])
def test_edge_messages_scatter_with_their_rows_innermost(width):
    # a graph layer's messages [edges, width] added into [nodes, width] by destination: lanes walk a row's
    # elements, so neighbouring atomic adds (and gathers by source) touch neighbouring addresses; the edge
    # list, read once per row, is the outer dim. The values equal eager's either way.
    from tests.compile.test_layout import kernels_of

    def layer(h, w, src, dst):
        return torch.zeros_like(h).index_add(0, dst, h[src] * w[:, None])

    nodes, edges = 6, 400   # the edge list (int64) outweighs the node features it gathers and scatters into
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(nodes, width, generator=g), torch.rand(edges, generator=g)
    src, dst = torch.randint(0, nodes, (edges,), generator=g), torch.randint(0, nodes, (edges,), generator=g)
    (scatter,) = [k for k in kernels_of(layer, h, w, src, dst) if len(k.shape) == 2 and k.shape[0] == edges]
    if width > 1:
        assert scatter.loop_order()[0] == 1
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(layer)(h, w, src, dst), layer(h, w, src, dst))


def test_a_scatter_along_the_last_dim_walks_its_index_rows():
    # the index picks positions within each contiguous row of the target: lanes walk the index and source rows
    # (their loads coalesced), not the target's rows
    from tests.compile.test_layout import kernels_of

    def along_last(x, i, s):
        return x.scatter_add(1, i, s)

    g = torch.Generator().manual_seed(0)
    x, s = torch.randn(64, 8, generator=g), torch.randn(64, 16, generator=g)
    i = torch.randint(0, 8, (64, 16), generator=g)
    (scatter,) = [k for k in kernels_of(along_last, x, i, s) if k.shape == (64, 16)]
    assert scatter.loop_order()[0] == 1
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(along_last)(x, i, s), along_last(x, i, s))


def _attention_layer(x, weight, att_src, att_dst, src, dst):
    """A graph-attention layer as PyG computes it: features gathered by source, a softmax over each node's
    incoming edges, messages scattered by destination."""
    n, heads, width = x.shape[0], att_src.shape[0], att_src.shape[1]
    h = (x @ weight).unflatten(1, (heads, width))
    logits = F.leaky_relu((h * att_src).sum(-1)[src] + (h * att_dst).sum(-1)[dst], 0.2)
    index = dst[:, None].expand_as(logits)
    peak = logits.new_full((n, heads), float("-inf")).scatter_reduce(0, index, logits.detach(), "amax")
    weight_e = (logits - peak[dst]).exp()
    total = weight_e.new_zeros(n, heads).scatter_add(0, index, weight_e)
    messages = h[src] * (weight_e / total[dst])[..., None]
    return messages.new_zeros(n, heads, width).scatter_add(0, dst[:, None, None].expand_as(messages), messages)


@pytest.mark.parametrize("saved", [False, True], ids=["recomputed", "saved"])
@pytest.mark.parametrize("nodes,edges,heads,width", [(32, 96, 2, 4), (32, 128, 2, 5), (8, 16, 1, 16500)],
                         ids=["rows-held-whole", "rows-unrolled", "rows-looped"])
def test_a_graph_attention_layer_gathers_each_edge_value_once_each_way(nodes, edges, heads, width, saved,
                                                                      monkeypatch):
    # forward: one kernel over the edges gathers h[src] and adds h[src] * alpha in. The backward gathers h[src]
    # again (partition.py recomputes a gather larger than its table); where a forward saves it instead (`saved`:
    # the partition rule off), that kernel also stores the gathered rows, not a gather kernel whose output the
    # scatter reads back. Backward: the attention's gradient reduces grad[dst] * h[src] over the channels and the
    # features' gradient adds grad[dst] * alpha in by source, from one kernel over the edges (its initial zeros
    # written first). Forward and gradients equal a float64 eager's, for rows a program holds whole, unrolls or
    # loops over. h's table outsizes the [edges, heads] weights, as at GAT's full size, so the backward's kernel
    # walks h's rows, as the largest tensor it reads
    from brrr.compile.passes import partition
    from tests.compile.test_layout import plans

    if saved:
        monkeypatch.setattr(partition, "prefer_recomputing_gathers", lambda joint, into_matmuls=False: None)

    feats = 8
    g = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, feats, generator=g)
    params = [(torch.randn(feats, heads * width, generator=g) / 3).requires_grad_(),
              torch.randn(heads, width, generator=g).requires_grad_(),
              torch.randn(heads, width, generator=g).requires_grad_()]
    src, dst = torch.randint(0, nodes, (edges,), generator=g), torch.randint(0, nodes, (edges,), generator=g)
    planned = {kind: plan for kind, plan, _ in plans(_attention_layer, x, *params, src, dst)}
    over_edges = {kind: [k for kd, k in plan.steps if kd == "kernel" and k.shape == (edges, heads, width)]
                  for kind, plan in planned.items()}
    (forward,), (backward,) = over_edges["forward"], over_edges["backward"]
    assert sorted(r.meta.get("atomic_into") is None for r in forward.roots) == ([False, True] if saved else [False])
    assert backward.dims == (2,) and sum(r.meta.get("atomic_into") is not None for r in backward.roots) == 1
    torch._dynamo.reset()
    out = compiled(_attention_layer)(x, *params, src, dst)
    grads = torch.autograd.grad(out.square().sum(), params)
    ref = [p.detach().double().requires_grad_() for p in params]
    expected = _attention_layer(x.double(), *ref, src, dst)
    expected_grads = torch.autograd.grad(expected.square().sum(), ref)
    torch.testing.assert_close(out, expected.float())
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want.float())


@pytest.mark.parametrize("capability, half", [((9, 0), True), ((8, 0), False)])
def test_half_sums_add_in_their_own_type_where_eager_does_on_a_gpu_with_native_atomics(monkeypatch, capability, half):
    """scatter_add / scatter_reduce sums on a GPU add in the half type, as eager's atomics do (bf16 natively from
    sm_90); index_put(accumulate) and max/min accumulate in float32; Triton's interpreter (CPU) has none."""
    from brrr.compile.lowering.scatter import accumulator
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    bf16, fp16 = torch.bfloat16, torch.float16
    assert accumulator(bf16, torch.device("cuda", 0), as_eager_sums=True) == (bf16 if half else torch.float32)
    assert accumulator(fp16, torch.device("cuda", 0), as_eager_sums=True) == fp16
    assert accumulator(bf16, torch.device("cuda", 0), as_eager_sums=False) == torch.float32
    assert accumulator(bf16, torch.device("cpu"), as_eager_sums=True) == torch.float32
