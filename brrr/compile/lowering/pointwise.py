"""Lowerings: pointwise math, casts and constants (part of core.py's tables).

Each function maps one core-ATen op to a Pointwise node whose fn builds the value at an output index."""

import torch

from brrr.compile.ir import nodes as ir
from brrr.compile.ir.indexing import contiguous_strides, linear
from brrr.compile.ir.nodes import Const, IndexValue, Op, Rand
from brrr.compile.lowering.core import (NotLowered, cast, elementwise, fake, meta, op_name, operands, pw, register,
                                        register_prim, value_of)


UNARY = {"abs": "abs", "neg": "neg", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
         "log10": "log10", "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin", "cos": "cos",
         "tan": "tan", "tanh": "tanh", "sigmoid": "sigmoid", "erf": "erf", "relu": "relu", "reciprocal": "reciprocal",
         "floor": "floor", "ceil": "ceil", "round": "round", "trunc": "trunc", "sign": "sign", "silu": "silu",
         "sinh": "sinh", "cosh": "cosh", "atan": "atan", "asin": "asin", "acos": "acos", "erfc": "erfc",
         "bitwise_not": "bitwise_not", "logical_not": "logical_not", "isnan": "isnan", "isinf": "isinf",
         "sgn": "sign", "frac": "frac", "square": "square", "acosh": "acosh", "asinh": "asinh", "atanh": "atanh",
         "signbit": "signbit",
         # special functions (mathops.SPECIAL_FUNCTIONS)
         "lgamma": "lgamma", "digamma": "digamma", "erfinv": "erfinv", "i0": "i0", "special_i0e": "i0e",
         "special_i1": "i1", "special_i1e": "i1e", "special_erfcx": "erfcx", "special_ndtri": "ndtri",
         "special_modified_bessel_i0": "i0", "special_modified_bessel_i1": "modified_bessel_i1",
         "special_modified_bessel_k0": "modified_bessel_k0", "special_modified_bessel_k1": "modified_bessel_k1",
         "special_scaled_modified_bessel_k0": "scaled_modified_bessel_k0",
         "special_scaled_modified_bessel_k1": "scaled_modified_bessel_k1", "special_bessel_j0": "bessel_j0",
         "special_bessel_j1": "bessel_j1", "special_bessel_y0": "bessel_y0", "special_bessel_y1": "bessel_y1",
         "special_spherical_bessel_j0": "spherical_bessel_j0", "special_airy_ai": "airy_ai"}
BINARY = {"mul": "mul", "div": "div", "maximum": "maximum", "minimum": "minimum", "pow": "pow",
          "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "remainder": "remainder",
          "fmod": "fmod", "atan2": "atan2", "fmax": "maximum", "fmin": "minimum", "hypot": "hypot",
          "copysign": "copysign", "special_zeta": "zeta",
          **{f"special_{p}": p for p in ("chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
                                         "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
                                         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
                                         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
                                         "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p")}}
POLYNOMIALS = {name for name in BINARY.values() if "polynomial" in name}
COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
           "logical_and": "and", "logical_or": "or", "logical_xor": "ne"}

@register(*UNARY)
def lower_unary(L, fx, x, *rest, decimals=0):
    name = UNARY[op_name(fx.target)]
    if rest:
        raise NotLowered(f"{op_name(fx.target)} with extra arguments")
    if name == "round" and decimals:
        return _round_decimals(L, fx, x, decimals)
    if name in ("isnan", "isinf", "logical_not", "signbit"):
        cdt = x.dtype if name != "logical_not" else torch.bool
        return pw(L, fx, lambda idx: Op(name, [cast(x(idx), cdt)], torch.bool))
    return elementwise(L, fx, name, [x])


def _round_decimals(L, fx, x, decimals):
    """round(x, decimals) as ATen computes it: scaled by 10^|decimals| (in the tensor's dtype), rounded half to
    even, scaled back."""
    out = meta(fx).dtype
    scale = float(torch.tensor(10.0 ** abs(decimals), dtype=out if out != torch.float64 else torch.float64))
    up, down = ("mul", "div") if decimals > 0 else ("div", "mul")

    def fn(idx):
        v = Op(up, [cast(x(idx), out), Const(scale, out)], out)
        return Op(down, [Op("round", [v], out), Const(scale, out)], out)
    return pw(L, fx, fn)


