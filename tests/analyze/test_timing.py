"""Timing helpers: interval union, per-op profiler ranges, busy and wall time of a CPU step."""

import os

import pytest
import torch

from brrr.analyze.capture import capture
from brrr.analyze.step import Step
from brrr.analyze.timing import device_busy_time, median_times, op_times, profiled, timed_runs, union_seconds


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
    busy, wall = device_busy_time(step, cpu), min(timed_runs(step, cpu))
    assert 0 < busy and 0 < wall
    # the matmul (2.1 GFLOP) dominates the step; relu and sum touch 4 MB each
    assert times[0] > times[1] and times[0] > times[2]


class FakeKinetoEvent:
    """The few accessors of torch's _KinetoEvent that cuda_op_times reads."""

    def __init__(self, name, device_type, start, end, correlation=0, annotation=False):
        self._v = (name, device_type, start, end, correlation, annotation)

    def name(self): return self._v[0]
    def device_type(self): return self._v[1]
    def start_ns(self): return self._v[2]
    def end_ns(self): return self._v[3]
    def duration_ns(self): return self._v[3] - self._v[2]
    def correlation_id(self): return self._v[4]
    def is_user_annotation(self): return self._v[5]


def fake_profile(events):
    from types import SimpleNamespace

    results = SimpleNamespace(events=lambda: events)
    return SimpleNamespace(kineto_results=results)


def test_cuda_kernels_are_attributed_to_the_range_that_launched_them():
    from torch.autograd import DeviceType

    from brrr.analyze.timing import cuda_op_times

    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = [
        FakeKinetoEvent("cudaLaunchKernel", cpu, 5, 6, correlation=900),  # the profiler's warm-up op
        FakeKinetoEvent("brrr#0", cpu, 10, 20), FakeKinetoEvent("aten::mm", cpu, 11, 19, correlation=7),
        FakeKinetoEvent("cudaLaunchKernel", cpu, 12, 13, correlation=901),
        FakeKinetoEvent("brrr#1", cpu, 30, 40),
        FakeKinetoEvent("cuLaunchKernelEx", cpu, 31, 32, correlation=902),
        FakeKinetoEvent("cudaMemsetAsync", cpu, 33, 34, correlation=903),
        FakeKinetoEvent("brrr#1", gpu, 0, 10_000, annotation=True),  # GPU-side annotation: not a kernel
        FakeKinetoEvent("warmup_kernel", gpu, 100, 110, correlation=900),
        FakeKinetoEvent("gemm", gpu, 200, 1200, correlation=901),
        FakeKinetoEvent("gelu", gpu, 1100, 1500, correlation=902),  # overlaps gemm: busy counts it once
        FakeKinetoEvent("memset", gpu, 1500, 1600, correlation=903),
    ]
    times, busy, outside, kernels, _ = cuda_op_times(fake_profile(events), count=2)
    assert kernels == [1, 2]
    assert times == [1000 / 1e9, (400 + 100) / 1e9]
    assert busy == (1600 - 200) / 1e9
    assert outside == []


def test_kernels_compiled_code_launched_in_the_step_count_as_busy_and_are_listed():
    from torch.autograd import DeviceType

    from brrr.analyze.capture import STEP_RANGE
    from brrr.analyze.timing import cuda_op_times

    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = [
        FakeKinetoEvent("cudaLaunchKernel", cpu, 5, 6, correlation=900),  # the profiler's warm-up op
        FakeKinetoEvent(STEP_RANGE, cpu, 8, 60),
        FakeKinetoEvent("cuLaunchKernel", cpu, 9, 10, correlation=904),  # a Triton kernel before any op
        FakeKinetoEvent("brrr#0", cpu, 10, 20),
        FakeKinetoEvent("cudaLaunchKernel", cpu, 12, 13, correlation=901),
        FakeKinetoEvent("cuLaunchKernel", cpu, 25, 26, correlation=902),  # between ops: compiled code
        FakeKinetoEvent("warmup_kernel", gpu, 100, 110, correlation=900),
        FakeKinetoEvent("triton_red_fused_0", gpu, 150, 190, correlation=904),
        FakeKinetoEvent("gemm", gpu, 200, 1200, correlation=901),
        FakeKinetoEvent("triton_poi_fused_gelu_1", gpu, 1200, 1500, correlation=902),
    ]
    times, busy, outside, kernels, timeline = cuda_op_times(fake_profile(events), count=1)
    assert kernels == [1]
    assert times == [1000 / 1e9]
    assert busy == (40 + 1000 + 300) / 1e9
    assert outside == [("triton_red_fused_0", 40 / 1e9, -1), ("triton_poi_fused_gelu_1", 300 / 1e9, 0)]
    # kept for the trace: the op's range on the host, its kernel on the device, and the compiled code's kernels
    # numbered as their records will be (in launch order)
    assert sorted(timeline, key=lambda s: tuple(map(str, s))) == sorted([("host", 10, 20, 0, None, ""), ("device", 200, 1200, 0, None, "gemm"),
                                       ("device", 150, 190, None, 0, "triton_red_fused_0"),
                                       ("device", 1200, 1500, None, 1, "triton_poi_fused_gelu_1")],
                                      key=lambda s: tuple(map(str, s)))


