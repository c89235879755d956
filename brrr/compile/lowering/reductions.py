"""Lowerings: reductions (sum, mean, amax/amin, prod, arg*, any/all, var/std/var_mean) (part of core.py's
tables). Composite reductions (var, mean) are Reduction nodes plus a small Pointwise on top."""

import torch

from brrr.compile.ir import nodes as ir
from brrr.compile.ir.indexing import Ix
from brrr.compile.ir.nodes import Const, IndexValue, Op
from brrr.compile.lowering.core import (NotLowered, cast, device_of, elementwise, kept_index, make_reduction, meta,
                                        norm_dims, op_name, pw, reads_in_one_tile, register, register_prim)


# ------------------------------------------------------------------------------------------ reductions

@register("sum", "mean", "amax", "amin", "prod", "any", "all")
def lower_sum(L, fx, x, dims=None, keepdim=False, *, dtype=None, **kw):
    name = op_name(fx.target)
    m = meta(fx)
    if isinstance(dims, bool):   # any.default / all.default have no dims
        dims = None
    if name == "prod" and isinstance(dims, int) is False and dims is not None and not isinstance(dims, (list, tuple)):
        dims = None
    dims = norm_dims(dims, len(x.shape))
    rtype = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min", "prod": "prod", "any": "max",
             "all": "min"}[name]
    if name in ("any", "all"):
        red = make_reduction(L, fx, x, dims, rtype, tuple(m.shape), torch.bool,
                             body=lambda idx: cast(x(idx), torch.bool), acc_dtype=torch.bool)
        return red
    if rtype == "sum" and not kw and dtype is None and _shares_shifted_sum(fx, x, dims, m):
        return _sum_from_shifted(L, fx, x, dims, tuple(m.shape), m.dtype, name)
    red = make_reduction(L, fx, x, dims, rtype, tuple(m.shape), m.dtype)
    if name != "mean":
        return red
    n = 1
    for d in dims:
        n *= x.shape[d]
    acc = red.meta["acc_dtype"]
    red.dtype = acc
    red.meta["fake"] = torch.empty(tuple(m.shape), dtype=acc, device="meta")
    return pw(L, fx, lambda idx: cast(Op("div", [red(idx), Const(n, acc)], acc), m.dtype),
              ops=("mean",))


def _sum_from_shifted(L, fx, x, dims, vshape, out, name):
    """sum (or mean) of rows whose one-pass moments a variance beside it computes: n * K + s (K + s / n)."""
    acc = torch.float32 if out in (torch.float16, torch.bfloat16) else out
    n = 1
    for d in dims:
        n *= x.shape[d]
    s, _, k_at = shifted_sums(L, fx, x, dims, vshape, acc)

    def value(idx):
        if name == "mean":
            return cast(Op("add", [k_at(idx), Op("div", [s(idx), Const(n, acc)], acc)], acc), out)
        return cast(Op("add", [s(idx), Op("mul", [k_at(idx), Const(n, acc)], acc)], acc), out)
    return pw(L, fx, value, ops=(name,))


@register("max", "min")
def lower_max_dim(L, fx, x, dim=None, keepdim=False):
    name = op_name(fx.target)
    m = meta(fx)
    if isinstance(dim, ir.Node):
        return elementwise(L, fx, "maximum" if name == "max" else "minimum", [x, dim])
    if dim is None:
        return make_reduction(L, fx, x, norm_dims(None, len(x.shape)), name, tuple(m.shape), m.dtype)
    vals, inds = m
    dims = norm_dims(dim, len(x.shape))
    v = make_reduction(L, fx, x, dims, name, tuple(vals.shape), vals.dtype)
    i = make_reduction(L, fx, x, dims, "arg" + name, tuple(inds.shape), torch.int64)
    return (v, i)


