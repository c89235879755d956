"""Half-precision results round to nearest even, as eager does: explicit casts and stores of fp32 values into
bfloat16/float16 buffers, also under the Triton interpreter (whose own fp32 -> bf16 cast truncates)."""

import pytest
import torch

from tests.compile.helpers import compiled

# values whose bfloat16/float16 rounding truncation gets wrong: halfway cases (ties to even), values just
# above a halfway point, the largest finite values (3.0e38 -> 3.0041e38, not 2.9908e38) and overflow to inf
EDGES = torch.tensor([3.0e38, -3.0e38, 3.3961e38, 3.4e38, 1.00390625, 1.01171875, 1.0039063, -1.0039063,
                      65519.0, 65520.0, 1.0004883, 2.0 ** -130, -0.0, float("inf"), float("nan"), 1e-8])


def assert_same_bits(out, ref):
    """the same half-precision numbers, bit for bit (any NaN matches any NaN)"""
    nan = ref.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(out[~nan].view(torch.int16), ref[~nan].view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_casts_round_to_nearest_even(dtype):
    x = torch.cat([EDGES, torch.randn(1000) * 100])
    f = lambda x: (x * 1.0).to(dtype)  # noqa: E731
    assert_same_bits(compiled(f)(x), f(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stores_round_to_nearest_even(dtype):
    # half inputs computed in fp32 and stored once: the store rounds, not only an explicit cast
    a = torch.randn(4096).to(dtype)
    b = torch.randn(4096).to(dtype)
    out = compiled(lambda a, b: a * b + a)(a, b)
    ref = (a.float() * b.float() + a.float()).to(dtype)
    assert_same_bits(out, ref)


def test_float64_to_bfloat16_rounds_through_float32_like_eager():
    x = torch.cat([EDGES.double(), torch.randn(1000, dtype=torch.float64) * 1e5])
    f = lambda x: (x * 1.0).to(torch.bfloat16)  # noqa: E731
    assert_same_bits(compiled(f)(x), f(x))


def test_bfloat16_subnormals_load_and_round_exactly():
    x = torch.tensor([2.0 ** -130, -2.0 ** -133, 1e-39, 2.0 ** -126, 1.0]).to(torch.bfloat16)
    out = compiled(lambda x: (x * 2).float() * 0.5)(x)
    assert torch.equal(out, (x.float() * 2).to(torch.bfloat16).float() * 0.5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_bool_constant_fills_a_float_tensor_with_one(dtype):
    # fill(x, True): the literal True stored into bfloat16 was the bit pattern 1 (9.2e-41), not 1.0
    x = torch.randn(20).to(dtype)
    f = lambda x: (torch.full_like(x, True), torch.ops.aten.fill.Scalar(x, True))  # noqa: E731
    for out, ref in zip(compiled(f)(x), f(x)):
        assert torch.equal(out, ref)
