"""precision.py: bf16 and TF32 priced from the ops each mode runs, its contractions timed in the mode, host and
device simulated in step order."""

import pytest
import torch

from brrr.analyze import analyze, precision
from brrr.analyze.precision import ModeStep, align, mode_step_seconds
from tests.analyze.synthetic import make_ceilings, make_record


def _named(index, name, **kw):
    return make_record(index, name=name, bytes_read=64, bytes_written=64, **kw)


def test_alignment_matches_the_same_ops_in_order_and_leaves_autocasts_casts_unmatched():
    analyzed = [_named(0, "aten.addmm.default"), _named(1, "aten.gelu.default"), _named(2, "aten.addmm.default"),
                _named(3, "aten.native_layer_norm.default")]
    names = ["aten._to_copy.default", "aten._to_copy.default", "aten.addmm.default", "aten.gelu.default",
             "aten._to_copy.default", "aten.addmm.default", "aten._to_copy.default",
             "aten.native_layer_norm.default"]
    mode = [_named(i, n) for i, n in enumerate(names)]
    assert align(analyzed, mode) == {2: 0, 3: 1, 5: 2, 7: 3}


def test_an_op_the_mode_drops_is_skipped_and_the_rest_still_match():
    analyzed = [_named(0, "aten.addmm.default"), _named(1, "aten.clone.default"), _named(2, "aten.gelu.default")]
    mode = [_named(0, "aten.addmm.default"), _named(1, "aten.gelu.default")]
    assert align(analyzed, mode) == {0: 0, 1: 2}


def _step(device_s, n=20):
    """n matmuls of `device_s` each."""
    return [make_record(i, op_class="contraction", flops=2 * 512 ** 3, bytes_read=3 * 512 * 512 * 4,
                        name="aten.mm.default", time_s=device_s) for i in range(n)]


def _bf16_mode(records, mm_s):
    """The step under autocast: a cast before each matmul, each matmul timed at `mm_s`."""
    ops, timed = [], {}
    for r in records:
        ops.append(make_record(len(ops), name="aten._to_copy.default", bytes_read=512 * 512 * 4,
                               bytes_written=512 * 512 * 2))
        timed[len(ops)] = mm_s
        ops.append(make_record(len(ops), op_class="contraction", flops=r.flops, bytes_read=r.bytes_read // 2,
                               name="aten.mm.default", dtype=torch.bfloat16))
    return ModeStep("bf16", ops, timed)


CAST_S = 512 * 512 * 6 / (1e12 * precision.COPY_FRACTION)


def test_a_host_bound_step_gets_slower_under_autocast_by_a_launch_per_cast():
    ceilings = make_ceilings(kind="cuda", bandwidth=1e12, launch_latency=5e-6)
    records = _step(10e-6)   # 20 matmuls of 10 us each in a 2.1 ms step: the device idles 90% of it
    wall, busy = 2.1e-3, 2e-4
    predicted, how, parts = mode_step_seconds(_bf16_mode(records, 2e-6), records, ceilings, wall, busy,
                                              {"overhead": wall - busy})
    assert predicted == pytest.approx(wall + 20 * 5e-6) and dict(parts)["inserted_ops"] == 20
    assert "20 ops added" in how


def test_a_device_bound_step_gets_its_timed_contractions_and_pays_its_casts_bytes():
    ceilings = make_ceilings(kind="cuda", bandwidth=1e12, launch_latency=5e-6)
    records = _step(1e-3)    # 20 matmuls of 1 ms: the device is busy all along
    wall, busy = 20e-3 + 15e-6, 20e-3
    predicted, _, parts = mode_step_seconds(_bf16_mode(records, 0.2e-3), records, ceilings, wall, busy,
                                            {"overhead": 15e-6})
    assert dict(parts)["device_s"] == pytest.approx(20 * (0.2e-3 + CAST_S))
    assert dict(parts)["device_contraction_s"] == pytest.approx(20 * 0.2e-3)
    assert dict(parts)["device_cast_s"] == pytest.approx(20 * CAST_S)
    assert predicted == pytest.approx(20 * (0.2e-3 + CAST_S) + 15e-6)
    # once the device is faster than the host's launches, the host paces the step
    predicted, _, _ = mode_step_seconds(_bf16_mode(records, 1e-6), records, ceilings, wall, busy, {"overhead": 0})
    assert predicted == pytest.approx(40 * 5e-6 + 15e-6)


