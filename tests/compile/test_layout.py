"""Memory order: kernels walk their space in the order of what they store (brrr.compile.scheduling.layout), and give
eager's values, strides and dtypes on channels_last, transposed, sliced and expanded inputs."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

from brrr.compile.backend import make_backend
from brrr.compile.ir import nodes as ir
from brrr.compile.ir.indexing import Ix, linear
from brrr.compile.lowering.core import SPLIT_MAX_X
from tests.compile.helpers import compiled, rel_err, to64


def plans(fn, *inputs):
    """[(graph kind, Plan, {Kernel: KernelSource})] brrr makes of `fn(*inputs)` (planned, nothing run)."""
    sink = PlanSink()
    torch.compile(fn, backend=make_backend(_sink=sink), dynamic=False)(*inputs)
    return sink.plans


class PlanSink:
    """Keeps what the backend planned; a graph it fell back on fails the test that expected kernels."""

    def __init__(self):
        self.plans = []

    def planned(self, kind, gm, plan, kernels):
        self.plans.append((kind, plan, kernels))

    def fell_back(self, scope, reason):
        raise AssertionError(f"brrr fell back ({scope}): {reason}")


def kernels_of(fn, *inputs):
    return [k for _, plan, _ in plans(fn, *inputs) for kind, k in plan.steps if kind == "kernel"]


def store_index(kernel, node):
    """The index a kernel stores `node` at, as an Ix of xindex / rindex."""
    idx = kernel.row_index(node.shape) if kernel.is_row(node) else kernel.full_index()
    return linear(idx, node.stride)


def channels_last(*shape):
    return torch.randn(*shape).to(memory_format=torch.channels_last)


INPUTS = {
    "channels_last": lambda: channels_last(2, 8, 5, 3),
    "transposed": lambda: torch.randn(3, 5, 8, 2).permute(3, 2, 1, 0),
    "sliced": lambda: torch.randn(4, 10, 5, 7)[::2, 1:9, :, 2:5],
    "expanded": lambda: torch.randn(2, 8, 1, 3).expand(2, 8, 5, 3),
}


def assert_like_eager(out, ref, tol=1e-5):
    """values (eager rounds half types after every op, brrr once on store: `tol`), strides, dtypes"""
    outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype and o.shape == r.shape
        assert o.stride() == r.stride(), (o.stride(), r.stride())
        torch.testing.assert_close(o, r, rtol=tol, atol=tol)


@pytest.mark.parametrize("make", list(INPUTS), ids=list(INPUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_pointwise_keeps_values_strides_and_dtypes(make, dtype):
    x = INPUTS[make]().to(dtype)
    y = channels_last(2, 8, 5, 3).to(dtype)
    w = torch.randn(8, 1, 1)

    def f(x, y):
        return torch.relu(x * w + y), (x + 1).to(torch.float16)
    assert_like_eager(compiled(f)(x, y), f(x, y), 1e-5 if dtype == torch.float32 else 1.6e-2)


@pytest.mark.parametrize("make", list(INPUTS), ids=list(INPUTS))
def test_reductions_keep_values_strides_and_dtypes(make):
    x = INPUTS[make]()

    def f(x):
        return x.sum((0, 2, 3)), x.amax(1, keepdim=True), x.mean((2, 3), keepdim=True), torch.softmax(x, 1)
    assert_like_eager(compiled(f)(x), f(x))


@pytest.mark.parametrize("make", list(INPUTS), ids=list(INPUTS))
def test_transposes_keep_values_strides_and_dtypes(make):
    x = INPUTS[make]()

    def f(x):
        return (x.permute(0, 2, 3, 1).contiguous(), x.contiguous(), x.contiguous(memory_format=torch.channels_last),
                x.transpose(1, 3) * 2)
    assert_like_eager(compiled(f)(x), f(x))


def test_channels_last_kernel_stores_at_the_plain_flat_index():
    x, w = channels_last(2, 8, 5, 3), torch.randn(8, 1, 1)
    (kernel,) = kernels_of(lambda x: torch.relu(x * w + 1), x)
    (out,) = kernel.roots
    assert out.stride == x.stride()                       # eager's layout
    assert store_index(kernel, out) == Ix.var("xindex", x.numel())
    assert kernel.order == (1, 3, 2, 0)                   # C, W, H, N: innermost first


def test_transposed_output_walks_its_own_order():
    x = torch.randn(6, 10)
    (kernel,) = kernels_of(lambda x: x.t() * 2, x)        # eager's result has x's layout, seen transposed
    (out,) = kernel.roots
    assert kernel.order == (0, 1)
    assert store_index(kernel, out) == Ix.var("xindex", x.numel())


def test_buffers_only_kernels_read_are_dense_in_their_writers_order():
    x = torch.randn(5, 4, 3).permute(2, 1, 0)            # [3, 4, 5], dim 0 innermost

    def f(x):
        m = x.sum(2)                                      # read by the next kernel only
        return m.unsqueeze(2) * torch.ones(3, 4, 7)
    first, _ = kernels_of(f, x)
    (m,) = first.roots
    assert x.sum(2).stride() == (4, 1) and m.stride == (1, 3)   # not eager's: the layout its kernel writes
    assert store_index(first, m) == Ix.var("xindex", 12)
    torch.testing.assert_close(compiled(f)(x), f(x))


@pytest.mark.parametrize("case", ["transpose", "to_channels_last", "from_channels_last"])
def test_layout_changes_load_and_store_through_a_tile(case):
    x, f = {"transpose": (torch.randn(48, 40), lambda x: x.t().contiguous()),
            "to_channels_last": (torch.randn(2, 8, 5, 6), lambda x: x.contiguous(memory_format=torch.channels_last)),
            "from_channels_last": (channels_last(2, 8, 5, 6), lambda x: x.contiguous())}[case]
    (kernel,) = kernels_of(f, x)
    (out,) = kernel.roots
    xn, yn = kernel.tile_numels()
    assert kernel.tile and xn > 1 and yn > 1
    xs, ys = Ix.var("xindex", xn), Ix.var("yindex", yn)
    assert store_index(kernel, out) == xs + ys * xn                       # stores contiguous along x
    (load,) = [v for v in ir.walk(out.fn(kernel.full_index())) if isinstance(v, ir.Load)]
    # loads contiguous along y: neighbouring yindex, neighbouring addresses (up to a wrap: yindex % (H * W))
    assert any(t.base == "yindex" and t.div == 1 and t.coeff == 1 for t in load.index.terms)
    assert_like_eager(compiled(f)(x), f(x))


def test_an_input_against_the_walk_tiles_beside_a_larger_one_along_it():
    # a ReLU backward in NCHW over a gradient, its mask recomputed from a channels_last input (a stem converted
    # inside the graph, its output kept NCHW): the channels_last load must coalesce too, through a tile
    g, x, m = torch.randn(2, 8, 5, 6), channels_last(2, 8, 5, 6), torch.randn(8)
    f = lambda g, x, m: torch.where(x - m[:, None, None] <= 0, 0, g).contiguous()   # noqa: E731
    (kernel,) = kernels_of(f, g, x, m)
    assert kernel.order == (3, 2, 1, 0) and kernel.tile
    loads = {tuple(v.buf.stride): v.index for v in ir.walk(kernel.roots[0].fn(kernel.full_index()))
             if isinstance(v, ir.Load)}
    xs, ys = Ix.var("xindex", 30), Ix.var("yindex", 16)
    assert loads[g.stride()] == xs + ys * 30                      # the gradient along x
    assert loads[x.stride()] == xs * 8 + ys % 8 + (ys // 8) * 240   # the channels_last input along y
    assert_like_eager(compiled(f)(g, x, m), f(g, x, m))


# ------------------------------------------------------------------------------------------- reductions

@pytest.mark.parametrize("memory_format, column", [(torch.contiguous_format, False), (torch.channels_last, True)],
                         ids=["contiguous", "channels_last"])
def test_row_or_column_reduction_follows_memory_order(memory_format, column):
    x = torch.randn(2, 8, 6, 5).to(memory_format=memory_format)
    (kernel,) = kernels_of(lambda x: x.sum((0, 2, 3)), x)
    assert kernel.dims == (0, 2, 3) and kernel.is_column() == column
    # at batch-norm size: channels_last columns split into [chunk, rows, channels] partials and a final
    # column kernel; contiguous rows split into partials and a final row kernel up to SPLIT_MAX_X rows (64
    # channels stay few programs otherwise), and more rows stay one row kernel
    for channels in (64, 512):
        big = torch.empty(64, channels, 56, 56, device="meta").to(memory_format=memory_format)
        ks = kernels_of(lambda x: x.sum((0, 2, 3)), big)
        if column:
            partial, final = ks
            assert partial.is_column() and partial.shape[-1] == channels and final.is_column()
        elif channels <= SPLIT_MAX_X:
            partial, final = ks
            assert partial.shape[0] == channels and not partial.is_column() and final.shape[0] == channels
        else:
            (kernel,) = ks
            assert kernel.shape == (64, channels, 56, 56) and not kernel.is_column()


def test_kernel_reading_a_stored_reduction_walks_its_memory_order():
    # an average pool over a max pool's output reads a reduction an earlier kernel stored; the order must come
    # from that read too, or the pool walks NCHW over channels_last memory
    x = torch.randn(2, 16, 9, 9).to(memory_format=torch.channels_last)
    f = lambda x: F.avg_pool2d(F.max_pool2d(x, 3, 2, 1), 3, 1, 1)   # noqa: E731
    pools = [k for k in kernels_of(f, x) if k.dims]
    assert len(pools) == 2 and all(k.is_column() for k in pools)


@pytest.mark.parametrize("cols", [1000, 65536])
def test_layer_norm_is_a_row_reduction_at_any_width(cols):
    # its one-pass variance also loads x[:, 0] (the shift), broadcast along the row; the order must come from
    # the load of all of x, or the rows walk innermost and every lane reads a different row
    x, w = torch.empty(2048, cols, dtype=torch.bfloat16, device="meta"), torch.empty(cols, device="meta")
    (kernel,) = kernels_of(lambda x: torch.nn.functional.layer_norm(x, (cols,), w.bfloat16(), w.bfloat16()), x)
    assert kernel.dims == (1,) and not kernel.is_column() and kernel.loop_order()[0] == 1


def test_batch_norm_statistics_read_channels_last_input_once():
    x = torch.empty(64, 256, 56, 56, dtype=torch.bfloat16, device="meta").to(memory_format=torch.channels_last)
    mean, var = torch.empty(256, device="meta"), torch.empty(256, device="meta")
    ks = kernels_of(lambda x: torch.nn.functional.batch_norm(x, mean, var, training=True), x)
    reads_x = [k for k in ks if k.dims and k.shape[-1] == 256 and len(k.shape) == 3]
    assert len(reads_x) == 1 and reads_x[0].is_column()   # sum and sum of squares in one pass over x
    assert len(reads_x[0].roots) >= 2


def test_an_unflattened_sum_of_bases_merges_back():
    # a split column reduction numbers its rows q = p * 784 + r (p from xindex, r from rindex); unflattened
    # over (64, 56, 56) and read at contiguous strides it is q * 256 again, with no division by 56 left
    from brrr.compile.ir.indexing import unflatten
    q = Ix.var("rindex", 784) + (Ix.var("xindex", 65536) // 256) * 784
    address = linear(unflatten(q, (64, 56, 56)), (802816, 14336, 256)).render()
    assert not re.search(r"[/%] 56\b", address), address
    for r, x in [(0, 0), (783, 65535), (57, 300), (500, 40000)]:
        assert eval(address, {"rindex": r, "xindex": x}) == (r + x // 256 * 784) * 256


def test_split_batch_norm_statistics_load_at_an_affine_index():
    x = torch.empty(64, 256, 56, 56, dtype=torch.bfloat16, device="meta").to(memory_format=torch.channels_last)
    (_, _, kernels), = plans(lambda x: torch.var_mean(x, (0, 2, 3), correction=0), x)
    partial = next(ks for k, ks in kernels.items() if len(k.shape) == 3)
    loads = [line for line in partial.source.splitlines() if "tl.load(in_ptr0 + (" in line and "rindex" in line]
    assert loads and not any(re.search(r"[/%] 56\b", line) for line in loads), loads


def _partial_kernel_of_statistics(x):
    (_, _, kernels), = plans(lambda x: torch.var_mean(x, (0, 2, 3), correction=0), x)
    return next(ks for k, ks in kernels.items() if len(k.shape) == 3)


def test_split_statistics_keep_two_accumulators_and_load_the_shift_once():
    # var_mean decomposes into a variance and a separate sum of x; the sum comes from the variance's one-pass
    # moments (n * K + sum(x - K)), so the kernel that reads the 103 MB keeps two accumulators, not three, and
    # the shift K (x at the row's first element) is loaded before the loop, not once per iteration
    x = torch.empty(64, 256, 56, 56, dtype=torch.bfloat16, device="meta").to(memory_format=torch.channels_last)
    lines = _partial_kernel_of_statistics(x).source.splitlines()
    loop = next(i for i, line in enumerate(lines) if line.strip().startswith("for roffset"))
    accumulators = [line for line in lines if re.match(r"\s+acc\d+ = tl.full", line)]
    assert len(accumulators) == 2, accumulators
    loads = [(i, line) for i, line in enumerate(lines) if "tl.load(" in line]
    assert [i < loop for i, line in loads if "rindex" not in line] == [True]   # the shift, hoisted
    assert all(i > loop for i, line in loads if "rindex" in line)
    # 200704 rows split into 256 chunks of 784: the chunks tile the rows exactly, so no chunk-end mask
    assert not any("< 200704" in line for line in lines)


def test_column_splits_take_chunks_that_tile_the_rows_exactly():
    from brrr.compile.lowering.core import column_chunks
    assert column_chunks(8192, 3072) == 16            # ~22 would fill the GPU; 16 chunks of 512 tile 8192 rows
    assert column_chunks(200704, 256) == 256          # BN statistics: 256 chunks of 784 rows are already exact
    assert column_chunks(8192, 3072, exact=False) == 22   # symbolic rows: the count alone, chunks masked
    assert column_chunks(1031 * 8, 3072) == 22        # no count near 22 divides 8248 into steps of 8 rows
    # few columns: exact chunks may be shorter (64 of 128 rows: 768 [64, 32] programs), masked ones may not
    assert column_chunks(8192, 768) == 64 and column_chunks(12608, 768) == 49


def test_a_bias_gradients_column_split_loads_without_masks():
    # a chunk that may run past the rows' end masks every load, and ptxas then keeps one load in flight
    g = torch.empty(8192, 3072, dtype=torch.bfloat16, device="meta")
    (_, _, kernels), = plans(lambda g: g.sum(0), g)
    (k, partial), = [(k, ks) for k, ks in kernels.items() if len(k.shape) == 3]
    chunks, rows, cols = k.shape
    assert chunks * rows == 8192 and cols == 3072 and rows % partial.meta["RBLOCK"] == 0
    loads = [line for line in partial.source.splitlines() if "tl.load(" in line]
    assert loads and not any("mask" in line or "other=" in line for line in loads), loads
    assert "< 8192" not in partial.source


def test_a_column_split_whose_last_chunk_ends_early_walks_whole_steps_unmasked():
    # 12608 rows (64 x 197 tokens) have no exact tiling near the target, so the last chunk ends early: each
    # program walks its own chunk's whole steps with unmasked loads, then at most one masked step
    g = torch.empty(12608, 768, dtype=torch.bfloat16, device="meta")
    (_, _, kernels), = plans(lambda g: g.sum(0), g)
    (k, partial), = [(k, ks) for k, ks in kernels.items() if len(k.shape) == 3]
    assert k.shape[0] * k.shape[1] > 12608
    lines = partial.source.splitlines()
    main = next(i for i, line in enumerate(lines) if "range(0, rfull, RBLOCK)" in line)
    tail = next(i for i, line in enumerate(lines) if "range(rfull, chunk_rows, RBLOCK)" in line)
    main_loads = [line for line in lines[main:tail] if "tl.load(" in line]
    tail_loads = [line for line in lines[tail:] if "tl.load(" in line]
    assert main_loads and not any("mask" in line or "other=" in line or "where" in line for line in main_loads)
    assert tail_loads and all("< 12608" in "\n".join(lines[tail:]) and "other=" in line for line in tail_loads)


@pytest.mark.parametrize("rows, cols, exact, whole_steps", [(256, 600, True, False), (261, 600, False, False),
                                                           (261, 608, False, True)],
                         ids=["exact-chunks", "masked-chunks", "whole-steps-then-a-masked-one"])
def test_split_column_sums_match_eager(small_column_splits, rows, cols, exact, whole_steps):
    g = torch.empty(rows, cols, dtype=torch.float64, device="meta")
    (_, _, kernels), = plans(lambda g: g.sum(0), g)
    (k, partial), = [(k, ks) for k, ks in kernels.items() if len(k.shape) == 3]
    # the kind of chunk the id names: chunks that tile the rows, or a masked last one walked in whole steps or not
    assert k.shape[0] * k.shape[1] == rows if exact else k.shape[0] * k.shape[1] > rows
    assert ("range(0, rfull, RBLOCK)" in partial.source) == whole_steps
    torch.manual_seed(0)
    x = torch.randn(rows, cols, dtype=torch.float64)
    for f in (lambda x: x.sum(0), lambda x: x.var(0), lambda x: (x * x[:, :1]).amax(0)):
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(f)(x), f(x), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_training_with_shared_moments_matches_eager(dtype):
    # far from 0, so the shift matters; the mean comes from the shifted sum (n * K + s)
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(24).to(dtype)
    x = (torch.randn(4, 24, 40, 40) * 3 + 500).to(dtype).to(memory_format=torch.channels_last)
    ref_bn = to64(bn)
    out = compiled(lambda t: bn(t))(x)
    ref = ref_bn(x.double())
    assert rel_err(out, ref) < (2e-5 if dtype == torch.float32 else 2e-2)
    assert rel_err(bn.running_mean, ref_bn.running_mean) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert rel_err(bn.running_var, ref_bn.running_var) < (1e-4 if dtype == torch.float32 else 2e-2)


def test_a_sum_beside_another_variance_is_not_shared():
    # a sum over other dims than the variance's reduces on its own, and both match eager
    x = (torch.randn(4, 24, 40, 40) + 7).to(memory_format=torch.channels_last)
    f = lambda x: (torch.var(x, (0, 2, 3)), x.sum((0, 1)), x.mean((0, 2, 3)))   # noqa: E731
    assert_like_eager(compiled(f)(x), f(x), tol=2e-5)


@pytest.mark.parametrize("shape, dims", [((8, 16, 16, 16), (0, 2, 3)), ((4, 64, 64, 64), (0, 2, 3)),
                                         ((2, 40000), (1,))], ids=["column", "column-split", "row-split"])
def test_variance_in_one_pass_matches_eager(shape, dims):
    x = torch.randn(*shape) * 2 + 1000             # far from 0: the shift keeps the squares from cancelling
    if len(shape) == 4:
        x = x.to(memory_format=torch.channels_last)
    f = lambda x: torch.var_mean(x, dims, keepdim=True)   # noqa: E731
    assert_like_eager(compiled(f)(x), f(x), tol=2e-5)


# ------------------------------------------------------------------------------------- mixed layouts

class MixerBlock(torch.nn.Module):
    """MLP-Mixer's block: token mixing runs a layer norm's output through a transpose, so in the backward the
    layer norm's gradient arrives transposed while its input is row-major."""

    def __init__(self, tokens, dim, hidden):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.tokens = torch.nn.Sequential(torch.nn.Linear(tokens, hidden), torch.nn.GELU(),
                                          torch.nn.Linear(hidden, tokens))
        self.channels = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.GELU(),
                                            torch.nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


