import pytest

from brrr.experiments.knee import (approach_knee, grows_in_proportion, overhead_bound_batch, runtime_knee,
                                   scaling_ratios)

REPEATS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_runtime_knee_finds_first_growth_past_the_flat_region():
    times = [1.0, 1.0, 1.02, 0.98, 1.05, 1.1, 1.6, 3.2, 6.4]
    assert runtime_knee(REPEATS, times) == 64


def test_runtime_knee_ignores_one_slow_first_point():
    times = [1.5, 1.0, 1.0, 1.0, 1.0, 1.2, 2.0, 4.0, 8.0]
    assert runtime_knee(REPEATS, times) == 64


def test_runtime_knee_none_when_flat_and_skips_failed_points():
    assert runtime_knee(REPEATS, [1.0] * 9) is None
    assert runtime_knee([1, 2, 4], [1.0, None, 2.0]) == 4
    with pytest.raises(ValueError):
        runtime_knee([1, 2], [1.0])


def test_approach_knee_against_a_ceiling():
    rates = [1, 2, 4, 8, 16, 30, 40, 45, 46]
    assert approach_knee(REPEATS, rates, ceiling=50, fraction=0.5) == 32
    assert approach_knee(REPEATS, rates, ceiling=None) is None


def test_scaling_and_stop_rule():
    assert scaling_ratios([1.0, 1.1, 2.2]) == pytest.approx([1.1, 2.0])
    assert not grows_in_proportion([1.0, 1.1, 2.0])          # one doubling at >= 1.8 is not enough
    assert grows_in_proportion([1.0, 1.1, 2.0, 3.9])         # two in a row
    assert not grows_in_proportion([1.0, 1.9, 2.5, 4.9])     # not consecutive at the end


def test_overhead_bound_batch():
    batches = [1, 2, 4, 8, 16, 32, 64]
    assert overhead_bound_batch(batches, [1.0, 1.0, 1.05, 1.1, 1.5, 2.9, 5.8]) == 8
    assert overhead_bound_batch(batches, [1.0, 1.9, 3.8, 7.6, 15, 30, 60]) is None   # never flat
    assert overhead_bound_batch(batches, [1.0] * 7) == 64                             # flat throughout
    assert overhead_bound_batch(batches, [1.0, 1.9, 1.9, 1.95, 2.0, 3.9, 7.8]) == 1  # one jump is not "never"
    assert overhead_bound_batch(batches, [1.2, 1.0, 1.0, 1.1, 1.4, 2.8, 5.6]) == 8   # running minimum as base
