"""The math ops of brrr's IR: one table that lowering checks and codegen renders (lower -> ir -> **codegen**).

An `ir.Op` names an entry of `OPS`. For each kind of operand (float, int, bool) an entry gives the Triton
expression that computes it (a format string over the rendered operands) and the shim helpers it calls
(`codegen/shim.py`). Lowering keeps a node only when every Op in it has an expression here for its operands'
kind (`refusal(op)` says why not; the ATen op then runs instead, at op scope); codegen renders from the same
entries. So an op that lowers always renders, and a test walks the table to hold both sides to it.

Floats are computed in fp32 (fp16/bf16 are loaded as fp32), so a float template sees fp32 or fp64 values.
"""

import torch

FLOAT, INT, BOOL = "float", "int", "bool"
ANY = "any"   # a template that serves every kind


def _t(template, *helpers):
    return (template, tuple(helpers))


def _any(template, *helpers):
    return {ANY: _t(template, *helpers)}


def _float(template, *helpers):
    return {FLOAT: _t(template, *helpers)}


def _numeric(template, *helpers):
    return {FLOAT: _t(template, *helpers), INT: _t(template, *helpers)}


OPS = {
    # arithmetic and comparisons: Triton's operators
    "add": {FLOAT: _t("{0} + {1}"), INT: _t("{0} + {1}"), BOOL: _t("{0} | {1}")},
    "sub": _numeric("{0} - {1}"),
    "mul": {FLOAT: _t("{0} * {1}"), INT: _t("{0} * {1}"), BOOL: _t("{0} & {1}")},
    "neg": _numeric("-{0}"),
    "div": _float("{0} / {1}"),
    "eq": _any("{0} == {1}"), "ne": _any("{0} != {1}"), "lt": _any("{0} < {1}"), "le": _any("{0} <= {1}"),
    "gt": _any("{0} > {1}"), "ge": _any("{0} >= {1}"),
    "and": {INT: _t("{0} & {1}"), BOOL: _t("{0} & {1}")}, "or": {INT: _t("{0} | {1}"), BOOL: _t("{0} | {1}")},
    "xor": {INT: _t("{0} ^ {1}"), BOOL: _t("{0} ^ {1}")},
    "where": _any("tl.where({0}, {1}, {2})"),
    "maximum": {FLOAT: _t("tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
                INT: _t("tl.maximum({0}, {1})"), BOOL: _t("{0} | {1}")},
    "minimum": {FLOAT: _t("tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
                INT: _t("tl.minimum({0}, {1})"), BOOL: _t("{0} & {1}")},
    "abs": _numeric("tl.abs({0})"),
    "square": _numeric("{0} * {0}"),
    "sign": {FLOAT: _t("tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, {0} * 0.0))"),
             INT: _t("tl.where({0} > 0, 1, tl.where({0} < 0, -1, 0))")},
    "relu": _numeric("tl.where({0} < 0, 0, {0})"),
    "floordiv": {FLOAT: _t("tl.math.floor({0} / {1})"), INT: _t("floordiv_int({0}, {1})", "floordiv_int")},
    "truncdiv": {FLOAT: _t("trunc({0} / {1})", "trunc"), INT: _t("{0} // {1}")},
    "remainder": {FLOAT: _t("{0} - tl.math.floor({0} / {1}) * {1}"),
                  INT: _t("remainder_int({0}, {1})", "remainder_int")},
    "fmod": {FLOAT: _t("{0} - trunc({0} / {1}) * {1}", "trunc"), INT: _t("{0} % {1}")},
    # rounding: integers are already whole
    "floor": {FLOAT: _t("tl.math.floor({0})"), INT: _t("{0}")},
    "ceil": {FLOAT: _t("tl.math.ceil({0})"), INT: _t("{0}")},
    "trunc": {FLOAT: _t("trunc({0})", "trunc"), INT: _t("{0}")},
    "round": {FLOAT: _t("round_half_even({0})", "round_half_even"), INT: _t("{0}")},
    "frac": _float("{0} - trunc({0})", "trunc"),
    # transcendental: tl.math where it runs in the interpreter too, else a shim helper
    "exp": _float("tl.exp({0})"), "exp2": _float("tl.exp2({0})"), "expm1": _float("expm1({0})", "expm1"),
    "log": _float("tl.log({0})"), "log2": _float("tl.log2({0})"),
    "log10": _float("tl.log({0}) * 0.4342944819032518"), "log1p": _float("log1p({0})", "log1p"),
    "sqrt": _float("tl.sqrt({0})"), "rsqrt": _float("tl.rsqrt({0})"), "reciprocal": _float("1.0 / {0}"),
    "sin": _float("tl.sin({0})"), "cos": _float("tl.cos({0})"), "tan": _float("tl.sin({0}) / tl.cos({0})"),
    "atan": _float("atan({0})", "atan"), "atan2": _float("atan2({0}, {1})", "atan", "atan2"),
    "asin": _float("atan2({0}, tl.sqrt((1.0 - {0}) * (1.0 + {0})))", "atan", "atan2"),
    "acos": _float("atan2(tl.sqrt((1.0 - {0}) * (1.0 + {0})), {0})", "atan", "atan2"),
    "sinh": _float("0.5 * (tl.exp({0}) - tl.exp(-{0}))"), "cosh": _float("0.5 * (tl.exp({0}) + tl.exp(-{0}))"),
    "acosh": _float("acosh({0})", "acosh", "log1p"), "asinh": _float("asinh({0})", "asinh", "log1p"),
    "atanh": _float("atanh({0})", "atanh", "log1p"), "hypot": _float("hypot({0}, {1})", "hypot"),
    "copysign": _float("tl.where(signbit({1}), -tl.abs({0}), tl.abs({0}))", "signbit"),
    "tanh": _float("tanh({0})", "tanh"),
    "sigmoid": _float("tl.sigmoid({0})"), "silu": _float("{0} * tl.sigmoid({0})"),
    "erf": _float("tl.math.erf({0})"), "erfc": _float("1.0 - tl.math.erf({0})"),
    "gelu": _float("0.5 * {0} * (1.0 + tl.math.erf({0} * 0.7071067811865476))"),
    "gelu_tanh": _float("0.5 * {0} * (1.0 + tanh(0.7978845608028654 * ({0} + 0.044715 * {0} * {0} * {0})))",
                        "tanh"),
    "pow": _float("pow({0}, {1})", "pow"),
    # special functions: shim helpers that follow eager's float32 algorithms (codegen/shim.py), fp32-accurate
    "lgamma": _float("lgamma({0})", "lgamma"), "digamma": _float("digamma({0})", "digamma", "signbit"),
    "trigamma": _float("trigamma({0})", "trigamma"), "zeta": _float("zeta({0}, {1})", "zeta", "zeta_powi", "pow"),
    "erfinv": _float("erfinv({0})", "erfinv"), "erfcx": _float("erfcx({0})", "erfcx"),
    "ndtri": _float("ndtri({0})", "ndtri"),
    "i0": _float("bessel_i0({0})", "bessel_i0"), "i0e": _float("bessel_i0e({0})", "bessel_i0e"),
    "i1": _float("bessel_i1({0})", "bessel_i1"), "i1e": _float("bessel_i1e({0})", "bessel_i1e"),
    "modified_bessel_i1": _float("modified_bessel_i1({0})", "modified_bessel_i1"),
    "modified_bessel_k0": _float("bessel_k0({0}, False)", "bessel_k0", "bessel_k_join", "bessel_i0"),
    "scaled_modified_bessel_k0": _float("bessel_k0({0}, True)", "bessel_k0", "bessel_k_join", "bessel_i0"),
    "modified_bessel_k1": _float("bessel_k1({0}, False)", "bessel_k1", "bessel_k_join", "modified_bessel_i1"),
    "scaled_modified_bessel_k1": _float("bessel_k1({0}, True)", "bessel_k1", "bessel_k_join", "modified_bessel_i1"),
    "bessel_j0": _float("bessel_j0({0})", "bessel_j0"), "bessel_j1": _float("bessel_j1({0})", "bessel_j1"),
    "bessel_y0": _float("bessel_y0({0})", "bessel_y0", "bessel_j0"),
    "bessel_y1": _float("bessel_y1({0})", "bessel_y1", "bessel_j1"),
    "spherical_bessel_j0": _float("spherical_bessel_j0({0})", "spherical_bessel_j0"),
    "airy_ai": _float("airy_ai({0})", "airy_ai"),
    **{name: _float(f"{helper}({{0}}, {{1}})", helper, "cheb_rec", "poly_n", "poly_even", "acos_f", "atan", "atan2",
                    "trunc")
       for name, helper in (("chebyshev_polynomial_t", "chebyshev_t"), ("chebyshev_polynomial_u", "chebyshev_u"),
                            ("chebyshev_polynomial_v", "chebyshev_v"), ("chebyshev_polynomial_w", "chebyshev_w"),
                            ("shifted_chebyshev_polynomial_t", "shifted_chebyshev_t"),
                            ("shifted_chebyshev_polynomial_u", "shifted_chebyshev_u"),
                            ("shifted_chebyshev_polynomial_v", "shifted_chebyshev_v"),
                            ("shifted_chebyshev_polynomial_w", "shifted_chebyshev_w"))},
    "hermite_polynomial_h": _float("hermite_h({0}, {1}, True)", "hermite_h", "poly_n", "trunc"),
    "hermite_polynomial_he": _float("hermite_h({0}, {1}, False)", "hermite_h", "poly_n", "trunc"),
    "laguerre_polynomial_l": _float("laguerre_l({0}, {1})", "laguerre_l", "poly_n", "trunc"),
    "legendre_polynomial_p": _float("legendre_p({0}, {1})", "legendre_p", "poly_n", "poly_even", "trunc"),
    # predicates
    "isnan": {FLOAT: _t("{0} != {0}"), INT: _t("{0} != {0}"), BOOL: _t("{0} != {0}")},
    "signbit": {FLOAT: _t("signbit({0})", "signbit"), INT: _t("{0} < 0"), BOOL: _t("{0} != {0}")},
    "isinf": {FLOAT: _t("tl.abs({0}) == float('inf')"), INT: _t("{0} != {0}"), BOOL: _t("{0} != {0}")},
    "logical_not": _any("{0} == 0"),
    "bitwise_not": {INT: _t("~{0}"), BOOL: _t("{0} == 0")},
    # rendered by codegen's own code, for every kind: dtype conversions and x ** constant
    "cast": None, "round_to": None, "pow_scalar": None,
}
SPECIAL = frozenset(name for name, entry in OPS.items() if entry is None)
SPECIAL_FUNCTIONS = frozenset({
    "lgamma", "digamma", "trigamma", "zeta", "erfinv", "erfcx", "ndtri", "i0", "i0e", "i1", "i1e", "modified_bessel_i1",
    "modified_bessel_k0", "scaled_modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k1", "bessel_j0",
    "bessel_j1", "bessel_y0", "bessel_y1", "spherical_bessel_j0", "airy_ai", "chebyshev_polynomial_t",
    "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"})
# computed to fp32 accuracy by the shim (a polynomial), so float64 tensors keep ATen's exact result
FP32_ACCURATE = frozenset({"atan", "atan2", "asin", "acos"}) | SPECIAL_FUNCTIONS


def kind_of(dtype):
    if dtype == torch.bool:
        return BOOL
    return FLOAT if dtype.is_floating_point else INT


def operand_kind(dtypes):
    """The kind an op is rendered for: its widest operand (float > int > bool; `where`'s condition is bool)."""
    kinds = {kind_of(d) for d in dtypes}
    return FLOAT if FLOAT in kinds else INT if INT in kinds else BOOL


# Ops a few instructions compute (arithmetic, comparisons, selects, one-instruction roots). Every other op is a
# library routine of tens of instructions (transcendentals, special functions): evaluated once per element of a
# broadcast it costs compute, not bytes, which is why the scheduler stores such a value rather than have a larger
# kernel recompute it (schedule.recompute_or_store).
SHORT_OPS = frozenset({
    "abs", "add", "and", "bitwise_not", "cast", "ceil", "copysign", "div", "eq", "floor", "floordiv", "fmod",
    "frac", "ge", "gt", "isinf", "isnan", "le", "logical_not", "lt", "maximum", "minimum", "mul", "ne", "neg", "or",
    "reciprocal", "relu", "remainder", "round", "round_to", "rsqrt", "sign", "signbit", "sqrt", "square", "sub",
    "trunc", "truncdiv", "where", "xor",
})


def is_long(name):
    """Whether math op `name` is a library routine of many instructions rather than a few (SHORT_OPS)."""
    return name not in SHORT_OPS


def template(name, kind):
    """(format string, helper names) for op `name` on operands of `kind`, or None if it is not rendered."""
    entry = OPS.get(name)
    if not entry:
        return None
    return entry.get(kind) or entry.get(ANY)


def refusal(op):
    """None when codegen renders `op` (an ir.Op), else why not."""
    name = op.name
    if name not in OPS:
        return f"no kernel code for math op {name}"
    kind = operand_kind([a.dtype for a in op.args])
    if name == "pow_scalar":   # the exponent is a float constant; the base decides
        exponent = float(op.args[1].value)
        if kind_of(op.args[0].dtype) != FLOAT and not (exponent == int(exponent) and 0 <= exponent <= 4):
            return f"integer pow with exponent {exponent:g}"
        return None
    if name in SPECIAL:
        return None
    if name in FP32_ACCURATE and any(a.dtype == torch.float64 for a in op.args):
        return f"{name} in float64 (brrr's kernel code is fp32-accurate)"
    if template(name, kind) is None:
        return f"no kernel code for {name} on {kind} operands"
    return None