def _mixer_reduction_kernels():
    block = MixerBlock(196, 768, 384).to(torch.bfloat16).to("meta")
    x = torch.empty(64, 196, 768, dtype=torch.bfloat16, device="meta", requires_grad=True)
    found = plans(lambda x: block(x).sum(), x)
    backward = next(p for kind, p, _ in found if kind == "backward")
    sources = {k: ks for kind, _, kernels in found if kind == "backward" for k, ks in kernels.items()}
    return backward, [(k, sources[k]) for kind, k in backward.steps if kind == "kernel" and k.dims]


def _addresses(source, call):
    """The address expressions (`ptr + (<this>)`) of each `call` (tl.load / tl.store) in a kernel's source."""
    out = []
    for line in source.splitlines():
        at = line.find(call + "(")
        if at < 0:
            continue
        start = line.index("+ (", at) + 3
        depth, end = 1, start
        while depth:
            depth += {"(": 1, ")": -1}.get(line[end], 0)
            end += 1
        out.append(line[start:end - 1])
    return out


def _step(index, var):
    """How far an address moves when `var` (rindex or xindex) moves by one, from 0."""
    at = {"rindex": 0, "xindex": 0}
    base = eval(index, dict(at))
    at[var] = 1
    return eval(index, at) - base


def _strides_along(source, var):
    """Per load that reads along both rindex and xindex: its step along `var` (1 = contiguous)."""
    return [_step(ix, var) for ix in _addresses(source, "tl.load") if "rindex" in ix and "xindex" in ix]


