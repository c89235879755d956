"""Memory order (lower -> **schedule** -> codegen): the order in which a kernel walks its iteration space, and
the strides of the buffers brrr allocates.

A kernel numbers its elements by a flat index that unflattens over its dims innermost first (`Kernel.order`), so
neighbouring lanes touch neighbouring addresses of the tensor that sets the order. A channels_last output
[N, C, H, W] (strides HWC, 1, WC, C) is walked C, W, H, N, and its store index is the plain flat index. The order
comes from what the kernel stores when eager decides that layout, else from its largest input. An input's
strides per dim of the iteration space are read off its load: the value is built at one index variable per
dim, and each variable's coefficient in the load's affine index is that dim's stride, through any permute,
slice or expand between the tensor and the kernel. Orders stay permutations of dims computed from strides, so
sizes may later become symbols.

Strides: a buffer that something outside brrr's kernels sees (a graph output, an ATen call's argument) keeps
eager's strides; one only kernels see is dense in the order of the kernel that writes it (`dense_strides`).
"""

import re

from brrr.compile.ir import nodes as ir
from brrr.compile.ir.indexing import Ix, Opaque, linear
from brrr.compile.ir.sizes import hint, known_true, same, size

_DIM = "@"                      # index variables of the probe: "@0", "@1", ... (never rendered into a kernel)
_DIM_IN = re.compile(r"@(\d+)")


def row_major(ndim):
    return tuple(reversed(range(ndim)))


def order_of(strides, shape):
    """Dims innermost first, by stride. Dims of size 1 or without a known stride (None, or 0: broadcast) go
    outermost; ties keep row-major order (the later dim inner)."""
    def key(d):
        s = strides[d]
        if not s or known_true(shape[d] == 1):
            return (1, 0, -d)
        return (0, abs(hint(s)), -d)   # symbolic strides ordered at their hints: any order computes right
    return tuple(sorted(range(len(shape)), key=key))


def dense_strides(shape, order):
    """Strides of a dense tensor of `shape` laid out in `order` (innermost first)."""
    strides, acc = [0] * len(shape), 1
    for d in order:
        strides[d] = acc
        acc *= max(size(shape[d]), 1)
    return tuple(strides)


def innermost(shape, order):
    """The innermost dim of size > 1, or None."""
    return next((d for d in order if not known_true(shape[d] == 1)), None)


def dim_vars(shape):
    """One index variable per dim (a constant 0 for size-1 dims): evaluate a node at these to probe strides."""
    return [Ix() if known_true(s == 1) else Ix.var(f"{_DIM}{d}", s) for d, s in enumerate(shape)]


def access_strides(index, ndim):
    """Per dim of the probed space, the stride `index` (built at `dim_vars`) moves by along it: an int, 0 when
    the dim is absent (broadcast), None when the dim enters other than affinely (under // or %, a reshape)."""
    strides = [0] * ndim
    for t in index.terms:
        base = t.base
        if isinstance(base, str) and base.startswith(_DIM) and t.div == 1 and t.mod is None:
            d = int(base[1:])
            strides[d] = None if strides[d] is None else strides[d] + t.coeff
        else:
            for d in _dims_in(base):
                strides[d] = None
    return strides


def _dims_in(base):
    """Probe dims named inside a term's base: a rendered sub-expression, or one that holds loaded values."""
    if isinstance(base, str):
        return [int(d) for d in _DIM_IN.findall(base)]
    if isinstance(base, Opaque):
        return [d for t in base.ix.terms for d in _dims_in(t.base)]
    return []   # an index loaded from memory (gather): says nothing about the dims


def input_orders(value, shape, affine_only=False):
    """(order, elements touched, (bytes, elements spanned)) of each tensor load in `value` that tells its order,
    as seen from the iteration space `shape` (value built at `dim_vars(shape)`). `affine_only`: only loads whose
    every dim moves by a known stride (not a flip's reversed index, not a reshape's // or %)."""
    from brrr.cost.ops import tensor_bytes
    for v in ir.walk(value):
        if isinstance(v, ir.ReduceRef) and v.node.stride:   # a reduction an earlier kernel stored: a load
            v = ir.Load(v.node, linear(v.idx, v.node.stride), v.dtype)
        if not isinstance(v, ir.Load):
            continue
        strides = access_strides(v.index, len(shape))
        if not any(s for s, size in zip(strides, shape) if size != 1):
            continue
        if affine_only and any(s is None for s, size in zip(strides, shape) if size != 1):
            continue
        fake = v.buf.meta.get("fake")
        nbytes = tensor_bytes(fake) if hasattr(fake, "stride") else v.buf.numel
        spanned = 1
        for s, dim in zip(strides, shape):
            spanned *= dim if s != 0 else 1
        elements = nbytes // fake.element_size() if hasattr(fake, "element_size") else nbytes
        yield order_of(strides, shape), elements, (nbytes, spanned)


