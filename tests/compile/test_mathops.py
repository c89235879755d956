"""The table of math ops that lowering checks and codegen renders (brrr.compile.ir.mathops): both sides agree,
and an op codegen cannot render runs as ATen on its own instead of failing its graph."""

import ast
import string

import pytest
import torch

import brrr
from brrr.compile.codegen.shim import HELPERS
from brrr.compile.codegen.triton import Codegen
from brrr.compile.ir import mathops, nodes as ir
from brrr.compile.lowering.pointwise import BINARY, COMPARE, UNARY
from tests.compile.helpers import compiled

DTYPES = {mathops.FLOAT: torch.float32, mathops.INT: torch.int32, mathops.BOOL: torch.bool}
# Op names lowerings build directly rather than through the UNARY/BINARY/COMPARE tables
BUILT_DIRECTLY = {"add", "sub", "where", "maximum", "minimum", "gelu", "gelu_tanh", "pow_scalar", "cast",
                  "round_to", "div", "truncdiv", "floordiv", "and", "lt", "ge", "eq", "sqrt", "mul"}


def _arity(name):
    entry = mathops.OPS[name]
    fields = {f for template, _ in entry.values() for _, f, _, _ in string.Formatter().parse(template) if f}
    return len(fields)


def _op(name, kind):
    n = _arity(name)
    dtypes = [DTYPES[kind]] * n
    if name == "where":
        dtypes[0] = torch.bool
    args = [ir.Const(1, d) for d in dtypes]
    return ir.Op(name, args, DTYPES[kind]), [f"x{i}" for i in range(n)], dtypes


def test_every_op_lowering_builds_is_in_the_table():
    names = set(UNARY.values()) | set(BINARY.values()) | set(COMPARE.values()) | BUILT_DIRECTLY
    assert names - set(mathops.OPS) == set()


@pytest.mark.parametrize("kind", [mathops.FLOAT, mathops.INT, mathops.BOOL])
@pytest.mark.parametrize("name", sorted(n for n in mathops.OPS if n not in mathops.SPECIAL))
def test_codegen_renders_exactly_what_lowering_accepts(name, kind):
    op, rendered, dtypes = _op(name, kind)
    accepted = mathops.refusal(op) is None
    assert accepted == (mathops.template(name, kind) is not None)
    cg = Codegen(None, set(), set(), {})
    if not accepted:
        with pytest.raises(NotImplementedError):
            cg.op(op, rendered, dtypes)
        return
    source = cg.op(op, rendered, dtypes)
    ast.parse(source, mode="eval")                      # a Python expression Triton can trace
    assert all(f"x{i}" in source for i in range(len(rendered)))
    assert cg.helpers <= set(HELPERS)                   # every helper it calls exists in the shim


def test_pow_scalar_refuses_integer_bases_with_other_exponents():
    base = ir.Const(3, torch.int64)
    assert mathops.refusal(ir.Op("pow_scalar", [base, ir.Const(3, torch.float64)], torch.int64)) is None
    assert "integer pow" in mathops.refusal(ir.Op("pow_scalar", [base, ir.Const(7, torch.float64)], torch.int64))


def test_ops_codegen_cannot_render_run_as_aten_with_the_right_result():
    x = torch.arange(-6, 6, dtype=torch.int64)
    f = lambda x: (x ** 5 + x ** 2) * 3  # noqa: E731   integer pow beyond 4: ATen; the rest stays fused
    torch.testing.assert_close(compiled(f)(x), f(x))
    ex = brrr.explain(f, x)
    assert [fb.op for fb in ex.fallbacks] == ["aten.pow.Tensor_Scalar"] and "integer pow" in ex.fallbacks[0].reason
    assert ex.kernels
    y = torch.linspace(-3, 3, 50, dtype=torch.float64)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(torch.atan)(y), torch.atan(y), rtol=0, atol=0)   # ATen: exact


SPECIAL_VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.41421, 2.41422, 1e-30, -1e-30, 1e30, -1e30, 7.5, -7.5,
                  float("inf"), float("-inf"), float("nan"), 1.0000001, -1.0000001]


@pytest.mark.parametrize("fn", [torch.atan, torch.asin, torch.acos], ids=lambda f: f.__name__)
def test_inverse_trigonometry_at_special_values(fn):
    x = torch.tensor(SPECIAL_VALUES + torch.linspace(-20, 20, 101).tolist())
    torch.testing.assert_close(compiled(fn)(x), fn(x), rtol=3e-7, atol=3e-7, equal_nan=True)


def test_atan2_in_every_quadrant_with_signed_zeros_and_infinities():
    v = torch.tensor(SPECIAL_VALUES)
    y, x = torch.meshgrid(v, v, indexing="ij")
    out = compiled(torch.atan2)(y, x)
    ref = torch.atan2(y, x)
    torch.testing.assert_close(out, ref, rtol=3e-7, atol=3e-7, equal_nan=True)
    assert torch.equal(torch.signbit(out[~ref.isnan()]), torch.signbit(ref[~ref.isnan()]))


@pytest.mark.parametrize("shape", [(), (7,)])
def test_pow_with_a_constant_exponent(shape):
    # x ** 5.0 calls the shim's pow with a Python float exponent (linalg.vector_norm(ord=6)'s backward)
    x = torch.randn(shape)
    for f in (lambda x: x ** 5.0, lambda x: torch.pow(x, -3.0), lambda x: x.abs() ** 0.3):
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(f)(x), f(x))


@pytest.mark.parametrize("fn", [torch.acosh, torch.asinh, torch.atanh], ids=lambda f: f.__name__)
def test_inverse_hyperbolics_at_special_values(fn):
    x = torch.tensor(SPECIAL_VALUES + torch.linspace(-20, 20, 101).tolist() + [1.0001, 1e-4, -1e-6, 1e20, -1e20])
    torch.testing.assert_close(compiled(fn)(x), fn(x), rtol=2e-6, atol=1e-6, equal_nan=True)


def test_copysign_hypot_signbit_ldexp_round_decimals():
    v = torch.tensor(SPECIAL_VALUES)
    a, b = torch.meshgrid(v, v, indexing="ij")
    for f in (torch.copysign, torch.hypot, lambda a, b: torch.signbit(a) ^ torch.signbit(b),
              lambda a, b: torch.ldexp(a, b.clamp(-20, 20).round()), lambda a, b: torch.round(a * 7.123, decimals=2),
              lambda a, b: torch.round(a * 7123.4, decimals=-2)):
        torch._dynamo.reset()
        out, ref = compiled(f)(a, b), f(a, b)
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6, equal_nan=True)
        if ref.is_floating_point():
            same = ~ref.isnan()
            assert torch.equal(torch.signbit(out[same]), torch.signbit(ref[same]))


def test_shim_helpers_take_a_constant_operand():
    # 2.0 ** x (ldexp's and logaddexp2's backward) hands the shim's pow a constant base: helpers get tensors
    x = torch.randn(7)
    for f in (lambda x: torch.pow(2.0, x), lambda x: torch.copysign(x, -1.0), lambda x: torch.pow(-2.0, x.round())):
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(f)(x), f(x))