def test_reductions_over_mixed_layouts_read_both_coalesced():
    # the layer norm's backward over [64, 196, 768] reads its row-major input along the rows and its
    # transposed gradient across them: every kernel reading both walks tiles of >= 16 along the kept side (16
    # bf16 elements fill a 32-byte sector) and >= 32 along the reduced one
    plan, kernels = _mixer_reduction_kernels()
    mixed = [(k, ks) for k, ks in kernels if 1 in _strides_along(ks.source, "rindex")
             and 1 in _strides_along(ks.source, "xindex")]
    assert mixed, [ks.name for _, ks in kernels]
    for k, ks in mixed:
        assert ks.meta["XBLOCK"] >= 16 and ks.meta["RBLOCK"] >= 32, (ks.name, ks.meta)


def test_a_full_size_output_walking_another_dim_keeps_its_own_kernel():
    # the layer norm's input gradient (stored row-major) is not computed inside the bias gradient's reduction,
    # whose lanes walk the transposed gradient's token dim
    plan, kernels = _mixer_reduction_kernels()
    assert any("walks dim" in str(why) for _, why in plan.refusals), plan.refusals
    for k, ks in kernels:
        for index in _addresses(ks.source, "tl.store"):
            if "rindex" in index:
                assert _step(index, "rindex") == 1 or ks.meta["XBLOCK"] >= 16, (ks.name, index)


