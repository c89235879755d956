"""Lowerings: scatters that combine into a tensor (part of core.py's tables): scatter_add, scatter_reduce,
index_reduce, index_put(accumulate=True) and scatter of one value at repeated positions.

Each result is an accumulator written by two kernels: an init kernel (self, or the reduction's identity), then a
kernel over the source positions that combines every element into it with an atomic at its computed index
(`atomic_into`, `atomic_index`, `atomic_op` and `atomic_mask` in the node's meta; codegen/triton.py renders
them). Half types accumulate in float32 (sums on a GPU in the half type, as eager's atomics do: `accumulator`)
and small integers in int32, so every dtype has an atomic sum, max and min. A reduction that must leave unreached
elements as they were (include_self=False) or divide by a count (mean) also counts the hits per element with a
second such pair.
Out-of-range indices are masked off in the kernel; an index that is a graph input is checked per call, raising
as eager does. Triton has no atomic product: scatter_reduce(prod) and index_reduce(prod) stay ATen.
"""

import torch

from brrr.compile.ir import nodes as ir
from brrr.compile.ir.indexing import Ix
from brrr.compile.ir.nodes import Const, Op
from brrr.compile.lowering.core import (NotLowered, cast, check_index_input, device_of, indirect, meta, pw,
                                        register, wrap_negative)
from brrr.compile.lowering.views import index_put_few

ATOMIC = {"sum": "add", "mean": "add", "amax": "max", "amin": "min"}
F32 = torch.float32


def accumulator(dtype, device=None, as_eager_sums=False):
    """The dtype a scatter of `dtype` accumulates in (None: no atomic for it). Triton's atomic max and min take no
    half types; int8/int16 sums wrap to the same low bits in int32. Half types accumulate in float32, except a sum
    `as_eager_sums` (scatter_add, scatter_reduce, index_reduce) on a GPU with native atomics for it: eager's CUDA
    kernels add those atomically in the half type itself, and so does brrr, at half the atomic traffic (GAT's
    [550000, 4, 64] bf16 messages: 286 us in float32, 123 in bf16, H200). index_put(accumulate) sums in float32,
    as eager's sorting kernel does; Triton's interpreter has no 16-bit atomics."""
    if dtype in (torch.float16, torch.bfloat16):
        return dtype if as_eager_sums and _native_atomic_add(dtype, device) else F32
    if dtype in (torch.int8, torch.uint8, torch.int16):
        return torch.int32
    if dtype in (F32, torch.float64, torch.int32, torch.int64):
        return dtype
    return None


def _native_atomic_add(dtype, device):
    """Whether `device` adds `dtype` atomically in hardware: fp16 from sm_70, bf16 from sm_90."""
    if device is None or torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= ((9, 0) if dtype == torch.bfloat16 else (7, 0))


def _in_range(v, size):
    return Op("and", [Op("ge", [v, Const(0, v.dtype)], torch.bool), Op("lt", [v, Const(size, v.dtype)], torch.bool)],
              torch.bool)


def _node(L, fx, name, shape, dtype, fn, device):
    node = ir.pointwise(L.fresh(name), tuple(shape), dtype, fn, fx=fx, ops=(fx.target.__name__.split(".")[0],))
    node.meta["fake"] = torch.empty(tuple(shape), dtype=dtype, device="meta")
    node.meta["device"] = device
    return node


def _accumulate(L, fx, shape, dtype, start, positions, value_at, target, op, device, start_reads=True):
    """A buffer of `shape` starting at `start(idx)`, then each position p of `positions` combining `value_at(p)`
    into element target(p) = (index list, in-range condition) with atomic `op`. Returns the buffer's node."""
    acc = _node(L, fx, "scatter", shape, dtype, start, device)
    into = _node(L, fx, "scatter_" + op, positions, dtype, value_at, device)
    into.meta.update(atomic_into=acc, atomic_op=op, atomic_index=lambda idx: target(idx)[0],
                     atomic_mask=lambda idx: target(idx)[1])
    if op in ("max", "min") and dtype.is_floating_point:
        into.meta["nan_wins"] = op
        if start_reads:
            acc.meta["nan_wins"] = op
    acc.meta["scatter"] = into
    L.add(acc)
    return acc


def identity(reduce, dtype):
    if reduce in ("sum", "mean"):
        return Const(0, dtype)
    if dtype.is_floating_point:
        return Const(float("-inf") if reduce == "amax" else float("inf"), dtype)
    info = torch.iinfo(dtype)
    return Const(info.min if reduce == "amax" else info.max, dtype)


def scatter_into(L, fx, x, positions, value_at, target, reduce, include_self, as_eager_sums=True):
    """out = x combined, by `reduce` (sum, mean, amax, amin), with value_at(p) at target(p) for every position p
    of `positions`; include_self=False leaves x out of the reduction where a position reaches. `as_eager_sums`:
    see `accumulator`."""
    out = meta(fx).dtype
    device = device_of(x)
    acc = accumulator(out, device, as_eager_sums and reduce in ("sum", "mean"))
    if reduce not in ATOMIC:
        raise NotLowered(f"{reduce} scatter: Triton has no atomic {reduce}")
    if acc is None:
        raise NotLowered(f"{reduce} scatter into {out}: no atomic for it")
    if len(x.shape) == 0:
        raise NotLowered("scatter into a 0-d tensor")
    if any(s == 0 for s in positions):   # nothing scattered: x itself
        return pw(L, fx, lambda idx: cast(x(idx), out))
    op = ATOMIC[reduce]
    start = (lambda idx: cast(x(idx), acc)) if include_self else (lambda idx: identity(reduce, acc))
    total = _accumulate(L, fx, x.shape, acc, start, positions, lambda idx: cast(value_at(idx), acc), target, op,
                        device, start_reads=include_self)
    count = None
    if reduce == "mean" or not include_self:
        count = _accumulate(L, fx, x.shape, F32, lambda idx: Const(1 if include_self else 0, F32), positions,
                            lambda idx: Const(1, F32), target, "add", device)
    if count is None and acc == out:
        return total

    def fn(idx):
        v = total(idx)
        if reduce == "mean":
            c = count(idx)
            c = cast(Op("where", [Op("gt", [c, Const(0, F32)], torch.bool), c, Const(1, F32)], F32), acc)
            v = Op("div" if acc.is_floating_point else "floordiv", [v, c], acc)
        v = cast(v, out)
        if not include_self:
            hit = Op("gt", [count(idx), Const(0, F32)], torch.bool)
            v = Op("where", [hit, v, cast(x(idx), out)], out)
        return v
    return pw(L, fx, fn)


