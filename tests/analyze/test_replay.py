"""A step traced before is timed again without the tracer: its ops matched to the profiler's ATen events."""

import sys

import pytest
import torch
from torch.autograd import DeviceType

from brrr.analyze.capture import STEP_RANGE, record_step
from brrr.analyze.replay import expected_ops, match_ops
from brrr.analyze.step import Step
from brrr.analyze.timing import attribute_kernels, session_events
from tests.analyze.test_timing import FakeKinetoEvent, fake_profile

analyze_module = sys.modules["brrr.analyze"]
CPU, GPU = DeviceType.CPU, DeviceType.CUDA


@pytest.fixture
def replays_on_cpu(monkeypatch):
    """analyze() replays on CPU as it does on CUDA, and counts its traced steps and replays."""
    counts = {"traced": 0, "replayed": 0, "replay failed": 0}
    monkeypatch.setattr(analyze_module, "REPLAY_DEVICES", ("cuda", "cpu"))
    traced, replayed = analyze_module._traced_run, analyze_module._replayed_run

    def counting_traced(*args):
        counts["traced"] += 1
        return traced(*args)

    def counting_replayed(*args):
        timed = replayed(*args)
        counts["replayed" if timed is not None else "replay failed"] += 1
        return timed

    monkeypatch.setattr(analyze_module, "_traced_run", counting_traced)
    monkeypatch.setattr(analyze_module, "_replayed_run", counting_replayed)
    return counts


def _record_facts(analysis):
    return [(op.name, op.module, op.phase, op.op_class, op.flops, op.bytes_read, op.bytes_written, op.inputs_from,
             op.consumers, op.is_step_output, op.input_shapes) for op in analysis.ops]


def test_a_known_inference_step_is_timed_without_the_tracer(replays_on_cpu, cpu_ceilings):
    from brrr.examples import bert

    torch.manual_seed(0)
    model, inputs = bert(layers=2, hidden=64, heads=2, batch=2, seq=8)
    model.eval()
    first = analyze_module.analyze(model, *inputs, ceilings=cpu_ceilings, profile_runs=1)
    assert replays_on_cpu == {"traced": 1, "replayed": 0, "replay failed": 0}
    second = analyze_module.analyze(model, *inputs, ceilings=cpu_ceilings, profile_runs=1)
    assert replays_on_cpu == {"traced": 1, "replayed": 1, "replay failed": 0}
    # the same ops, modules, costs and producer links; every op that runs a kernel has its own time again
    assert _record_facts(second) == _record_facts(first)
    assert all(op.time_s > 0 for op in second.ops if op.op_class != "view")
    # extra profiled runs replay the trace the analysis just took
    analyze_module.analyze(model, *inputs, ceilings=cpu_ceilings, profile_runs=3)
    assert replays_on_cpu == {"traced": 1, "replayed": 4, "replay failed": 0}


def test_a_step_whose_shapes_changed_is_traced_again_and_from_then_on(replays_on_cpu, cpu_ceilings):
    x = torch.linspace(-1, 1, 64)

    def positives(x):  # the shapes inside depend on the values: the step signature can't tell
        return x[x > 0].exp()

    analyze_module.analyze(positives, x, ceilings=cpu_ceilings, profile_runs=1)
    x.copy_(torch.linspace(-1, 3, 64))  # more positive values: exp reads a longer tensor
    again = analyze_module.analyze(positives, x, ceilings=cpu_ceilings, profile_runs=1)
    assert replays_on_cpu == {"traced": 2, "replayed": 0, "replay failed": 1}
    [exp] = [op for op in again.ops if op.name == "aten.exp.default"]
    assert exp.bytes_read == 4 * int((x > 0).sum())
    analyze_module.analyze(positives, x, ceilings=cpu_ceilings, profile_runs=1)
    assert replays_on_cpu == {"traced": 3, "replayed": 0, "replay failed": 1}  # no more replays of this step


def test_training_steps_are_not_replayed():
    # the autograd engine's gradient accumulation reaches the dispatch mode but not the profiler
    model = torch.nn.Linear(4, 4)
    step = Step(model, (torch.randn(2, 4),), train=True)
    assert expected_ops(record_step(step, mark_ranges=False)) is None
    with torch.no_grad():
        inference = record_step(Step(model, (torch.randn(2, 4),)), mark_ranges=False)
    assert [name for _, name, _ in expected_ops(inference)] == ["aten::addmm"]