@pytest.mark.parametrize("small_thresholds", [False, True], ids=["as-is", "tiles-and-splits"])
def test_mixer_block_training_matches_eager(monkeypatch, small_thresholds):
    # small sizes; with the thresholds lowered, the across tiles and the split of mixed-layout columns run
    from brrr.compile.codegen import triton as codegen
    from brrr.compile.lowering import core as lower
    if small_thresholds:
        monkeypatch.setattr(codegen, "ACROSS_MIN_X", 32)
        monkeypatch.setattr(lower, "SPLIT_ACROSS_MAX_X", 1 << 20)
        monkeypatch.setattr(lower, "SPLIT_COLUMN_MIN_R", 64)
        monkeypatch.setattr(lower, "SPLIT_COLUMN_MIN_NUMEL", 1024)
    torch.manual_seed(0)
    block = MixerBlock(24, 96, 48)
    x = torch.randn(4, 24, 96, requires_grad=True)
    ref_block, ref_x = to64(block), x.detach().double().requires_grad_()
    out = compiled(lambda x: block(x))(x)
    ref = ref_block(ref_x)
    grad = torch.randn_like(ref)
    out.backward(grad.float())
    ref.backward(grad)
    assert rel_err(out, ref) < 1e-5 and rel_err(x.grad, ref_x.grad) < 1e-5
    for p, q in zip(block.parameters(), ref_block.parameters()):
        assert rel_err(p.grad, q.grad) < 1e-5


