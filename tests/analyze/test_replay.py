"""A step traced before is timed again without the tracer: its ops matched to the profiler's ATen events."""

import sys

import pytest
import torch
from torch.autograd import DeviceType

from brrr.analyze.capture import STEP_RANGE, record_step
from brrr.analyze.replay import expected_ops, match_ops
from brrr.analyze.step import KnownStep, Step
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


def test_a_step_whose_ops_changed_is_traced_again_and_from_then_on(replays_on_cpu, cpu_ceilings):
    program = {"activation": torch.exp}

    def step(x):  # which op runs is Python state the step signature can't see
        return program["activation"](x * 2)

    x = torch.randn(64)
    analyze_module.analyze(step, x, ceilings=cpu_ceilings, profile_runs=1)
    program["activation"] = torch.sin
    again = analyze_module.analyze(step, x, ceilings=cpu_ceilings, profile_runs=1)
    assert replays_on_cpu == {"traced": 2, "replayed": 0, "replay failed": 1}
    assert [op.name for op in again.ops] == ["aten.mul.Tensor", "aten.sin.default"]
    analyze_module.analyze(step, x, ceilings=cpu_ceilings, profile_runs=1)
    assert replays_on_cpu == {"traced": 3, "replayed": 0, "replay failed": 1}  # no more replays of this step


def test_a_model_resized_in_place_is_traced_again(replays_on_cpu, cpu_ceilings):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(2, 8)
    with torch.no_grad():
        analyze_module.analyze(model, x, ceilings=cpu_ceilings, profile_runs=1)
        model[0], model[2] = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)  # the same ops on other shapes
        resized = analyze_module.analyze(model, x, ceilings=cpu_ceilings, profile_runs=1)
        assert replays_on_cpu == {"traced": 2, "replayed": 0, "replay failed": 0}
        assert [op.flops for op in resized.ops if op.name == "aten.addmm.default"] == [2 * 2 * 8 * 32, 2 * 2 * 32 * 4]
        analyze_module.analyze(model, x, ceilings=cpu_ceilings, profile_runs=1)  # its new state is known now
        assert replays_on_cpu == {"traced": 2, "replayed": 1, "replay failed": 0}


def test_steps_whose_shapes_depend_on_data_are_not_replayed(replays_on_cpu, cpu_ceilings):
    def positives(x):
        return x[x > 0].exp()

    def gathered(x):  # integer indices: shapes follow the index's shape, not the data
        return x[torch.arange(4)].exp()

    x = torch.linspace(-1, 1, 64)
    for _ in range(2):
        analyze_module.analyze(positives, x, ceilings=cpu_ceilings, profile_runs=1)
    assert replays_on_cpu == {"traced": 2, "replayed": 0, "replay failed": 0}
    for _ in range(2):
        analyze_module.analyze(gathered, x, ceilings=cpu_ceilings, profile_runs=1)
    assert replays_on_cpu == {"traced": 3, "replayed": 1, "replay failed": 0}


def test_training_steps_are_not_replayed():
    # the autograd engine's gradient accumulation reaches the dispatch mode but not the profiler
    model = torch.nn.Linear(4, 4)
    step = Step(model, (torch.randn(2, 4),), train=True)
    assert expected_ops(record_step(step, mark_ranges=False)) is None
    with torch.no_grad():
        inference = record_step(Step(model, (torch.randn(2, 4),)), mark_ranges=False)
    assert expected_ops(inference) == [(1, "aten::addmm")]  # op 0: the weight's transpose (a view)


def _known(step):
    trace = record_step(step, mark_ranges=False)
    return KnownStep(trace=trace, expected=expected_ops(trace))


def test_real_profiler_events_match_the_traced_kernel_ops():
    from brrr.examples import gpt2

    torch.manual_seed(0)
    model, inputs = gpt2(layers=2, hidden=64, heads=2, batch=2, seq=8)
    model.eval()
    step = Step(model, inputs)
    step()
    known = _known(step)
    times, busy, outside, _ = analyze_module._replayed_run(step, torch.device("cpu"), known)
    kernel_ops = {index for index, _ in known.expected}
    assert all(times[i] > 0 for i in kernel_ops) and not any(times[i] for i in range(len(times)) if i not in kernel_ops)
    # a step that runs other ops: no match
    other = _known(Step(lambda ids: model(ids).last_hidden_state.softmax(-1), inputs))
    assert analyze_module._replayed_run(step, torch.device("cpu"), other) is None


