"""The regime classifier and the run split, on synthetic figures computed by hand."""

import math

import pytest
import torch

from brrr.analyze.regimes import (achieved_fraction, classify, dominant_regime, module_regimes, op_class_table,
                                  place_ops, run_split)
from tests.analyze.synthetic import make_ceilings, make_record

PEAK, BW, LAUNCH = 1e13, 1e12, 5e-6


def test_compute_bound_matmul():
    # 2e12 FLOPs at 1e13 FLOP/s = 0.2 s; 1e9 bytes at 1e12 B/s = 1 ms: the FLOP roof is higher
    assert classify(2e12, 1e9, 0.25, PEAK, BW, LAUNCH) == "compute"


def test_bandwidth_bound_elementwise():
    # 1e8 FLOPs = 10 us; 8e8 bytes = 0.8 ms: bytes dominate
    assert classify(1e8, 8e8, 1e-3, PEAK, BW, LAUNCH) == "bandwidth"


def test_tiny_op_near_launch_latency_is_overhead():
    # 4 KB moved = 4 ns of bandwidth, but it took 6 us (about one launch): fixed cost dominates
    assert classify(1024, 4096, 6e-6, PEAK, BW, LAUNCH) == "overhead"


def test_tiny_op_that_meets_its_floor_is_not_overhead():
    # floor 15 us (1.5e7 bytes), measured 18 us: within 4 launches but the floor is most of the time
    assert classify(0, 1.5e7, 18e-6, PEAK, BW, LAUNCH) == "bandwidth"


def test_slow_large_op_is_classified_by_its_higher_roof_not_overhead():
    # far below both roofs, but 10 ms is hundreds of launch latencies: not a fixed cost
    assert classify(1e9, 1e6, 10e-3, PEAK, BW, LAUNCH) == "compute"


@pytest.mark.parametrize("flops,nbytes,time_s", [(0, 0, 0.0), (0, 0, 1e-5), (0, 0, 1.0)])
def test_no_work_is_overhead(flops, nbytes, time_s):
    assert classify(flops, nbytes, time_s, PEAK, BW, LAUNCH) == "overhead"


def test_zero_time_with_work_uses_the_roofs():
    assert classify(0, 1e6, 0.0, PEAK, BW, LAUNCH) == "bandwidth"
    assert classify(1e12, 0, 0.0, PEAK, BW, LAUNCH) == "compute"


def test_zero_ceilings_do_not_divide_by_zero():
    assert classify(1e6, 1e6, 1e-3, 0.0, 0.0, 0.0) == "overhead"
    assert classify(1e6, 1e6, 1e-3, PEAK, 0.0, LAUNCH) == "compute"


def test_achieved_fraction():
    assert achieved_fraction(1e-3, 2e-3) == pytest.approx(0.5)
    assert achieved_fraction(1e-3, 0.0) is None


def test_place_ops_uses_matmul_peak_for_contractions_and_vector_rate_otherwise():
    ceilings = make_ceilings(fp32=1e13, vector_fp32=1e12, bandwidth=1e12)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        mm = make_record(0, "contraction", flops=1e10, bytes_read=1e6, time_s=2e-3, name="aten.mm.default")
        add = make_record(1, "elementwise", flops=1e10, bytes_read=1e6, time_s=2e-3)
        place_ops([mm, add], ceilings)
    finally:
        torch.set_float32_matmul_precision(old)
    assert mm.roofline_time_s == pytest.approx(1e10 / 1e13)
    assert add.roofline_time_s == pytest.approx(1e10 / 1e12)
    assert mm.regime == add.regime == "compute"


def test_compiled_kernels_have_no_floor_and_a_regime_by_length():
    ceilings = make_ceilings(launch_latency=5e-6)
    short = make_record(0, "other", time_s=8e-6, name="triton_poi_fused_add_0", kernel=True)
    long = make_record(1, "other", time_s=40e-6, name="k3", kernel=True)
    place_ops([short, long], ceilings)
    assert (short.regime, long.regime) == ("overhead", "bandwidth")
    assert short.roofline_time_s == long.roofline_time_s == 0.0


