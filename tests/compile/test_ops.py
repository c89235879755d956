"""Op-by-op sweep against eager, driven by torch's OpInfo samples: each lowered op family, a few samples each,
float32 / float16 / bfloat16, plus a non-contiguous variant of each sample (the samples include broadcast and
zero-size inputs). Everything runs through brrr's kernels in the Triton interpreter (BRRR_DEBUG=1: no silent
ATen fallback for ops brrr lowers)."""

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from tests.compile.helpers import compiled

OPS = [
    # pointwise
    "abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan",
    "tanh", "sigmoid", "erf", "nn.functional.relu", "reciprocal", "floor", "ceil", "round", "trunc", "sign",
    "nn.functional.silu", "nn.functional.gelu", "sinh", "cosh", "frac", "square", "isnan", "logical_not",
    "add", "sub", "mul", "div", "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
    "remainder", "fmod", "where", "clamp", "masked_fill", "lerp", "nn.functional.hardtanh", "rsub",
    # reductions and composites
    "atan", "asin", "acos", "atan2",
    "sum", "mean", "amax", "amin", "var", "var_mean", "std", "prod", "argmax", "argmin", "any", "all",
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.rms_norm", "logsumexp",
    # views and data movement
    "view", "reshape", "permute", "transpose", "expand", "narrow", "squeeze", "unsqueeze", "select", "t",
    "nn.functional.embedding", "gather", "index_select", "cat", "nn.functional.pad", "split", "unbind",
    "zeros_like", "ones_like", "full_like", "clone", "contiguous", "flip", "roll", "scatter", "tril",
    "nn.functional.cross_entropy", "nn.functional.one_hot", "cumsum",
]
SAMPLES = {torch.float32: 3, torch.float16: 2, torch.bfloat16: 2}
TOL = {torch.float32: dict(rtol=1.3e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}
BY_NAME = {}
for _op in op_db:
    if _op.name in OPS and not _op.variant_test_name and _op.name not in BY_NAME:
        BY_NAME[_op.name] = _op
    elif _op.name == "nn.functional.pad" and _op.variant_test_name == "constant":
        BY_NAME[_op.name] = _op


def _cases(op, dtype):
    samples = []
    for s in op.sample_inputs("cpu", dtype, requires_grad=False):
        samples.append(s)
        if len(samples) >= SAMPLES[dtype]:
            break
    out = []
    for s in samples:
        out.append(s)
        nc = s.noncontiguous()
        out.append(nc)
    return out


def _compare(out, ref, dtype):
    if isinstance(ref, torch.Tensor):
        if ref.dtype.is_floating_point:
            torch.testing.assert_close(out, ref, equal_nan=True, check_stride=False, **TOL[dtype])
        else:
            torch.testing.assert_close(out, ref, check_stride=False)
    elif isinstance(ref, (tuple, list)):
        for o, r in zip(out, ref):
            _compare(o, r, dtype)


@pytest.mark.parametrize("dtype", list(SAMPLES), ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name", [n for n in OPS])
def test_op_matches_eager(name, dtype):
    op = BY_NAME.get(name)
    if op is None:
        pytest.skip(f"{name} not in this torch's op_db")
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip(f"{name} has no {dtype} on CPU")
    for sample in _cases(op, dtype):
        torch._dynamo.reset()
        args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)

        def fn(*a):
            return op(*a, **kwargs)
        ref = fn(*args)
        out = compiled(fn)(*args)
        _compare(out, ref, dtype)


def test_masks_from_a_constant_index_are_blocks():
    # a circular pad reads one wrapped column at a constant index; comparisons of it built masks that were
    # Python bools, and `block & True` is no int1 mask in the interpreter (bool pads, 1-d pooling backward)
    x = torch.randn(3, 3, 3) > 0
    pad = lambda x: torch.nn.functional.pad(x, (1, 2), mode="circular")   # noqa: E731
    assert torch.equal(compiled(pad)(x), pad(x))
    torch._dynamo.reset()
    x = torch.randn(2, 3, 8, requires_grad=True)
    pool = lambda x: torch.nn.functional.avg_pool1d(x, 3, 2).sum()   # noqa: E731
    g, = torch.autograd.grad(compiled(pool)(x), x)
    torch.testing.assert_close(g, torch.autograd.grad(pool(x), x)[0])


def test_zero_size_intermediate_read_by_two_iteration_spaces():
    # the scheduler's store-or-recompute check builds the node's value at a flat index: a 0 between sizes > 1
    # made that a modulo by zero (svd's backward); a shape with a 0 has no elements to index
    x = torch.randn(3, 0, 2)

    def f(x):
        y = x.exp()
        return y * 2, y.sum(-1)
    for out, ref in zip(compiled(f)(x), f(x)):
        assert out.shape == ref.shape


def test_index_tensors_broadcast_against_each_other():
    """x[b, s] with index tensors of different shapes broadcasts them (NumPy's advanced indexing), lowered
    as one gather rather than run as ATen: the [B, 1, 1, 1] batch index beside a [1, 1, S, 1] position index
    that Hugging Face's mask functions build, negative indices and a trailing dim kept."""
    from brrr.compile.explain import explain
    x = torch.randn(3, 10, 4)
    b = torch.arange(3).view(3, 1, 1, 1)
    s = torch.tensor([0, -1, 5, 9, 2]).view(1, 1, 5, 1)
    t = torch.tensor([1, 3, 0, 7]).view(1, 1, 1, 4)
    for fn in (lambda x: x[b, s] * 2, lambda x: x[b, t] + 1, lambda x: x[b.view(3, 1), s.view(5)]):
        torch._dynamo.reset()
        assert torch.equal(compiled(fn)(x), fn(x))
        ex = explain(fn, x)
        assert not [f for f in ex.fallbacks if "index" in str(f)], ex.fallbacks


@pytest.mark.parametrize("name", ["adjacent", "middle", "separated", "bilinear", "nearest"])
def test_index_tensors_after_whole_dims_are_one_gather(name):
    """Index tensors behind whole dims (None): adjacent ones put their broadcast dims where they stand (bilinear
    upsampling's x[:, :, rows, cols]), separated ones put them first, as NumPy does; no ATen fallback."""
    import torch.nn.functional as F

    from brrr.compile.explain import explain
    rows, cols = torch.tensor([0, 2, 4, 1, -1]), torch.tensor([5, 0, 3])
    fn = {"adjacent": lambda x: x[:, :, rows[:, None], cols[None, :]] * 2,
          "middle": lambda x: x[:, cols % 3] + 1,
          "separated": lambda x: x[rows[:2] % 2, :, rows[:2]] - 1,
          "bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
          "nearest": lambda x: F.interpolate(x, size=(9, 11), mode="nearest")}[name]
    x = torch.randn(2, 3, 5, 6)
    torch._dynamo.reset()
    out, ref = compiled(fn)(x), fn(x)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref)
    ex = explain(fn, x)
    assert not [f for f in ex.fallbacks if "index" in str(f)], ex.fallbacks