@register("argmax", "argmin")
def lower_argmax(L, fx, x, dim=None, keepdim=False):
    m = meta(fx)
    if dim is None and len(x.shape) > 1:
        raise NotLowered("argmax over all dims")
    dims = norm_dims(dim, len(x.shape))
    return make_reduction(L, fx, x, dims, op_name(fx.target), tuple(m.shape), torch.int64)


@register("var", "var_mean", "std")
def lower_var(L, fx, x, dims=None, *, correction=None, keepdim=False, **kw):
    """Variance in two passes (the sum, then the squares around the mean) where a row sits in registers. Where
    rows are looped or split (batch-norm statistics), the second pass would read x from memory again; there it
    is one pass over x - K, with K the row's first element: sum(d) and sum(d * d) give the same variance
    (shifted data), and a shift near the data keeps the subtraction from cancelling (eager uses Welford)."""
    name = op_name(fx.target)
    m = meta(fx)
    vshape = tuple((m[0] if name == "var_mean" else m).shape)
    out = (m[0] if name == "var_mean" else m).dtype
    dims = norm_dims(dims, len(x.shape))
    correction = 1 if correction is None else correction
    n = 1
    for d in dims:
        n *= x.shape[d]
    acc = torch.float32 if out in (torch.float16, torch.bfloat16) else out
    denom = max(n - correction, 0)
    if n and not reads_in_one_tile(x, dims, fx in L.wider):
        mean_at, var_at = _shifted_moments(L, fx, x, dims, vshape, acc, n)
    else:
        mean_at, var_at = _two_pass_moments(L, fx, x, dims, vshape, acc, n)

    def var_fn(idx):
        v = Op("div", [var_at(idx), Const(denom, acc)], acc)
        return cast(Op("sqrt", [v], acc) if name == "std" else v, out)
    var = ir.pointwise(L.fresh("pw"), vshape, out, var_fn, fx=fx, ops=(name,))
    if name != "var_mean":
        return var
    mean = ir.pointwise(L.fresh("pw"), vshape, out, lambda idx: cast(mean_at(idx), out), fx=fx, ops=(name,))
    return (var, mean)


def _two_pass_moments(L, fx, x, dims, vshape, acc, n):
    """(mean at an output index, sum of squared deviations at it): the sum, then the squares around the mean."""
    s = make_reduction(L, fx, x, dims, "sum", vshape, acc, acc_dtype=acc)

    def mean_at(idx):
        return Op("div", [s(idx), Const(n, acc)], acc)

    def body(idx):
        d = Op("sub", [cast(x(idx), acc), mean_at(kept_index(idx, dims, vshape))], acc)
        return Op("mul", [d, d], acc)
    ss = make_reduction(L, fx, x, dims, "sum", vshape, acc, body=body, acc_dtype=acc)
    return mean_at, ss


def shifted_sums(L, fx, x, dims, vshape, acc):
    """(s, q, k_at) of one pass over a row: s = sum(x - K), q = sum((x - K)^2), K the row's first element, and
    k_at(output index) -> K. Kept per input, dims and shape, so a plain sum of the same rows (the mean that
    batch norm's decomposition computes beside the variance) is s + n * K instead of a third accumulator."""
    key = (_same_values(fx.args[0]), tuple(dims), tuple(vshape))
    if key in L.shifted_sums:
        return L.shifted_sums[key]

    def shift(src_idx):
        # K: x at the row's first element, which every row has (n > 0); loaded without the masks of a split
        # reduction's chunk, so a looped kernel loads it per row, not per reduced element
        saved = list(ir.MASKS)
        ir.MASKS.clear()
        try:
            return cast(x([Ix() if d in dims else i for d, i in enumerate(src_idx)]), acc)
        finally:
            ir.MASKS[:] = saved

    def deviation(idx):
        return Op("sub", [cast(x(idx), acc), shift(idx)], acc)

    def square(idx):
        d = deviation(idx)
        return Op("mul", [d, d], acc)
    s = make_reduction(L, fx, x, dims, "sum", vshape, acc, body=deviation, acc_dtype=acc)
    q = make_reduction(L, fx, x, dims, "sum", vshape, acc, body=square, acc_dtype=acc)

    def source_index(idx):   # an output index (keepdim or not) -> x's index of the row's first element
        if len(idx) == len(x.shape):
            return [Ix() if d in dims else i for d, i in enumerate(idx)]
        it = iter(idx)
        return [Ix() if d in dims else next(it) for d in range(len(x.shape))]

    L.shifted_sums[key] = (s, q, lambda idx: shift(source_index(idx)))
    return L.shifted_sums[key]