def _split_records():
    return [
        make_record(0, "contraction", time_s=3e-3, name="aten.mm.default"),
        make_record(1, "elementwise", time_s=1e-3),
        make_record(2, "view", time_s=1e-3),
    ]


def _with_regimes(records, regimes):
    for r, regime in zip(records, regimes):
        r.regime = regime
    return records


def test_run_split_adds_up_to_wall_time():
    records = _with_regimes(_split_records(), ["compute", "bandwidth", "overhead"])
    split = run_split(records, wall_time_s=10e-3, busy_time_s=5e-3)
    # busy equals the op total: no scaling; overhead = idle 5 ms + the 1 ms overhead op
    assert split == pytest.approx({"compute": 3e-3, "bandwidth": 1e-3, "overhead": 6e-3})
    assert sum(split.values()) == pytest.approx(10e-3)


def test_run_split_scales_op_times_to_busy_and_caps_at_wall():
    records = _with_regimes(_split_records(), ["compute", "bandwidth", "overhead"])
    # profiled op times (5 ms) exceed the plain run's wall time (2.5 ms): scaled by 0.5
    split = run_split(records, wall_time_s=2.5e-3, busy_time_s=4e-3)
    assert split["compute"] == pytest.approx(1.5e-3)
    assert split["bandwidth"] == pytest.approx(0.5e-3)
    assert sum(split.values()) == pytest.approx(2.5e-3)
    assert min(split.values()) >= 0


def test_run_split_with_no_ops_or_no_time():
    assert run_split([], 1e-3, 0.0) == {"compute": 0.0, "bandwidth": 0.0, "overhead": 1e-3}
    records = _with_regimes(_split_records(), ["compute"] * 3)
    for r in records:
        r.time_s = 0.0
    assert run_split(records, 0.0, 0.0) == {"compute": 0.0, "bandwidth": 0.0, "overhead": 0.0}


def test_dominant_regime():
    assert dominant_regime({"compute": 1.0, "bandwidth": 2.0, "overhead": 0.5}) == "bandwidth"
    assert dominant_regime({"compute": 0.0, "bandwidth": 0.0, "overhead": 0.0}) == "overhead"


def test_module_regimes_group_by_module_and_pick_the_regime_with_most_time():
    records = _with_regimes([
        make_record(0, "contraction", flops=100, time_s=3e-3, module="fc1"),
        make_record(1, "elementwise", bytes_read=8, time_s=1e-3, module="fc1"),
        make_record(2, "elementwise", bytes_read=8, time_s=2e-3, module="act"),
    ], ["compute", "bandwidth", "bandwidth"])
    modules = module_regimes(records)
    assert modules["fc1"]["ops"] == 2 and modules["fc1"]["flops"] == 100
    assert modules["fc1"]["time_s"] == pytest.approx(4e-3)
    assert modules["fc1"]["regime"] == "compute"
    assert modules["act"]["regime"] == "bandwidth"


def test_op_class_table_percentages():
    records = [
        make_record(0, "contraction", flops=998, time_s=6e-3),
        make_record(1, "normalization", flops=1, time_s=3e-3),
        make_record(2, "elementwise", flops=1, time_s=1e-3),
    ]
    table = op_class_table(records)
    assert table["contraction"]["flops_pct"] == pytest.approx(99.8)
    assert table["contraction"]["time_pct"] == pytest.approx(60.0)
    assert table["normalization"]["time_pct"] == pytest.approx(30.0)
    assert table["view"] == {"ops": 0, "flops": 0, "time_s": 0.0, "flops_pct": 0.0, "time_pct": 0.0}
    assert sum(c["flops_pct"] for c in table.values()) == pytest.approx(100.0)
    assert sum(c["time_pct"] for c in table.values()) == pytest.approx(100.0)


def test_op_class_table_of_nothing_has_no_nan():
    table = op_class_table([make_record(0, "view")])
    assert all(math.isfinite(v) for c in table.values() for v in (c["flops_pct"], c["time_pct"]))
