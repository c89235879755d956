"""Timing helpers: interval union, per-op profiler ranges, busy and wall time of a CPU step."""

import torch

from brrr.analyze.capture import capture
from brrr.analyze.step import Step
from brrr.analyze.timing import device_busy_time, median_times, op_times, profiled, union_seconds, wall_time


def test_union_counts_overlaps_once():
    assert union_seconds([]) == 0
    assert union_seconds([(0, 2), (1, 3), (5, 6)]) == 4
    assert union_seconds([(5, 6), (0, 10)]) == 10
    assert union_seconds([(0, 1), (1, 2)]) == 2


def test_median_times_per_op():
    assert median_times([[1.0, 5.0], [3.0, 4.0], [2.0, 100.0]]) == [2.0, 5.0]


def test_every_op_of_a_cpu_step_gets_a_host_time():
    x = torch.randn(1024, 1024)
    step = Step(lambda a: (a @ a).relu().sum(), (x,))
    step()
    cpu = torch.device("cpu")
    with profiled(cpu) as prof:
        records = capture(step)
    times = op_times(prof, len(records), cpu)
    assert [r.name for r in records] == ["aten.mm.default", "aten.relu.default", "aten.sum.default"]
    assert all(t > 0 for t in times)
    busy, wall = device_busy_time(step, cpu), wall_time(step, cpu)
    assert 0 < busy and 0 < wall
    # the matmul (2.1 GFLOP) dominates the step; relu and sum touch 4 MB each
    assert times[0] > times[1] and times[0] > times[2]