def _marks(events, expected):
    return session_events(fake_profile(events), {name for _, name in expected})


def test_matching_skips_composites_and_what_runs_inside_a_matched_op():
    expected = [(0, "aten::_to_copy"), (2, "aten::copy_"), (3, "aten::addmm")]
    events = [
        FakeKinetoEvent("aten::copy_", CPU, 1, 2),      # before the step: the profiler's warm-up
        FakeKinetoEvent(STEP_RANGE, CPU, 5, 100),
        FakeKinetoEvent("aten::to", CPU, 10, 30),       # a composite around op 0
        FakeKinetoEvent("aten::_to_copy", CPU, 11, 29),
        FakeKinetoEvent("aten::copy_", CPU, 15, 28),    # inside op 0: not op 2
        FakeKinetoEvent("aten::copy_", CPU, 31, 40),
        FakeKinetoEvent("aten::linear", CPU, 50, 70),
        FakeKinetoEvent("aten::addmm", CPU, 52, 69),
    ]
    events_read = _marks(events, expected)
    assert match_ops(events_read.marks, expected, events_read.step) == [(11, 29, 0), (31, 40, 2), (52, 69, 3)]
    missing = expected + [(4, "aten::relu")]
    assert match_ops(_marks(events, missing).marks, missing, events_read.step) is None
    assert match_ops(events_read.marks, expected + [(4, "aten::addmm")], events_read.step) is None


def _replay_events():
    """A replayed CUDA step: addmm (op 1, one kernel) inside linear, a Triton kernel between ops, gelu (op 3)."""
    return [
        FakeKinetoEvent("cudaLaunchKernel", CPU, 1, 2, correlation=900),    # the profiler's warm-up op
        FakeKinetoEvent(STEP_RANGE, CPU, 5, 100),
        FakeKinetoEvent("aten::linear", CPU, 10, 40),
        FakeKinetoEvent("aten::addmm", CPU, 12, 39),
        FakeKinetoEvent("aten::empty", CPU, 13, 14),                        # not a traced name: not read
        FakeKinetoEvent("cudaLaunchKernel", CPU, 20, 21, correlation=901),
        FakeKinetoEvent("cuLaunchKernel", CPU, 42, 43, correlation=902),    # between ops: compiled code
        FakeKinetoEvent("aten::gelu", CPU, 50, 60),
        FakeKinetoEvent("cudaLaunchKernel", CPU, 55, 56, correlation=903),
        FakeKinetoEvent("warmup", GPU, 3, 4, correlation=900),
        FakeKinetoEvent("gemm", GPU, 200, 1200, correlation=901),
        FakeKinetoEvent("triton_poi", GPU, 1200, 1300, correlation=902),
        FakeKinetoEvent("gelu", GPU, 1300, 1500, correlation=903),
    ]


def test_replayed_kernels_belong_to_the_op_whose_event_launched_them():
    expected = [(1, "aten::addmm"), (3, "aten::gelu")]
    events_read = _marks(_replay_events(), expected)
    spans = match_ops(events_read.marks, expected, events_read.step)
    times, busy, outside, kernels, _ = attribute_kernels(events_read, spans, count=4)
    assert times == [0.0, 1000 / 1e9, 0.0, 200 / 1e9]
    assert busy == 1300 / 1e9
    assert outside == [("triton_poi", 100 / 1e9, 1)]
    assert kernels == [0, 1, 0, 1]


def test_a_cuda_replay_must_launch_the_traced_kernels(monkeypatch):
    from contextlib import contextmanager
    from types import SimpleNamespace

    @contextmanager
    def fake_session(device):
        yield fake_profile(_replay_events())

    monkeypatch.setattr(analyze_module, "profiled", fake_session)
    trace = SimpleNamespace(raw=[None] * 4)
    cuda = torch.device("cuda")

    def replay(kernels, outside):
        known = KnownStep(trace=trace, expected=[(1, "aten::addmm"), (3, "aten::gelu")], kernels=kernels,
                          outside=outside)
        return analyze_module._replayed_run(lambda: None, cuda, known)

    assert replay([0, 1, 0, 1], ["triton_poi"])[:3] == ([0.0, 1000 / 1e9, 0.0, 200 / 1e9], 1300 / 1e9,
                                                    [("triton_poi", 100 / 1e9, 1)])
    assert replay([0, 2, 0, 1], ["triton_poi"]) is None   # addmm launched two kernels when traced
    assert replay([0, 1, 0, 1], []) is None               # compiled code launched no kernel when traced