# ------------------------------------------------------------------------------------------------ names

def test_refusals_name_kernels_by_their_final_names():
    # the layer norm cannot be the GELU kernel's epilogue (a matmul lies between): the refusal names that
    # kernel as profiles and explain do, not by a stand-in made while trying it as a prologue
    import brrr
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16),
                                torch.nn.LayerNorm(16))
    with torch.no_grad():
        ex = brrr.explain(model, torch.randn(8, 16))
    assert ex.refusals
    for _, _, why in ex.refusals:
        assert not re.search(r"\bk\d+\b", why), why

def test_kernels_are_named_after_what_they_fuse():
    import brrr
    bn = torch.nn.BatchNorm2d(8).eval()
    x = channels_last(2, 8, 4, 4)
    with torch.no_grad():
        ex = brrr.explain(lambda x, y: torch.relu(bn(x) + y), x, x)
    # the function a kernel launches is named after its source (naming.function_name); a live kernel of other
    # source elsewhere in the process may hold the name: then a version suffix follows
    (kernel,) = ex.kernels
    assert re.fullmatch(r"inference\.brrr_bn_add_relu_[0-9a-f]{8}(_v\d+)?", kernel.name)
    assert f"def {kernel.kernel_name}(" in kernel.source
    ln = torch.nn.LayerNorm(16)
    ex = brrr.explain(lambda x, y: torch.softmax(ln(x + y), -1) + y.sum(0), torch.randn(4, 16), torch.randn(4, 16))
    names = [k.name.split(".")[1] for k in ex.kernels]
    assert len(set(names)) == len(names) and all(n.isidentifier() for n in names)
    assert names[0].startswith("brrr_layer_norm_") and any("softmax" in n for n in names)
    for _, _, why in ex.refusals:   # refusals name kernels as explain lists them
        assert "inference.brrr_" in why or "kernel" not in why


