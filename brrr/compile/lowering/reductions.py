"""Lowerings: reductions (sum, mean, amax/amin, prod, arg*, any/all, var/std/var_mean) (part of lower.py's
tables). Composite reductions (var, mean) are Reduction nodes plus a small Pointwise on top."""

import torch

from brrr.compile import ir
from brrr.compile.ir import Const, Op
from brrr.compile.indexing import Ix
from brrr.compile.lower import (NotLowered, cast, elementwise, kept_index, make_reduction, meta, norm_dims,
                                op_name, pw, reads_in_one_tile, register, register_prim)


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
    if n and not reads_in_one_tile(x, dims):
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


def _shifted_moments(L, fx, x, dims, vshape, acc, n):
    """(mean, sum of squared deviations) from one pass: s = sum(x - K), q = sum((x - K)^2) over a row, K its
    first element; mean = K + s / n, squared deviations q - s^2 / n (never below 0)."""
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

    def mean_at(idx):
        return Op("add", [shift(source_index(idx)), Op("div", [s(idx), Const(n, acc)], acc)], acc)

    def var_at(idx):
        s_i = s(idx)
        q_i = Op("sub", [q(idx), Op("div", [Op("mul", [s_i, s_i], acc), Const(n, acc)], acc)], acc)
        return Op("maximum", [q_i, Const(0, acc)], acc)
    return mean_at, var_at


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
    return make_reduction(L, fx, x, norm_dims(dims, len(x.shape)), rtype, tuple(m.shape), m.dtype)


@register_prim("var")
def prim_var(L, fx, x, dims, correction=1, output_dtype=None):
    return lower_var(L, fx, x, dims, correction=correction)