def test_on_a_loaded_host_the_timed_calls_keep_their_plain_time():
    """A CPU step traced at 20 ms (a loaded host) whose plain run took 2 ms: the traced matmuls are scaled to the
    plain step (a tenth), the bf16 calls timed alone are not (they ran plain), and the step is what remains of it
    plus them, never 0."""
    ceilings = make_ceilings(kind="cpu", bandwidth=1e12)
    records = _step(1e-3)
    wall = busy = 2e-3
    predicted, _, parts = mode_step_seconds(_bf16_mode(records, 50e-6), records, ceilings, wall, busy, {})
    casts = 20 * CAST_S * 0.1   # inserted, priced by their bytes and scaled as traced times are
    assert dict(parts)["device_contraction_s"] == pytest.approx(20 * 50e-6)
    assert predicted == pytest.approx(wall - 2e-3 + 20 * 50e-6 + casts)


def test_tf32_runs_the_analyzed_ops_with_its_timed_matmuls():
    records = _step(1e-3)
    wall, busy = 20e-3 + 15e-6, 20e-3
    mode = ModeStep("tf32", records, {r.index: 0.25e-3 for r in records}, same_ops=True)
    predicted, _, parts = mode_step_seconds(mode, records, make_ceilings(), wall, busy, {"overhead": 15e-6})
    assert predicted == pytest.approx(20 * 0.25e-3 + 15e-6) and dict(parts)["inserted_ops"] == 0


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.norm = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64), torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(self.fc2(torch.nn.functional.gelu(self.fc1(x))))


@pytest.fixture
def counted_timer(monkeypatch):
    """A test-double timer for the mode's contractions; returns the calls it timed."""
    timed = []

    def timer(fn, device):
        out = fn()
        timed.append(out.dtype)
        return 1e-6

    monkeypatch.setattr(precision, "_TIMED", {})
    monkeypatch.setattr(precision, "_median_seconds", timer)
    return timed


def test_the_bf16_mode_traces_autocasts_casts_and_times_each_distinct_contraction_once(cpu_ceilings, counted_timer):
    torch.manual_seed(0)
    model, x = TwoLayers(), torch.randn(32, 64)
    analysis = analyze(model, x, ceilings=cpu_ceilings, profile_runs=1)
    prediction = analysis.predictions["bf16"]
    parts = dict(prediction.parts)
    assert counted_timer == [torch.bfloat16, torch.bfloat16]   # the two bf16 addmms, each timed once
    assert parts["timed_calls"] == 2
    # autocast casts the input and both layers' weights and biases to bf16, and the norm's input back to fp32
    assert parts["inserted_ops"] >= 5
    # on the CPU the ops run on the host, one after another: the step changes by what the ops' times changed
    # (views move nothing and are left as they were)
    scale = min(analysis.busy_time_s, analysis.wall_time_s) / sum(r.time_s for r in analysis.ops)
    analyzed = sum(r.time_s for r in analysis.ops if r.flops or r.bytes) * scale
    assert prediction.step_s == pytest.approx(analysis.wall_time_s + parts["device_s"] - analyzed)


def test_no_mode_is_traced_for_a_step_without_fp32_matmuls(cpu_ceilings, counted_timer):
    model, x = TwoLayers().to(torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    analysis = analyze(model, x, ceilings=cpu_ceilings, profile_runs=1)
    assert counted_timer == [] and "timed_calls" not in dict(analysis.predictions["bf16"].parts)


def test_a_contraction_taking_an_integer_tensor_is_not_timed_on_random_data(counted_timer):
    """Random offsets or seeds could send a kernel out of bounds: such a call keeps its roofline estimate."""
    from brrr.analyze.capture import record_step
    from brrr.analyze.step import Step

    class Indexed(torch.nn.Module):
        def forward(self, a, b, index):
            return torch.mm(a, b)[index]

    a, b, index = torch.randn(8, 8), torch.randn(8, 8), torch.tensor([0, 3])
    trace = record_step(Step(Indexed(), (a, b, index)), mark_ranges=False)
    records = trace.records()
    mm = [r.index for r in records if r.name == "aten.mm.default"]
    gathered = [r.index for r in records if r.name == "aten.index.Tensor"]
    timed = precision.time_contractions(trace.raw, mm + gathered, records, torch.device("cpu"))
    assert set(timed) == set(mm) and counted_timer == [torch.float32]