# ------------------------------------------------------------------------------- what the GPU would run

_COMPILE_FOR_SM90 = """
import importlib.util, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path, name, pointers, meta = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
spec = importlib.util.spec_from_file_location("kernel_under_test", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, name)
kinds = iter(pointers)
sig = {p: "constexpr" if p.endswith("BLOCK") else next(kinds) for p in fn.arg_names}
attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.arg_names) if not p.endswith("BLOCK")}
consts = {(fn.arg_names.index(k),): v for k, v in meta.items() if k.endswith("BLOCK")}
ptx = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                     options={"num_warps": meta["num_warps"]}).asm["ptx"]
print(json.dumps([sorted(set(re.findall(op + r"\\.global(?:\\.[a-z0-9]+)*", ptx))) for op in ("ld", "st")]))
"""


def _ptx_memory_ops(ks, tmp_path):
    """The global load/store instructions of KernelSource `ks` compiled for sm_90 (no GPU needed: Triton's
    NVIDIA backend and ptxas), with 16-byte aligned pointers as the runtime's allocations are. In a process
    of its own: the interpreter these tests run under replaces parts of triton.language."""
    import json
    import os
    import subprocess
    import sys
    path = tmp_path / f"{ks.function}.py"
    path.write_text(ks.source)
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int64: "i64"}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90, str(path), ks.function,
                           json.dumps(["*" + names[a.dtype] for a in ks.args]), json.dumps(ks.meta)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loads, stores = json.loads(done.stdout.strip().splitlines()[-1])
    return set(loads), set(stores)