@register("ldexp")
def lower_ldexp(L, fx, x, e):
    out = meta(fx).dtype
    get = operands(L, fx, [x, e], out)

    def fn(idx):
        a, b = get(idx)
        return Op("mul", [a, Op("exp2", [b], out)], out)
    return pw(L, fx, fn)


@register(*BINARY)
def lower_binary(L, fx, a, b, **kw):
    name = BINARY[op_name(fx.target)]
    mode = kw.get("rounding_mode")
    if name == "div" and mode is not None:
        name = {"floor": "floordiv", "trunc": "truncdiv"}[mode]
    if name == "pow" and not isinstance(b, ir.Node):
        base = a if isinstance(a, ir.Node) else None
        if base is None:
            raise NotLowered("pow with a scalar base")
        out = meta(fx).dtype
        return pw(L, fx, lambda idx: Op("pow_scalar", [cast(value_of(a, idx, ()), out), Const(b, torch.float64)], out))
    if name == "pow" and not isinstance(a, ir.Node):
        out = meta(fx).dtype
        return pw(L, fx, lambda idx: Op("pow", [Const(a, out), cast(value_of(b, idx, ()), out)], out))
    if name in POLYNOMIALS and meta(fx).device.type == "cuda":
        raise NotLowered("orthogonal polynomial on the GPU: brrr's kernel follows eager's CPU algorithm, and "
                         "eager's CUDA kernel gives NaN at other non-finite arguments")
    return elementwise(L, fx, name, [a, b])


@register("polygamma")
def lower_polygamma(L, fx, n, x):
    """polygamma(n, x) as eager: digamma for n = 0, its float32 trigamma for n = 1, else
    (-1)^(n+1) exp(lgamma(n + 1)) zeta(n + 1, x)."""
    if isinstance(n, ir.Node) or not 0 <= n <= 30:
        raise NotLowered("polygamma of an order other than a constant 0..30")
    out = meta(fx).dtype
    get = operands(L, fx, [x], out)
    if n <= 1:
        return pw(L, fx, lambda idx: Op("digamma" if n == 0 else "trigamma", get(idx), out))
    factor = torch.tensor(n + 1.0).lgamma().exp().item() * (1 if n % 2 else -1)   # in float32, as eager

    def fn(idx):
        z = Op("zeta", [Const(float(n + 1), out)] + get(idx), out)
        return Op("mul", [Const(factor, out), z], out)
    return pw(L, fx, fn)


@register("add", "sub")
def lower_add(L, fx, a, b, alpha=1):
    name = op_name(fx.target)
    out = meta(fx).dtype
    get = operands(L, fx, [a, b], out)

    def fn(idx):
        x, y = get(idx)
        if alpha != 1:
            y = Op("mul", [y, Const(alpha, out)], out)
        return Op(name, [x, y], out)
    return pw(L, fx, fn)


@register("rsub")
def lower_rsub(L, fx, a, b, alpha=1):
    out = meta(fx).dtype
    get = operands(L, fx, [a, b], out)

    def fn(idx):
        x, y = get(idx)
        return Op("sub", [y, Op("mul", [x, Const(alpha, out)], out) if alpha != 1 else x], out)
    return pw(L, fx, fn)


@register(*COMPARE)
def lower_compare(L, fx, a, b):
    name = COMPARE[op_name(fx.target)]
    if op_name(fx.target).startswith("logical"):
        cdt = torch.bool
    else:
        cdt = torch.result_type(fake(a), fake(b))
    get = operands(L, fx, [a, b], cdt)
    return pw(L, fx, lambda idx: Op(name, get(idx), torch.bool))


@register("where")
def lower_where(L, fx, c, a, b):
    out = meta(fx).dtype
    gc, gab = operands(L, fx, [c], torch.bool), operands(L, fx, [a, b], out)
    return pw(L, fx, lambda idx: Op("where", gc(idx) + gab(idx), out))


@register("clamp", "clamp_min", "clamp_max", "hardtanh")
def lower_clamp(L, fx, x, lo=None, hi=None):
    name = op_name(fx.target)
    if name == "clamp_max":
        lo, hi = None, lo
    out = meta(fx).dtype
    shape = tuple(meta(fx).shape)

    def bound(b, idx):
        return cast(value_of(b, idx, shape), out) if isinstance(b, ir.Node) else Const(b, out)

    def fn(idx):   # torch.clamp: min first, then max (so min > max gives max)
        v = cast(value_of(x, idx, shape), out)
        if lo is not None:
            v = Op("maximum", [v, bound(lo, idx)], out)
        if hi is not None:
            v = Op("minimum", [v, bound(hi, idx)], out)
        return v
    return pw(L, fx, fn)


