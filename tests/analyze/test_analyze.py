"""End to end on CPU: every op captured, FLOPs matching torch's FlopCounterMode, modules, regimes, run split."""

import math
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import brrr
from brrr.analyze import Analysis, analyze
from brrr.analyze.step import loss_of
from brrr.errors import BrrrError


class OpNames(TorchDispatchMode):
    """The plainest possible op recorder, to check the analyzer misses nothing."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def reference_names(model, inputs, train):
    with OpNames() as mode:
        if train:
            for p in model.parameters():
                p.grad = None
            loss_of(model(*inputs)).backward()
        else:
            with torch.no_grad():
                model(*inputs)
    return mode.names


def reference_flops(model, inputs, train):
    with FlopCounterMode(display=False) as counter:
        if train:
            loss_of(model(*inputs)).backward()
        else:
            with torch.no_grad():
                model(*inputs)
    return counter.get_total_flops()


def contraction_flops(analysis):
    return sum(op.flops for op in analysis.ops if op.op_class == "contraction")


def check_consistent(analysis):
    """Properties every analysis has: the split adds up, class percentages sum to 100, no NaN."""
    assert analysis.wall_time_s > 0
    assert sum(analysis.regimes.values()) == pytest.approx(analysis.wall_time_s, rel=1e-9)
    assert all(v >= 0 for v in analysis.regimes.values())
    assert analysis.regime in ("compute", "bandwidth", "overhead")
    for key, total in (("flops_pct", sum(op.flops for op in analysis.ops)),
                       ("time_pct", sum(op.time_s for op in analysis.ops))):
        assert sum(c[key] for c in analysis.op_classes.values()) == pytest.approx(100.0 if total > 0 else 0.0)
    for op in analysis.ops:
        assert op.time_s >= 0 and math.isfinite(op.time_s)
        assert op.regime in ("compute", "bandwidth", "overhead")
        assert op.bytes_read >= 0 and op.bytes_written >= 0 and op.flops >= 0


def test_mlp_lists_every_op(mlp_target, mlp_analysis):
    model, inputs = mlp_target
    assert isinstance(mlp_analysis, Analysis)
    assert [op.name for op in mlp_analysis.ops] == reference_names(model, inputs, train=False)
    check_consistent(mlp_analysis)


def test_mlp_ops_carry_modules_costs_and_times(mlp_target, mlp_analysis):
    by_name = {}
    for op in mlp_analysis.ops:
        by_name.setdefault(op.name, []).append(op)
    fc1, fc2 = by_name["aten.addmm.default"]
    assert (fc1.module, fc2.module) == ("fc1", "fc2")
    assert fc1.op_class == "contraction" and fc1.flops == 2 * 64 * 128 * 128
    # fc1 reads x (64x128), the weight (128x128) and the bias; writes 64x128 floats
    assert fc1.bytes_read == 4 * (64 * 128 + 128 * 128 + 128) and fc1.bytes_written == 4 * 64 * 128
    assert fc1.input_shapes == [(128,), (64, 128), (128, 128)]
    [gelu] = by_name["aten.gelu.default"]
    assert gelu.module == "act" and gelu.op_class == "elementwise"
    assert gelu.inputs_from == [(fc1.index, 4 * 64 * 128)]
    [norm] = by_name["aten.native_layer_norm.default"]
    assert norm.module == "norm" and norm.op_class == "normalization" and norm.is_step_output
    assert all(op.time_s > 0 for op in mlp_analysis.ops if op.op_class != "view")


def test_mlp_matmul_flops_match_flop_counter(mlp_target, mlp_analysis):
    model, inputs = mlp_target
    assert contraction_flops(mlp_analysis) == reference_flops(model, inputs, train=False) == 2 * 2 * 64 * 128 * 128


@pytest.fixture
def steady_clock(monkeypatch):
    """timed_runs' runs all take 1 ms (the step still runs): whether a run counts as warm is then decided by
    compiles and allocator growth alone, not by CPU timing noise."""
    import brrr.analyze.timing as timing

    def time_once(fn, device):
        fn()
        return 1e-3

    monkeypatch.setattr(timing, "time_once", time_once)


def test_a_torch_compiled_model_runs_its_compiled_code_under_the_tracer(mlp_target, mlp_analysis, cpu_ceilings,
                                                                        steady_clock):
    # Dynamo runs eager code under an active dispatch mode unless the mode ignores compile internals: then the
    # traced step runs the compiled artifact, whose ATen calls the tracer sees
    from torch._dynamo.backends.common import aot_autograd

    model, inputs = mlp_target
    calls = []

    def counting(gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm(*args)
        return run

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=counting))
    analysis = analyze(compiled, *inputs, ceilings=cpu_ceilings, profile_runs=1)
    # a run during which Dynamo compiled is not a measurement: three plain runs (the compiling warm-up doesn't
    # count for the wall time), the traced step twice (it recompiles there: brrr's module hooks are among
    # Dynamo's guards), then the CPU busy-time step
    assert len(calls) == 6
    del calls[:]
    again = analyze(compiled, *inputs, ceilings=cpu_ceilings, profile_runs=1)
    # nothing compiles any more, and the step's first plain run is as fast as in the first analysis: one
    # plain run, the traced step, the busy-time step
    assert len(calls) == 3 and len(again.ops) == len(analysis.ops)
    assert sorted(op.name for op in analysis.ops if op.op_class != "view") == \
        sorted(op.name for op in mlp_analysis.ops if op.op_class != "view")
    assert contraction_flops(analysis) == contraction_flops(mlp_analysis)
    assert {op.module for op in analysis.ops} <= {type(model).__name__, "<step>"}
    check_consistent(analysis)


def _step_log():
    """A model that logs, per call, whether a profiler session was running."""
    calls = []

    def model(x):
        calls.append("profiled" if torch.autograd._profiler_enabled() else "plain")
        return (x * 2).exp()

    return model, calls


def test_the_wall_time_steps_run_before_the_traced_step(cpu_ceilings, steady_clock):
    # a plain step right after a CUPTI session runs slow for a while (5-10% on the H100 host): the wall time
    # is taken first, the first plain step doubling as the warm-up
    model, calls = _step_log()
    analysis = analyze(model, torch.randn(64), ceilings=cpu_ceilings, profile_runs=1)
    # then, on CPU, the profiled busy-time step; last, a host-bound step's graphs are counted (graphs.py)
    assert calls == ["plain", "plain", "profiled", "profiled", "plain"]
    assert [op.name for op in analysis.ops] == ["aten.mul.Tensor", "aten.exp.default"]
    check_consistent(analysis)


def test_a_step_analyzed_before_needs_one_wall_time_run_when_it_is_as_fast(cpu_ceilings, steady_clock):
    model, calls = _step_log()
    x = torch.randn(64)
    analyze(model, x, ceilings=cpu_ceilings, profile_runs=1)
    assert calls == ["plain", "plain", "profiled", "profiled", "plain"]   # the last counts its graphs
    calls.clear()
    analysis = analyze(model, x, ceilings=cpu_ceilings, profile_runs=1)
    assert calls == ["plain", "profiled", "profiled", "plain"]
    assert analysis.wall_time_s == 1e-3
    calls.clear()
    analyze(model, torch.randn(32), ceilings=cpu_ceilings, profile_runs=1)  # another shape: another step
    assert calls == ["plain", "plain", "profiled", "profiled", "plain"]


def test_the_last_plain_run_is_remembered_not_the_fastest(cpu_ceilings, monkeypatch):
    import brrr.analyze.timing as timing

    clock = iter([1.0e-3, 1.05e-3, 1.14e-3])  # the next analysis's first run: within 10% of the last, not the min

    def time_once(fn, device):
        fn()
        return next(clock)

    monkeypatch.setattr(timing, "time_once", time_once)
    model, calls = _step_log()
    x = torch.randn(64)
    assert analyze(model, x, ceilings=cpu_ceilings, profile_runs=1).wall_time_s == 1.0e-3
    calls.clear()
    assert analyze(model, x, ceilings=cpu_ceilings, profile_runs=1).wall_time_s == 1.14e-3
    assert calls == ["plain", "profiled", "profiled", "plain"]   # the last counts its graphs (graphs.py)


def test_a_traced_step_during_which_dynamo_compiled_is_traced_again(cpu_ceilings, monkeypatch, steady_clock):
    compiles = [0]
    model, calls = _step_log()

    def compiling_once(x):
        if torch.autograd._profiler_enabled() and compiles[0] == 0:
            compiles[0] += 1  # as Dynamo's frame counter moves when a compiled model recompiles under the tracer
        return model(x)

    monkeypatch.setattr(sys.modules["brrr.analyze"], "dynamo_frames_compiled", lambda: compiles[0])
    analysis = analyze(compiling_once, torch.randn(64), ceilings=cpu_ceilings, profile_runs=1)
    assert calls == ["plain", "plain", "profiled", "profiled", "profiled", "plain"]
    assert [op.name for op in analysis.ops] == ["aten.mul.Tensor", "aten.exp.default"]


def test_bert_inference_ops_and_flops(bert_target, cpu_ceilings):
    model, inputs = bert_target
    analysis = analyze(model, *inputs, ceilings=cpu_ceilings, profile_runs=1)
    assert [op.name for op in analysis.ops] == reference_names(model, inputs, train=False)
    assert contraction_flops(analysis) == reference_flops(model, inputs, train=False) > 0
    modules = {op.module for op in analysis.ops}
    assert "encoder.layer.0.attention.self.query" in modules
    assert "encoder.layer.1.output.LayerNorm" in modules
    assert all(op.phase == "forward" for op in analysis.ops)
    check_consistent(analysis)


def test_bert_train_step_ops_flops_and_backward_modules(bert_target, bert_train_analysis):
    model, inputs = bert_target
    analysis = bert_train_analysis
    assert analysis.train
    assert [op.name for op in analysis.ops] == reference_names(model, inputs, train=True)
    assert contraction_flops(analysis) == reference_flops(model, inputs, train=True) > 0
    backward = [op for op in analysis.ops if op.phase == "backward"]
    assert len(backward) > len(analysis.ops) / 3
    # the weight-gradient matmuls of the query projection are attributed to that module in backward
    query_mms = [op for op in backward if op.module == "encoder.layer.0.attention.self.query"
                 and op.name == "aten.mm.default"]
    assert len(query_mms) == 2
    attributed = [op for op in backward if op.op_class != "view" and op.module != "<backward>"]
    assert len(attributed) >= 0.9 * len([op for op in backward if op.op_class != "view"])
    check_consistent(analysis)


def test_public_entry_point_asks_for_the_inputs_device_ceilings(mlp_target, cpu_ceilings, monkeypatch):
    import brrr.cost.device

    asked = []

    def fake_get_ceilings(device=None, refresh=False, progress=False):
        asked.append((torch.device(device), progress))
        return cpu_ceilings

    monkeypatch.setattr(brrr.cost.device, "get_ceilings", fake_get_ceilings)
    model, inputs = mlp_target
    analysis = brrr.analyze(model, *inputs, progress=True)
    assert asked == [(torch.device("cpu"), True)]
    assert analysis.ceilings is cpu_ceilings and len(analysis.ops) == 6
    # importing the package rebinds brrr.analyze to it; it stays callable
    import brrr.analyze as package

    assert brrr.analyze is package and callable(brrr.analyze)


def test_no_inputs_is_a_clear_error(mlp_target, cpu_ceilings):
    model, _ = mlp_target
    with pytest.raises(BrrrError, match="at least one example input"):
        analyze(model, ceilings=cpu_ceilings)


def test_model_that_raises_is_a_clear_error(cpu_ceilings):
    def broken(x):
        raise ValueError("shapes don't line up")

    with pytest.raises(BrrrError, match="ValueError: shapes don't line up"):
        analyze(broken, torch.randn(3), ceilings=cpu_ceilings)


def test_train_without_differentiable_output_is_a_clear_error(cpu_ceilings):
    with pytest.raises(BrrrError, match="requires grad"):
        analyze(lambda x: x * 2, torch.randn(3), train=True, ceilings=cpu_ceilings)


def test_device_that_disagrees_with_inputs_is_a_clear_error(cpu_ceilings):
    with pytest.raises(BrrrError, match="inputs are on cpu"):
        analyze(lambda x: x * 2, torch.randn(3), device="cuda", ceilings=cpu_ceilings)


def test_nan_and_inf_outputs_do_not_break_the_analysis(cpu_ceilings):
    x = torch.tensor([float("nan"), float("inf"), 1.0, -float("inf")] * 256)
    analysis = analyze(lambda t: (t * 2).exp(), x, ceilings=cpu_ceilings, profile_runs=1)
    assert [op.name for op in analysis.ops] == ["aten.mul.Tensor", "aten.exp.default"]
    assert analysis.ops[0].bytes_read == 4 * 1024
    assert "NaN" not in analysis.to_json() and "Infinity" not in analysis.to_json()
    check_consistent(analysis)


def test_zero_size_tensors_move_no_bytes(cpu_ceilings):
    analysis = analyze(lambda t: (t + 1).relu(), torch.empty(0, 16), ceilings=cpu_ceilings, profile_runs=1)
    assert len(analysis.ops) == 2
    assert all(op.bytes == 0 and op.flops == 0 and op.intensity is None for op in analysis.ops)
    assert all(op.regime == "overhead" for op in analysis.ops)
    check_consistent(analysis)


def test_train_with_tuple_output_and_grad_requiring_input(cpu_ceilings):
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    analysis = analyze(lambda a: (a @ w, {"aux": a.sum()}), x, train=True, ceilings=cpu_ceilings, profile_runs=1)
    assert any(op.phase == "backward" and op.name == "aten.mm.default" for op in analysis.ops)
    assert x.grad is not None and w.grad is not None
    check_consistent(analysis)