def test_layout_kernels_vectorize_on_the_gpu(tmp_path):
    pytest.importorskip("triton.backends.nvidia.compiler")
    x = torch.empty(8, 64, 16, 16, dtype=torch.bfloat16, device="meta").to(memory_format=torch.channels_last)
    c = torch.empty(64, dtype=torch.bfloat16, device="meta")
    cases = [
        (lambda x, m, v: torch.relu(torch.nn.functional.batch_norm(x, m, v, c, c)), (x, c, c), True),
        (lambda x: x.t().contiguous(), (torch.empty(256, 192, dtype=torch.bfloat16, device="meta"),), True),
        # an unsplit column reduction's loads (over 64 columns [8, 64, 16, 16] would split)
        (lambda x: torch.var_mean(x, (0, 2, 3), correction=0),
         (torch.empty(1, 32, 40, 40, dtype=torch.bfloat16, device="meta").to(memory_format=torch.channels_last),),
         False),
    ]
    for fn, inputs, vector_stores in cases:
        (_, _, kernels), = plans(fn, *inputs)
        ks = next(iter(kernels.values())) if len(kernels) == 1 else \
            next(ks for k, ks in kernels.items() if len(k.shape) == 4)
        loads, stores = _ptx_memory_ops(ks, tmp_path)
        assert loads == {"ld.global.v4.b32"}, (ks.name, loads)             # 16-byte loads: 8 bf16 lanes
        assert not vector_stores or stores == {"st.global.v4.b32"}, (ks.name, stores)


def test_group_norm_statistics_walk_each_group_along_memory():
    # 32 groups of [8, 56, 56] per sample: rows of 25088 contiguous elements, one program each (1024); walked
    # with the groups innermost they were 64 programs of [16, 64] tiles over a 51 MB tensor
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16, device="meta")
    w = torch.empty(256, dtype=torch.bfloat16, device="meta")
    stats = [k for k in kernels_of(lambda x: F.group_norm(x, 32, w, w), x) if k.dims]
    assert stats and all(not k.is_column() and k.xnumel() == 1024 for k in stats)


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_nchw_pooling_windows_are_unrolled_and_equal_eager(pool):
    # an NCHW 3x3 window is a row reduction over two dims of 9 elements: one lane per output, the window's
    # positions constant offsets (no [XBLOCK, 16] tile recovering them by div/mod, 7 of 16 lanes empty)
    x = torch.randn(2, 3, 9, 11)
    f = (lambda x: torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])) if pool == "max" else \
        (lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False))
    (kernel,) = [k for k in kernels_of(f, x.to("meta")) if k.dims]
    assert not kernel.is_column()
    source = next(src for _, _, ks in plans(f, x.to("meta")) for k, src in ks.items() if k.dims).source
    assert "rindex" not in source.split("@triton.jit")[-1]
    x[0, 1, 4, 4] = float("nan")
    torch._dynamo.reset()
    out, ref = compiled(f)(x), f(x)
    for o, r in zip(out if pool == "max" else (out,), ref if pool == "max" else (ref,)):
        torch.testing.assert_close(o, r, equal_nan=True)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("args", [([3, 3], [2, 2], [1, 1], [1, 1]), ([2, 3], [1, 2], [1, 0], [2, 1])])