def test_index_put_of_a_few_positions_runs_in_brrrs_kernels():
    """A static KV cache's write (`index_copy_` along the sequence dim, index_put without accumulate in the
    graph): one pointwise kernel, negative and repeated positions as eager's sequential write, broadcast
    values; more positions than MAX_PUT_POSITIONS still run as ATen."""
    from brrr.compile.explain import explain
    from brrr.compile.lowering.views import MAX_PUT_POSITIONS
    cache = torch.randn(2, 3, 10, 4)
    new = torch.randn(2, 3, 2, 4)

    def write(cache, pos, new):
        return cache.index_copy(2, pos, new) * 1

    def put(cache, pos, v):
        return torch.ops.aten.index_put(cache, [None, None, pos], v)

    cases = [(write, torch.tensor([7, 8]), new), (put, torch.tensor([-1, 3]), new),
             (put, torch.tensor([4, 4]), torch.randn(2, 3, 2, 4)), (put, torch.tensor([0]), torch.randn(4)),
             (put, torch.tensor([1, 2, 5]), torch.tensor(2.5))]
    for fn, pos, v in cases:
        torch._dynamo.reset()
        assert torch.equal(compiled(fn)(cache, pos, v), fn(cache, pos, v)), (fn.__name__, pos)
        ex = explain(fn, cache, pos, v)
        assert not [f for f in ex.fallbacks if "index_put" in str(f)], ex.fallbacks
    many = torch.arange(MAX_PUT_POSITIONS + 1) % 10
    ex = explain(put, cache, many, torch.tensor(1.0))
    assert [f for f in ex.fallbacks if "index_put" in str(f)]
    torch._dynamo.reset()
    assert torch.equal(compiled(put)(cache, many, torch.tensor(1.0)), put(cache, many, torch.tensor(1.0)))


def test_cumsum_is_one_fused_kernel_over_short_dims_and_aten_over_long_ones():
    """Language models' position ids (`mask.cumsum(-1) - 1`): the triangle reduction fuses with its producer and
    consumer into one kernel, exact for integers; a dim longer than MAX_SCAN, or more than MAX_SCAN_WORK reads
    in all, keeps ATen's linear scan."""
    from brrr.compile.explain import explain
    from brrr.compile.lowering.reductions import MAX_SCAN, MAX_SCAN_WORK
    mask = torch.rand(3, 70) > 0.3

    def position_ids(mask):
        return (mask.long().cumsum(-1) - 1).masked_fill(~mask, 1)
    assert torch.equal(compiled(position_ids)(mask), position_ids(mask))
    ex = explain(position_ids, mask)
    assert not ex.fallbacks and len(ex.kernels) == 1, (ex.fallbacks, len(ex.kernels))
    x = torch.randn(2, 5, 9).transpose(1, 2)        # non-contiguous, along a middle dim
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(lambda x: x.cumsum(1))(x), x.cumsum(1), rtol=1e-5, atol=1e-5)
    for long in (torch.randint(0, 3, (2, MAX_SCAN + 1)), torch.randint(0, 3, (MAX_SCAN_WORK // 512 + 1, 512))):
        ex = explain(lambda x: x.cumsum(1), long)
        assert [f.op for f in ex.fallbacks] == ["aten.cumsum.default"]
    torch._dynamo.reset()
    assert torch.equal(compiled(lambda x: x.cumsum(1))(long), long.cumsum(1))