def test_unlinkable_kernels_fall_back():
    from torch.autograd import DeviceType

    from brrr.analyze.timing import cuda_op_times

    events = [FakeKinetoEvent("brrr#0", DeviceType.CPU, 10, 20),
              FakeKinetoEvent("gemm", DeviceType.CUDA, 200, 1200, correlation=5)]
    assert cuda_op_times(fake_profile(events), count=1) is None


def test_cupti_is_torn_down_after_profiling_unless_the_user_chose(monkeypatch):
    from brrr.analyze import timing

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert timing.tear_down_cupti_after() is False
    assert "TEARDOWN_CUPTI" not in os.environ          # CUDA graphs could crash CUPTI re-init before 12.6
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert timing.tear_down_cupti_after() is True      # profiled() then launches the kernel that completes it
    assert os.environ["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    assert timing.tear_down_cupti_after() is False
    assert os.environ["TEARDOWN_CUPTI"] == "0"


def test_the_cli_leaves_cupti_attached_since_its_process_ends(monkeypatch, tmp_path):
    from brrr.cli import main

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    assert main(["analyze", "--example", "mlp", "--batch", "4", "--json", str(tmp_path / "a.json")]) == 0
    assert os.environ["TEARDOWN_CUPTI"] == "0"


def test_analyze_inside_a_user_profiler_is_a_clear_error():
    import brrr
    from brrr.errors import BrrrError

    with torch.profiler.profile():
        with pytest.raises(BrrrError, match="outside torch.profiler"):
            brrr.analyze(torch.nn.Linear(8, 8), torch.randn(4, 8))


def test_record_function_is_on_again_after_a_traced_step_that_raised():
    from brrr.analyze.timing import _kineto_events
    from brrr.errors import BrrrError

    def broken(a):
        (a * 2).relu()
        raise ValueError("boom")

    cpu = torch.device("cpu")
    with profiled(cpu):
        with pytest.raises(BrrrError, match="boom"):
            capture(Step(broken, (torch.randn(4),)))
    with profiled(cpu) as prof:
        torch.randn(4).relu()
    assert "aten::relu" in [e.name() for e in _kineto_events(prof)]


def test_device_timing_puts_no_range_around_ops_that_launch_no_kernel():
    from brrr.analyze.capture import RANGE_PREFIX, record_step
    from brrr.analyze.timing import _kineto_events

    step = Step(lambda a: (a.view(64) + 1).unsqueeze(0).relu(), (torch.randn(8, 8),))
    step()
    cpu = torch.device("cpu")
    with profiled(cpu) as prof:
        records = record_step(step, range_kernel_free_ops=False).records()
    ranged = {int(e.name()[len(RANGE_PREFIX):]) for e in _kineto_events(prof) if e.name().startswith(RANGE_PREFIX)}
    assert [r.name for r in records] == [
        "aten.view.default", "aten.add.Tensor", "aten.unsqueeze.default", "aten.relu.default"]
    assert ranged == {1, 3}


def test_a_plain_run_during_which_dynamo_compiled_is_no_wall_time_sample(monkeypatch):
    import time

    import brrr.analyze.timing as timing

    compiles, runs = [0], []

    def step(seconds):
        runs.append(seconds)
        if seconds > 0.02:  # the slow run is the one that compiles
            compiles[0] += 1
        time.sleep(seconds)

    monkeypatch.setattr(timing, "dynamo_frames_compiled", lambda: compiles[0])
    durations = iter([0.05, 0.002])
    samples = timing.timed_runs(lambda: step(next(durations)), torch.device("cpu"))
    assert len(samples) == 1 and samples[0] < 0.02
    assert len(runs) == 2
    # a step that compiles every time is what it is: after two more tries its run counts
    runs.clear()
    assert min(timing.timed_runs(lambda: step(0.03), torch.device("cpu"))) >= 0.03
    assert len(runs) == 3


def test_dynamo_compiles_are_counted():
    from brrr.analyze.timing import dynamo_frames_compiled

    fn = torch.compile(lambda a: a.sin() + 1, backend="eager")
    before = dynamo_frames_compiled()
    fn(torch.randn(3))
    assert dynamo_frames_compiled() > before
    after = dynamo_frames_compiled()
    fn(torch.randn(3))
    assert dynamo_frames_compiled() == after  # a cache hit compiles nothing


def _timed_runs(monkeypatch, durations):
    """timed_runs' clock replaced: each run's 'seconds' come from `durations`; returns the list of runs made."""
    import brrr.analyze.timing as timing

    runs, clock = [], iter(durations)

    def fake_time_once(fn, device):
        fn()
        runs.append(1)
        return next(clock)

    monkeypatch.setattr(timing, "time_once", fake_time_once)
    return runs


def test_a_run_as_fast_as_the_known_warm_time_is_the_wall_time(monkeypatch):
    import brrr.analyze.timing as timing

    cpu = torch.device("cpu")
    runs = _timed_runs(monkeypatch, [1.04e-3, 0.9e-3])
    assert timing.timed_runs(lambda: None, cpu, runs=2, warm_s=1e-3) == [1.04e-3] and len(runs) == 1
    # slower than the known time by more than the tolerance: maybe cold, so the second run is taken
    runs = _timed_runs(monkeypatch, [1.2e-3, 1.01e-3])
    assert timing.timed_runs(lambda: None, cpu, runs=2, warm_s=1e-3) == [1.2e-3, 1.01e-3] and len(runs) == 2
    # nothing known: the warm-up run and one more
    runs = _timed_runs(monkeypatch, [1.0e-3, 0.9e-3])
    assert timing.timed_runs(lambda: None, cpu, runs=2) == [1.0e-3, 0.9e-3] and len(runs) == 2


def test_the_wall_time_takes_more_runs_while_they_still_come_down(monkeypatch):
    import brrr.analyze.timing as timing

    cpu = torch.device("cpu")
    # a host-bound step coming down over its first runs: runs until one no longer beats the best before it
    runs = _timed_runs(monkeypatch, [9e-3, 5e-3, 3e-3, 2.95e-3, 1e-3])
    assert timing.settled_runs(lambda: None, cpu, runs=2) == [9e-3, 5e-3, 3e-3, 2.95e-3] and len(runs) == 4
    # a steady step: the two runs it always took
    runs = _timed_runs(monkeypatch, [1e-3, 1.02e-3, 0.5e-3])
    assert timing.settled_runs(lambda: None, cpu, runs=2) == [1e-3, 1.02e-3]
    # at most MAX_SETTLING_RUNS, and none once they took SETTLING_BUDGET_S together
    runs = _timed_runs(monkeypatch, [2.0 ** -k * 1e-3 for k in range(20)])
    assert len(timing.settled_runs(lambda: None, cpu, runs=2)) == timing.MAX_SETTLING_RUNS
    runs = _timed_runs(monkeypatch, [0.8, 0.4, 0.2])
    assert timing.settled_runs(lambda: None, cpu, runs=2) == [0.8, 0.4]
    # a run as fast as the known warm time is still the wall time alone
    runs = _timed_runs(monkeypatch, [1.0e-3, 0.5e-3])
    assert timing.settled_runs(lambda: None, cpu, runs=2, warm_s=1e-3) == [1.0e-3]


def test_a_fast_run_that_grew_the_allocator_or_compiled_is_not_warm(monkeypatch):
    import brrr.analyze.timing as timing

    cpu = torch.device("cpu")
    reserved = iter(range(100))  # the allocator grows during every run
    monkeypatch.setattr(timing, "_reserved_bytes", lambda device: next(reserved))
    runs = _timed_runs(monkeypatch, [1e-3, 1e-3])
    assert timing.timed_runs(lambda: None, cpu, runs=2, warm_s=1e-3) == [1e-3, 1e-3] and len(runs) == 2
    monkeypatch.setattr(timing, "_reserved_bytes", lambda device: 0)
    compiles = iter(range(100))  # Dynamo compiles during every run: after two skipped, runs count but aren't warm
    monkeypatch.setattr(timing, "dynamo_frames_compiled", lambda: next(compiles))
    runs = _timed_runs(monkeypatch, [1e-3] * 4)
    assert timing.timed_runs(lambda: None, cpu, runs=2, warm_s=1e-3) == [1e-3, 1e-3] and len(runs) == 4


def test_known_steps_are_kept_per_model_and_step_signature():
    import gc

    from brrr.analyze.step import KnownSteps

    known = KnownSteps()
    model = torch.nn.Linear(4, 4)
    step = Step(model, (torch.randn(2, 4),))
    assert known.get(step).wall_s is None
    known.get(step).wall_s = 1e-3

    class Walls:  # the wall time known for a step, None when nothing is
        def get(self, step):
            return known.get(step).wall_s

    walls = Walls()
    assert walls.get(Step(model, (torch.randn(2, 4),))) == 1e-3       # same model, same kind of input
    assert walls.get(Step(model, (torch.randn(3, 4),))) is None       # another shape
    assert walls.get(Step(model, (torch.randn(2, 4).t().contiguous().t(),))) is None  # another layout
    assert walls.get(Step(model, (torch.randn(2, 4, dtype=torch.float64),))) is None
    assert walls.get(Step(model, (torch.randn(2, 4),), train=True)) is None
    assert walls.get(Step(torch.nn.Linear(4, 4), (torch.randn(2, 4),))) is None  # another model object
    cudnn = torch.backends.cudnn
    with cudnn.flags(enabled=cudnn.enabled, benchmark=not cudnn.benchmark, deterministic=cudnn.deterministic,
                     allow_tf32=cudnn.allow_tf32):
        assert walls.get(step) is None                                  # cuDNN would autotune afresh
    with torch.no_grad():
        assert walls.get(step) is None                                  # another grad mode
    assert walls.get(step) == 1e-3
    model.eval()
    assert walls.get(step) is None                                      # its mode changed
    model.train()
    model.double()
    assert walls.get(Step(model, (torch.randn(2, 4, dtype=torch.float64),))) is None  # its dtype changed
    # nothing is kept alive or remembered for a model that is gone
    del model, step
    gc.collect()
    assert len(known._by_model) == 0


def test_known_steps_skip_what_they_cannot_key_and_keep_the_latest_signatures():
    from brrr.analyze.step import KnownSteps

    known = KnownSteps()
    unhashable = Step(lambda x, opts: x, (torch.randn(2), {"a": {1, 2}}))  # a set among the inputs
    assert known.get(unhashable) is None
    no_weakref = Step(torch.Tensor.relu, (torch.randn(2),))   # a method descriptor: no weak reference to it
    assert known.get(no_weakref) is None
    model = lambda x, opts: x  # noqa: E731
    hashable = Step(model, (torch.randn(2), {"a": [1, 2]}))   # lists and dicts are keyed by value
    known.get(hashable).wall_s = 1e-3
    assert known.get(Step(model, (torch.randn(2), {"a": [1, 2]}))).wall_s == 1e-3
    for n in range(3, 3 + KnownSteps.MAX_PER_MODEL):          # as many other shapes: the oldest is dropped
        known.get(Step(model, (torch.randn(n), {"a": [1, 2]}))).wall_s = n
    assert known.get(hashable).wall_s is None
    assert known.get(Step(model, (torch.randn(4), {"a": [1, 2]}))).wall_s == 4


def test_a_profiler_session_keeps_kineto_trace_points_off_stderr(capfd):
    # Kineto's C++ prints "USDT:... profiler_start" / "profiler_stop" on descriptor 2 as a session starts and
    # stops; other lines written there in that window still reach the user
    from brrr.analyze.timing import without_native_lines
    with profiled(torch.device("cpu")):
        torch.ones(3).add_(1)
    with without_native_lines("USDT:"):
        os.write(2, b"USDT: a trace point\na real warning\n")
    err = capfd.readouterr().err
    assert "USDT" not in err and "a real warning" in err
