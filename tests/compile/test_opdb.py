"""The whole-op_db sweep (tests/compile/opdb.py), brrr's check against eager behind every lowering
(capture -> lower -> schedule -> codegen -> runtime, kernels in the Triton interpreter): one test per OpInfo
and dtype, forward in float32, bfloat16, float16, int64 and bool where the op has them, backward in float32
where it supports autograd; the first two samples of each, as given and as a non-contiguous copy. A wrong
result or a crash fails; ATen fallbacks pass and are recorded for benchmarks/coverage.py when
BRRR_OPDB_RECORD is set. The suite runs a cut (float16 only where an op lacks bfloat16, non-contiguous copies
only in float32; tests/compile/opdb.py says why); BRRR_OPDB_CUT=0, and benchmarks/coverage.py, run the whole
matrix."""

import pytest
import torch

from tests.compile import opdb
from tests.compile import opdb_judge as judge

CASES = opdb.cases()


@pytest.mark.parametrize("key,dtype,backward", CASES,
                         ids=[f"{k}-{d}{'-backward' if b else ''}" for k, d, b in CASES])
def test_op_matches_eager(key, dtype, backward):
    outcomes = opdb.run_case(key, dtype, backward)
    opdb.record(outcomes)
    bad = [o for o in outcomes if o.outcome in ("wrong", "crash")]
    assert not bad, "\n".join(f"sample {o.sample} {o.layout}: {o.outcome}: {o.detail}" for o in bad)


# The judge itself: it must tell a wrong result from a right one, or the sweep proves nothing.

def _draws(sample, n_draws, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([sample(g) for _ in range(n_draws)]).double()


@pytest.mark.parametrize("right,wrong", [
    (lambda g: torch.randn(200, generator=g), lambda g: torch.randn(200, generator=g) + 0.3),
    (lambda g: torch.randn(200, generator=g), lambda g: torch.randn(200, generator=g) * 1.5),
    (lambda g: (torch.rand(200, generator=g) < 0.5).double(), lambda g: (torch.rand(200, generator=g) < 0.7).double()),
    (lambda g: torch.empty(200).cauchy_(generator=g), lambda g: torch.empty(200).cauchy_(sigma=2, generator=g)),
    (lambda g: (torch.rand(50, 1, generator=g) < 0.5).double().expand(50, 10).flatten(),    # a mask per row
     lambda g: (torch.rand(50, 1, generator=g) < 0.8).double().expand(50, 10).flatten()),
    (lambda g: torch.rand(200, generator=g), lambda g: torch.rand(1, generator=g).expand(200)),   # one number
])
def test_random_judge_accepts_the_same_distribution_and_rejects_another(right, wrong):
    eager = _draws(right, judge.REFERENCE_DRAWS + judge.HELD_OUT_DRAWS, 1)
    assert judge.same_distribution(_draws(right, judge.BRRR_DRAWS, 2), eager, torch.float32) is None
    assert judge.same_distribution(_draws(wrong, judge.BRRR_DRAWS, 2), eager, torch.float32) is not None


def test_value_judge():
    y = torch.tensor([1.0, float("nan"), float("inf"), 3.0])
    assert judge.compare_one(y.clone(), y, None) is None
    assert judge.compare_one(y + torch.tensor([0, 0, 0, 1e-3]), y, None) is not None
    assert judge.compare_one(torch.tensor([1.0, 2.0, float("inf"), 3.0]), y, None) is not None     # NaN lost
    # a half-precision eager result that overflowed where brrr gives the float64 value is no standard...
    half, exact = torch.tensor([float("inf")], dtype=torch.float16), torch.tensor([60000.0], dtype=torch.float64)
    assert judge.compare_one(torch.tensor([60000.0], dtype=torch.float16), half, exact) is None
    # ...but in float32 the patterns must match
    assert judge.compare_one(torch.tensor([3e38]), torch.tensor([float("inf")]), torch.tensor([3e38]).double()) \
        is not None
    # beyond the tolerance, brrr still agrees when it is at least as close to float64 as eager is
    assert judge.compare_one(torch.tensor([1.001]), torch.tensor([1.002]), torch.tensor([1.0005]).double()) is None
    assert judge.compare_one(torch.tensor([1.001]), torch.tensor([1.002]), torch.tensor([1.002]).double()) is not None
    assert judge.compare_one(torch.tensor([1, 2]), torch.tensor([1, 3]), None) is not None