def _along(x, dim, index, positions_index):
    """target(p): p with dim `dim` replaced by index[positions_index(p)], and whether that is inside x."""
    size = x.shape[dim]

    def target(idx):
        v = cast(index(positions_index(idx)), torch.int64)
        at = list(idx)
        at[dim] = indirect(v)
        return at, _in_range(v, size)
    return target


@register("scatter_add")
def lower_scatter_add(L, fx, x, dim, index, src):
    dim %= max(len(x.shape), 1)
    if x.shape:
        check_index_input(L, index, x.shape[dim], "scatter_add")
    return scatter_into(L, fx, x, tuple(index.shape), lambda idx: src(idx), _along(x, dim, index, lambda idx: idx),
                        "sum", True)


@register("scatter_reduce")
def lower_scatter_reduce(L, fx, x, dim, index, src, reduce, include_self=True):
    dim %= max(len(x.shape), 1)
    if x.shape:
        check_index_input(L, index, x.shape[dim], "scatter_reduce")
    return scatter_into(L, fx, x, tuple(index.shape), lambda idx: src(idx), _along(x, dim, index, lambda idx: idx),
                        reduce, include_self)


@register("index_reduce")
def lower_index_reduce(L, fx, x, dim, index, source, reduce, include_self=True):
    """x along `dim` at index[i] reduced with source's slice i."""
    if not x.shape:   # a 0-dim x takes a 1-D index: nothing here addresses a dim that x lacks
        raise NotLowered("index_reduce into a 0-dim tensor")
    dim %= len(x.shape)
    check_index_input(L, index, x.shape[dim], "index_reduce")
    at = (lambda idx: [idx[dim]]) if index.shape else (lambda idx: [])
    return scatter_into(L, fx, x, tuple(source.shape), lambda idx: source(idx), _along(x, dim, index, at), reduce,
                        include_self)


@register("scatter")
def lower_scatter(L, fx, x, dim, index, src, reduce=None):
    """scatter without reduce: one index per slice (one-hot style: cross-entropy's backward, label smoothing) is
    one pointwise kernel; one value at any positions, repeated or not, is a copy and a kernel of plain stores
    (every writer of an element writes the same value). A tensor at repeated positions keeps ATen."""
    n = len(x.shape)
    dim %= max(n, 1)
    out = meta(fx).dtype
    if reduce is not None:
        raise NotLowered(f"scatter with reduce={reduce!r}")
    if n and index.shape[dim] == 1 and all(index.shape[d] == x.shape[d] for d in range(n) if d != dim):
        def fn(idx):
            at = list(idx)
            at[dim] = Ix()
            hit = Op("eq", [cast(index(at), torch.int64), ir.IndexValue(idx[dim])], torch.bool)
            new = cast(src(at), out) if isinstance(src, ir.Node) else Const(src, out)
            return Op("where", [hit, new, cast(x(idx), out)], out)
        return pw(L, fx, fn)
    if isinstance(src, ir.Node) or not n:
        raise NotLowered("scatter with more than one index per slice")
    check_index_input(L, index, x.shape[dim], "scatter")
    if any(s == 0 for s in index.shape):
        return pw(L, fx, lambda idx: cast(x(idx), out))
    return _accumulate(L, fx, x.shape, out, lambda idx: cast(x(idx), out), tuple(index.shape),
                       lambda idx: Const(src, out), _along(x, dim, index, lambda idx: idx), "store", device_of(x))


@register("index_put")
def lower_index_put(L, fx, x, indices, values, accumulate=False):
    """out = x; out[..., i, ...] += values with one index tensor on one dim (embedding backward, index_add): an
    init kernel, then an atomic-add kernel over values. Without accumulate, a few positions on one dim
    (views.index_put_few)."""
    indices = list(indices)
    if not accumulate:
        return index_put_few(L, fx, x, indices, values)
    dims = [d for d, i in enumerate(indices) if i is not None]
    if len(dims) != 1 or indices[dims[0]].dtype == torch.bool:
        raise NotLowered("index_put accumulate other than with one integer index tensor")
    d = dims[0]
    index = indices[d]
    k = len(index.shape)
    vshape = tuple(x.shape[:d]) + tuple(index.shape) + tuple(x.shape[d + 1:])
    if tuple(values.shape) != vshape if isinstance(values, ir.Node) else True:
        raise NotLowered("index_put with broadcast values")
    check_index_input(L, index, x.shape[d], "index_put", negative_ok=True)
    size = x.shape[d]

    def target(idx):
        v = wrap_negative(cast(index(idx[d:d + k]), torch.int64), size)
        return list(idx[:d]) + [indirect(v)] + list(idx[d + k:]), _in_range(v, size)
    return scatter_into(L, fx, x, vshape, lambda idx: values(idx), target, "sum", True, as_eager_sums=False)