def test_max_pool_indices_pick_eagers_element_among_ties_and_nans(memory_format, args):
    # the window position of the first max (or the last NaN) is reduced, its flat index computed once
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (2, 4, 9, 10), generator=g).float().to(memory_format=memory_format)
    x[0, 1, 3, 3] = x[1, 2, 5, 6] = x[1, 2, 5, 7] = float("nan")
    f = lambda x: torch.ops.aten.max_pool2d_with_indices(x, *args)   # noqa: E731
    torch._dynamo.reset()
    (values, indices), (ref_values, ref_indices) = compiled(f)(x), f(x)
    torch.testing.assert_close(values, ref_values, equal_nan=True)
    assert torch.equal(indices, ref_indices)


def test_a_batch_norm_backward_over_few_channels_splits_its_sums_across_the_gpu():
    # DenseNet121's [32, 128, 14, 14] channels_last: unsplit, its sums walked [16, 64] tiles over 128 channels,
    # 8 programs for 803K elements (69 us against a 2 us roofline); split, the partial sums take ~200 programs
    g, x = (torch.empty(32, 128, 14, 14, dtype=torch.bfloat16, device="meta").to(memory_format=torch.channels_last)
            for _ in range(2))
    w, mean, invstd = (torch.empty(128, device="meta") for _ in range(3))
    (_, _, kernels), = plans(lambda g, x: torch.ops.aten.native_batch_norm_backward(
        g, x, w, None, None, mean, invstd, True, 1e-5, [True, True, True]), g, x)
    full = [k for k in kernels if math.prod(k.shape) >= 32 * 128 * 14 * 14]
    assert full and not any(k.dims and len(k.shape) == 4 for k in full)   # no unsplit reduction over x
    partials = [(k, src) for k, src in kernels.items() if k.dims and len(k.shape) == 3]
    assert partials and all(math.prod(src.grid) >= 132 for _, src in partials)


def test_independent_conversions_in_one_small_kernel_each_get_programs_of_their_own():
    """Five weight-sized copies to channels_last share one kernel's space but no input: each gets the blocks of
    its own (grid 5 x blocks, `member` picking the copy), where one program did all five; copies that share an
    input stay in one member. Values and strides are eager's."""
    from brrr.compile.codegen.spread import SPREAD_BELOW

    def convert(*ws):
        return [w.contiguous(memory_format=torch.channels_last) for w in ws]

    def shared(x, y):   # two outputs of x, one of y: two members
        return x * 2, (x + 1).relu(), y - 1

    ws = [torch.randn(32, 16, 3, 3) for _ in range(5)]
    out = compiled(convert)(*ws)
    for o, r in zip(out, convert(*ws)):
        assert torch.equal(o, r) and o.stride() == r.stride()
    [(_, _, sources)] = plans(convert, *ws)
    [src] = sources.values()
    assert src.source.count("if member == ") == 5 and src.grid[0] % 5 == 0 and src.grid[0] // 5 < SPREAD_BELOW
    x, y = torch.randn(300), torch.randn(300)
    for o, r in zip(compiled(shared)(x, y), shared(x, y)):
        torch.testing.assert_close(o, r)
    [(_, _, sources)] = plans(shared, x, y)
    [src] = sources.values()
    assert src.source.count("if member == ") == 2 and src.grid == (2,)
    big = torch.randn(SPREAD_BELOW * 1024), torch.randn(SPREAD_BELOW * 1024)
    [(_, _, sources)] = plans(shared, *big)
    assert "member" not in next(iter(sources.values())).source   # enough blocks already: one program each
