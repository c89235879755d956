import math

import torch

from brrr.bench import compare


def test_error_metrics_on_known_values():
    ref = torch.tensor([3.0, 4.0])
    err = compare.error([torch.tensor([3.0, 4.5])], [ref])
    assert err.max_abs == 0.5
    assert err.max_rel == 0.5 / 4.0
    assert math.isclose(err.norm_rel, 0.5 / 5.0)


def test_nan_where_reference_is_finite_is_infinite_error():
    err = compare.error([torch.tensor([1.0, float("nan")])], [torch.tensor([1.0, 2.0])])
    assert math.isinf(err.norm_rel)
    same_nan = compare.error([torch.tensor([1.0, float("nan")])], [torch.tensor([1.0, float("nan")])])
    assert same_nan.norm_rel == 0.0


def test_shape_or_count_mismatch_is_infinite_error():
    assert math.isinf(compare.error([torch.ones(2)], [torch.ones(3)]).norm_rel)
    assert math.isinf(compare.error([torch.ones(2)], [torch.ones(2), torch.ones(2)]).norm_rel)


def test_flatten_reads_nested_outputs():
    a, b, c = torch.ones(1), torch.zeros(1), torch.ones(2)
    assert [t.shape for t in compare.flatten_tensors({"x": a, "y": (b, [c]), "n": None})] == [a.shape, b.shape, c.shape]


def test_verdict_fp32_threshold():
    assert compare.verdict(torch.float32, compare.Error(0, 0, 9e-5)) is None
    assert compare.verdict(torch.float32, compare.Error(0, 0, 2e-4)).startswith("WRONG")


def test_verdict_half_types_use_three_times_eagers_fp64_error():
    eager64 = compare.Error(0, 0, 4e-3)
    assert compare.verdict(torch.bfloat16, compare.Error(0, 0, 1), compare.Error(0, 0, 1.1e-2), eager64) is None
    assert compare.verdict(torch.bfloat16, compare.Error(0, 0, 1), compare.Error(0, 0, 1.3e-2), eager64)
    # an eager that is near-exact does not fail everyone: floor at the dtype's epsilon
    tiny = compare.Error(0, 0, 1e-6)
    assert compare.verdict(torch.bfloat16, compare.Error(0, 0, 1), compare.Error(0, 0, 5e-3), tiny) is None
    assert compare.verdict(torch.float16, compare.Error(0, 0, 1), compare.Error(0, 0, 5e-3), tiny)