def largest_input(value, shape, against=None):
    """(order, elements touched) of the largest tensor `value` loads, as seen from the iteration space `shape`
    (value built at `dim_vars(shape)`), or None when no load tells its order. Of several loads of one tensor,
    the one that spans most of the space decides: a layer norm's shift (x[:, 0], broadcast along the row) reads
    the same tensor as its x, but walking by it would put the rows innermost. With `against` (an order), only
    loads whose innermost dim is not that order's count, and only where every stride is known: a flip's
    reversed dim has none, and sorted outermost it would read as a transpose."""
    best, best_key = None, None
    inner = innermost(shape, against) if against is not None else None
    for order, elements, key in input_orders(value, shape, affine_only=against is not None):
        if against is not None and innermost(shape, order) == inner:
            continue
        key = tuple(hint(k) for k in key)   # a heuristic: compared at the hint sizes, no guard
        if best_key is None or key > best_key:
            best, best_key = (order, elements), key
    return best


def reads_across_rows(value, shape, dims):
    """Whether a row reduction over `dims` also loads a large tensor (a quarter of the space or more) whose
    innermost dim is a kept one: a gradient that reaches a layer norm through a transpose (MLP-Mixer's token
    mixing). Walking rows, neighbouring lanes of that load sit a whole row apart."""
    return _large_input_innermost(value, shape, dims, reduced=False)


def reads_along_rows(value, shape, dims):
    """Whether a column reduction over `dims` also loads a large tensor whose innermost dim is a reduced one
    (the same layer norm's backward, seen from its weight gradient): its tile must be long along the rows too."""
    return _large_input_innermost(value, shape, dims, reduced=True)


def _large_input_innermost(value, shape, dims, reduced):
    space = 1
    for dim in shape:
        space *= hint(dim)   # a heuristic: at the hint sizes
    for order, elements, _ in input_orders(value, shape):
        inner = innermost(shape, order)
        if inner is not None and (inner in dims) == reduced and 4 * hint(elements) >= space:
            return True
    return False


def largest_input_order(value, shape):
    """The memory order of the largest tensor `value` loads (see `largest_input`), or None."""
    found = largest_input(value, shape)
    return found[0] if found else None


def with_kept_order(order, shape, dims, out_shape, out_order):
    """`order` with its kept dims (those not in `dims`) reordered, in the same slots, as the output of shape
    `out_shape` (sizes > 1: the kept sizes > 1) is laid out (`out_order`): whether the kernel walks a row or a
    column stays the input's call, the output is stored in order."""
    kept = [d for d in range(len(shape)) if d not in dims and shape[d] != 1]
    out_dim = dict(zip(kept, [j for j, s in enumerate(out_shape) if s != 1]))
    rank = {j: i for i, j in enumerate(out_order)}
    refill = iter(sorted(kept, key=lambda d: rank[out_dim[d]]))
    return tuple(next(refill) if d in out_dim else d for d in order)


def tile_split(shape, order, input_order):
    """A layout change (NCHW <-> NHWC, a transpose): the count of the kernel's innermost dims that form the
    x side of a [YBLOCK, XBLOCK] tile, the dims inner to the input's innermost one, so stores run along x and
    loads along y, both contiguous. 0 when the input's innermost dim is the kernel's."""
    inner_in, inner_out = innermost(shape, input_order), innermost(shape, order)
    if inner_in is None or inner_out is None or inner_in == inner_out:
        return 0
    return order.index(inner_in)


def fake_order(node, shape):
    """The order of eager's layout for `node` (its FakeTensor's strides), or None."""
    fake = node.meta.get("fake")
    if not hasattr(fake, "stride") or not same(fake.shape, shape):
        return None
    return order_of(tuple(fake.stride()), shape)