def test_real_profiler_events_match_the_traced_kernel_ops():
    from brrr.examples import gpt2

    torch.manual_seed(0)
    model, inputs = gpt2(layers=2, hidden=64, heads=2, batch=2, seq=8)
    model.eval()
    step = Step(model, inputs)
    step()
    trace = record_step(step, mark_ranges=False)
    expected = expected_ops(trace)
    timed = analyze_module._replayed_run(step, torch.device("cpu"), trace, expected)
    assert timed is not None
    times, busy, outside = timed
    kernel_ops = {index for index, _, _ in expected}
    assert all(times[i] > 0 for i in kernel_ops) and not any(times[i] for i in range(len(times)) if i not in kernel_ops)
    # a different batch runs the same ops on other shapes: no match
    other = Step(model, (inputs[0][:1],))
    assert analyze_module._replayed_run(other, torch.device("cpu"), trace, expected) is None


def _marks(events, expected):
    return session_events(fake_profile(events), {name for _, name, _ in expected})


def test_matching_skips_composites_and_what_runs_inside_a_matched_op():
    expected = [(0, "aten::_to_copy", ((4,),)), (2, "aten::copy_", ((4,), (4,))), (3, "aten::addmm", ((8,), (2, 8)))]
    events = [
        FakeKinetoEvent("aten::copy_", CPU, 1, 2, shapes=[(4,), (4,)]),     # before the step: the warm-up
        FakeKinetoEvent(STEP_RANGE, CPU, 5, 100),
        FakeKinetoEvent("aten::to", CPU, 10, 30),                           # a composite around op 0
        FakeKinetoEvent("aten::_to_copy", CPU, 11, 29, shapes=[(4,)]),
        FakeKinetoEvent("aten::copy_", CPU, 15, 28, shapes=[(4,), (4,)]),   # inside op 0: not op 2
        FakeKinetoEvent("aten::copy_", CPU, 31, 40, shapes=[(4,), (4,)]),
        FakeKinetoEvent("aten::linear", CPU, 50, 70),
        FakeKinetoEvent("aten::addmm", CPU, 52, 69, shapes=[(8,), (2, 8), ()]),  # 0-d and scalar inputs: no shape
    ]
    events_read = _marks(events, expected)
    assert match_ops(events_read.marks, expected, events_read.step) == [(11, 29, 0), (31, 40, 2), (52, 69, 3)]
    wrong_shape = expected[:2] + [(3, "aten::addmm", ((8,), (4, 8)))]
    assert match_ops(events_read.marks, wrong_shape, events_read.step) is None
    missing = expected + [(4, "aten::relu", ((2, 8),))]
    assert match_ops(_marks(events, missing).marks, missing, events_read.step) is None


def test_replayed_kernels_belong_to_the_op_whose_event_launched_them():
    expected = [(1, "aten::addmm", ((8,), (2, 8))), (3, "aten::gelu", ((2, 8),))]
    events = [
        FakeKinetoEvent("cudaLaunchKernel", CPU, 1, 2, correlation=900),    # the profiler's warm-up op
        FakeKinetoEvent(STEP_RANGE, CPU, 5, 100),
        FakeKinetoEvent("aten::linear", CPU, 10, 40),
        FakeKinetoEvent("aten::addmm", CPU, 12, 39, shapes=[(8,), (2, 8)]),
        FakeKinetoEvent("aten::empty", CPU, 13, 14),                        # not a traced name: not read
        FakeKinetoEvent("cudaLaunchKernel", CPU, 20, 21, correlation=901),
        FakeKinetoEvent("cuLaunchKernel", CPU, 42, 43, correlation=902),    # between ops: compiled code
        FakeKinetoEvent("aten::gelu", CPU, 50, 60, shapes=[(2, 8)]),
        FakeKinetoEvent("cudaLaunchKernel", CPU, 55, 56, correlation=903),
        FakeKinetoEvent("warmup", GPU, 3, 4, correlation=900),
        FakeKinetoEvent("gemm", GPU, 200, 1200, correlation=901),
        FakeKinetoEvent("triton_poi", GPU, 1200, 1300, correlation=902),
        FakeKinetoEvent("gelu", GPU, 1300, 1500, correlation=903),
    ]
    events_read = _marks(events, expected)
    spans = match_ops(events_read.marks, expected, events_read.step)
    times, busy, outside = attribute_kernels(events_read, spans, count=4)
    assert times == [0.0, 1000 / 1e9, 0.0, 200 / 1e9]
    assert busy == 1300 / 1e9
    assert outside == [("triton_poi", 100 / 1e9, 1)]