@register("masked_fill")
def lower_masked_fill(L, fx, x, mask, value):
    out = meta(fx).dtype
    g = operands(L, fx, [mask], torch.bool)
    gx = operands(L, fx, [x, value], out)
    return pw(L, fx, lambda idx: Op("where", g(idx) + gx(idx)[::-1], out))


@register("gelu")
def lower_gelu(L, fx, x, approximate="none"):
    out = meta(fx).dtype
    return pw(L, fx, lambda idx: Op("gelu_tanh" if approximate == "tanh" else "gelu", [cast(x(idx), out)], out))


@register("lerp")
def lower_lerp(L, fx, a, b, w):
    out = meta(fx).dtype
    get = operands(L, fx, [a, b, w], out)

    def fn(idx):
        x, y, t = get(idx)
        return Op("add", [x, Op("mul", [t, Op("sub", [y, x], out)], out)], out)
    return pw(L, fx, fn)


@register("_to_copy", "clone", "copy", "lift_fresh_copy", "convert_element_type", "contiguous")
def lower_copy(L, fx, x, src=None, **kw):
    m = meta(fx)
    if op_name(fx.target) == "copy":
        x = src
    if kw.get("device") is not None and torch.device(kw["device"]) != m.device:
        raise NotLowered("copy across devices")
    if isinstance(x, ir.Node) and fake(x).device != m.device:
        raise NotLowered("copy across devices")
    rnd = (op_name(fx.target) in ("_to_copy", "convert_element_type") and m.dtype in (torch.float16, torch.bfloat16)
           and isinstance(x, ir.Node) and x.dtype.is_floating_point and x.dtype != m.dtype)
    if not isinstance(x, ir.Node):
        return pw(L, fx, lambda idx: Const(x, m.dtype))
    if rnd:   # an explicit downcast rounds, as eager does, even though the kernel keeps computing in fp32
        return pw(L, fx, lambda idx: Op("round_to", [value_of(x, idx, m.shape)], m.dtype))
    return pw(L, fx, lambda idx: cast(value_of(x, idx, m.shape), m.dtype))


# ------------------------------------------------------------------------------------------ constants

@register("full", "full_like", "zeros", "ones", "zeros_like", "ones_like", "scalar_tensor", "empty", "empty_like",
          "new_zeros", "new_ones", "new_full", "new_empty", "empty_strided", "fill", "empty_permuted")
def lower_full(L, fx, *args, **kw):
    m = meta(fx)
    name = op_name(fx.target)
    value = {"zeros": 0, "zeros_like": 0, "ones": 1, "ones_like": 1, "new_zeros": 0, "new_ones": 1}.get(name, 0)
    if name in ("full", "new_full", "fill", "full_like"):
        value = args[1] if name in ("full", "fill", "full_like") else args[2]
    if name == "scalar_tensor":
        value = args[0]
    if isinstance(value, ir.Node):
        raise NotLowered("fill with a tensor value")
    return pw(L, fx, lambda idx: Const(value, m.dtype))


@register("arange")
def lower_arange(L, fx, *args, **kw):
    m = meta(fx)
    start, step = (args[0], args[2] if len(args) > 2 else 1) if len(args) >= 2 else (0, 1)
    dt = m.dtype

    def fn(idx):
        v = cast(IndexValue(idx[0]), dt)
        if step != 1:
            v = Op("mul", [v, Const(step, dt)], dt)
        return Op("add", [v, Const(start, dt)], dt) if start != 0 else v
    return pw(L, fx, fn)


@register("rand", "rand_like")
def lower_rand(L, fx, *args, **kw):
    m = meta(fx)
    if m.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise NotLowered(f"rand in {m.dtype}")
    seed = L.seed_buffer(m.device)
    strides = contiguous_strides(m.shape)
    return pw(L, fx, lambda idx: cast(Rand(seed, linear(idx, strides), torch.float32), m.dtype))


@register_prim("div")
def prim_div(L, fx, a, b):
    if meta(fx).dtype.is_floating_point:
        return elementwise(L, fx, "div", [a, b])
    return elementwise(L, fx, "truncdiv", [a, b])


@register_prim("convert_element_type")
def prim_convert(L, fx, x, dtype):
    return lower_copy(L, fx, x)