def _shifted_moments(L, fx, x, dims, vshape, acc, n):
    """(mean, sum of squared deviations) from one pass (shifted_sums): mean = K + s / n, squared deviations
    q - s^2 / n (never below 0)."""
    s, q, k_at = shifted_sums(L, fx, x, dims, vshape, acc)

    def mean_at(idx):
        return Op("add", [k_at(idx), Op("div", [s(idx), Const(n, acc)], acc)], acc)

    def var_at(idx):
        s_i = s(idx)
        q_i = Op("sub", [q(idx), Op("div", [Op("mul", [s_i, s_i], acc), Const(n, acc)], acc)], acc)
        return Op("maximum", [q_i, Const(0, acc)], acc)
    return mean_at, var_at


def _shares_shifted_sum(fx, x, dims, m):
    """Whether this float sum can come from the one-pass moments of a variance beside it."""
    return (m.dtype.is_floating_point and x.dtype.is_floating_point and all(x.shape[d] for d in dims)
            and _variance_beside(fx, dims, len(x.shape)) and not reads_in_one_tile(x, dims))


def _same_values(node):
    """(source node, dtype): an FX value up to casts between float types. A decomposition casts its input once
    per use (var_mean's variance and sum each get their own _to_copy of x)."""
    dtype = getattr(meta(node), "dtype", None)
    while isinstance(node, torch.fx.Node) and op_name(node.target) in ("_to_copy", "convert_element_type"):
        src = node.args[0]
        extra = set(node.kwargs) - {"dtype"}
        if extra or not isinstance(src, torch.fx.Node) or not getattr(meta(src), "dtype", torch.int64).is_floating_point:
            break
        node = src
    return node, dtype


def _variance_beside(fx, dims, ndim):
    """Whether a variance over the same values and dims sits beside this sum in the graph (a decomposed batch
    norm or var_mean): its one-pass moments then hold this sum too."""
    mine = _same_values(fx.args[0])
    root = mine[0]
    candidates = [u for u in root.users] + [v for u in root.users for v in u.users]
    for user in candidates:
        if user is fx or op_name(user.target) not in ("var", "var_mean", "std"):
            continue
        vd = user.args[1] if len(user.args) > 1 else user.kwargs.get("dims", user.kwargs.get("dim"))
        if vd is not None and _same_values(user.args[0]) == mine and sorted(norm_dims(vd, ndim)) == sorted(dims):
            return True
    return False


@register("linalg_vector_norm")
def lower_vector_norm(L, fx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """sum(|x|^ord)^(1/ord) over `dim` (ord 2: a square root, 1: no root, inf/-inf: amax/amin of |x|, 0: the
    count of non-zeros), accumulated in fp32 for half types."""
    m = meta(fx)
    out = m.dtype
    if not out.is_floating_point or not x.dtype.is_floating_point:
        raise NotLowered("vector norm of a complex tensor")
    acc = torch.float32 if out in (torch.float16, torch.bfloat16) else out
    dims = norm_dims(dim, len(x.shape))
    ord = float(ord)
    shape = tuple(m.shape)

    def magnitude(idx):
        return Op("abs", [cast(x(idx), acc)], acc)
    if ord in (float("inf"), float("-inf")):
        return make_reduction(L, fx, x, dims, "max" if ord > 0 else "min", shape, out,
                              body=lambda idx: cast(magnitude(idx), out), acc_dtype=acc)
    if ord == 0:
        body = lambda idx: cast(Op("ne", [magnitude(idx), Const(0, acc)], torch.bool), acc)  # noqa: E731
    elif ord == 1:
        body = magnitude
    elif ord == 2:
        body = lambda idx: Op("mul", [cast(x(idx), acc), cast(x(idx), acc)], acc)  # noqa: E731
    else:
        body = lambda idx: Op("pow_scalar", [magnitude(idx), Const(ord, torch.float64)], acc)  # noqa: E731
    total = make_reduction(L, fx, x, dims, "sum", shape, acc, body=body, acc_dtype=acc)
    if ord in (0, 1):
        return pw(L, fx, lambda idx: cast(total(idx), out))
    if ord == 2:
        return pw(L, fx, lambda idx: cast(Op("sqrt", [total(idx)], acc), out))
    return pw(L, fx, lambda idx: cast(Op("pow_scalar", [total(idx), Const(1.0 / ord, torch.float64)], acc), out))


@register_prim("sum", "amax", "amin", "prod")
def prim_reduce(L, fx, x, dims, output_dtype=None):
    m = meta(fx)
    rtype = {"sum": "sum", "amax": "max", "amin": "min", "prod": "prod"}[op_name(fx.target)]
    dims = norm_dims(dims, len(x.shape))
    if rtype == "sum" and output_dtype is None and _shares_shifted_sum(fx, x, dims, m):
        return _sum_from_shifted(L, fx, x, dims, tuple(m.shape), m.dtype, "sum")
    return make_reduction(L, fx, x, dims, rtype, tuple(m.shape), m.dtype)


@register_prim("var")
def prim_var(L, fx, x, dims, correction=1, output_dtype=None):
    return lower_var(L, fx, x, dims, correction=correction)




MAX_SCAN = 1024   # cumsum's quadratic form: each output sums its whole row, so short dims only
MAX_SCAN_WORK = 2 ** 24   # and few of them: elements read in all (outputs x n), ~10 us of cached loads on a GPU


@register("cumsum")
def lower_cumsum(L, fx, x, dim, *, dtype=None):
    """out[..., i, ...] = x[..., 0, ...] + ... + x[..., i, ...] along `dim`, as a reduction of a triangle: each
    output element sums the n elements of its row, those after it masked to 0. Quadratic in n, so only for
    dims of at most MAX_SCAN and tensors of at most MAX_SCAN_WORK reads (the position ids and mask offsets that
    language models build over a sequence); a row's sum in the reduction's order, not left to right, which is
    exact for integers."""
    m = meta(fx)
    if not x.shape:
        return pw(L, fx, lambda idx: cast(x(idx), m.dtype))
    d = dim % len(x.shape)
    n = x.shape[d]
    if n > MAX_SCAN or x.numel * n > MAX_SCAN_WORK:
        raise NotLowered(f"cumsum of {x.numel} elements over {n} (the triangle form serves at most {MAX_SCAN} "
                         f"along the dim and {MAX_SCAN_WORK} reads in all; ATen's scan is linear)")
    acc = torch.float32 if m.dtype in (torch.float16, torch.bfloat16) else m.dtype
    last = len(x.shape)

    def triangle(idx):
        j = idx[last]
        src = list(idx[:last])
        src[d] = j
        before = Op("le", [IndexValue(j), IndexValue(idx[d])], torch.bool)
        return Op("where", [before, cast(x(src), acc), Const(0, acc)], acc)
    shape = tuple(x.shape) + (n,)
    tri = ir.pointwise(L.fresh("pw"), shape, acc, triangle, ops=("cumsum",))
    tri.meta["fake"] = torch.empty(shape, dtype=acc, device="meta")
    tri.meta["device"] = device_of(x)
    return make_reduction(L, fx, tri, (last,), "sum", tuple(m.shape), m.dtype, acc_dtype=acc)
