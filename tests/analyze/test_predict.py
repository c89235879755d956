"""Predicted step time per remedy (predict.py), on synthetic records whose figures can be worked out by hand."""

import pytest
import torch

from brrr.analyze.advise import advise, precision_advice, precision_seconds
from brrr.analyze.calibration import MAX_SAMPLES, calibrate_advice, correction, load_table, record_ratios
from brrr.analyze.predict import (COMPILED_CALL_S, FUSED_BANDWIDTH_FRACTION, INDUCTOR_KERNEL_S, compiled_program,
                                  compiler_groups, predict_steps)
from tests.analyze.synthetic import make_ceilings, make_record

MB = 1_000_000


def _chain(op_time=2e-6):
    """x -> mul -> add -> gelu (1 MB in, 1 MB out each, each intermediate read only by the next), then a mm."""
    return [
        make_record(0, "elementwise", name="aten.mul.Tensor", bytes_read=MB, bytes_written=MB, time_s=op_time,
                    consumers=[1], regime="bandwidth"),
        make_record(1, "elementwise", name="aten.add.Tensor", bytes_read=MB, bytes_written=MB, time_s=op_time,
                    inputs_from=[(0, MB)], consumers=[2], regime="bandwidth"),
        make_record(2, "elementwise", name="aten.gelu.default", bytes_read=MB, bytes_written=MB, time_s=op_time,
                    inputs_from=[(1, MB)], consumers=[3], regime="bandwidth"),
        make_record(3, "contraction", name="aten.mm.default", flops=10**9, bytes_read=2 * MB, bytes_written=MB,
                    time_s=1e-4, inputs_from=[(2, MB)], regime="compute"),
        make_record(4, "view", name="aten.view.default", time_s=0.0),
    ]


def test_a_chain_becomes_one_kernel_moving_its_outside_bytes_at_the_fused_bandwidth():
    records = _chain(op_time=10e-6)
    ceilings = make_ceilings(bandwidth=2e11)
    [group] = compiler_groups(records)
    assert [r.index for r in group] == [0, 1, 2]
    device, launches = compiled_program(records, ceilings, wall_time_s=1.3e-4, busy_time_s=1.3e-4)
    # the kernel reads x and writes gelu's output: 2 MB; the mm keeps its time; the view launches nothing
    assert device == pytest.approx(1e-4 + 2 * MB / (2e11 * FUSED_BANDWIDTH_FRACTION))
    assert launches == 2


def test_a_fused_kernel_is_no_shorter_than_the_steps_shortest_kernel_nor_longer_than_its_ops():
    records = _chain(op_time=2e-6)  # 2 MB at 0.85 TB/s is 2.35 us, more than the shortest kernel's 2 us
    device, _ = compiled_program(records, make_ceilings(bandwidth=1e12), 1.06e-4, 1.06e-4)
    assert device == pytest.approx(1e-4 + 2 * MB / 0.85e12)
    device, _ = compiled_program(records, make_ceilings(bandwidth=1e15), 1.06e-4, 1.06e-4)
    assert device == pytest.approx(1e-4 + 2e-6)
    device, _ = compiled_program(records, make_ceilings(bandwidth=1e9), 1.06e-4, 1.06e-4)
    assert device == pytest.approx(1.06e-4)  # slower than eager's ops: eager's time stands


def test_a_producer_joins_its_readers_only_when_every_reader_in_its_phase_is_memory_bound():
    records = _chain()
    records[0].consumers = [1, 3]  # mul's output also feeds the matmul: it can't live only in registers
    records[3].inputs_from = [(2, MB), (0, MB)]
    groups = sorted([r.index for r in g] for g in compiler_groups(records))
    assert groups == [[0], [1, 2]]
    records = _chain()
    records[0].consumers = [1, 5]  # ...but a backward reader only forces the write
    records.append(make_record(5, "elementwise", phase="backward", bytes_read=MB, bytes_written=MB,
                               time_s=2e-6, inputs_from=[(0, MB)]))
    assert sorted([r.index for r in g] for g in compiler_groups(records)) == [[0, 1, 2], [5]]


def test_predictions_per_remedy():
    records = _chain(op_time=10e-6)
    ceilings = make_ceilings(bandwidth=2e11, launch_latency=5e-6)
    wall, busy = 2e-4, 1.3e-4
    split = {"compute": 1e-4, "bandwidth": 3e-5, "overhead": 7e-5}
    preds = predict_steps(records, ceilings, split, wall, busy, train=False, tf32_enabled=False)
    device = 1e-4 + 2 * MB / 0.17e12
    assert preds["cuda-graphs"].step_s == pytest.approx(device + 5e-6 + COMPILED_CALL_S)
    launched = max(device, 2 * 5e-6 + COMPILED_CALL_S)
    assert preds["compile"].step_s == pytest.approx(min(launched, preds["cuda-graphs"].step_s))
    assert preds["inductor"].step_s == pytest.approx(launched)   # device-bound: the wrapper's cost is hidden
    assert preds["batch"].step_s == pytest.approx((wall + 1.3e-4) / 2)
    # tf32 and bf16 agree with the precision advice's savings
    for item in precision_advice(records, ceilings, tf32_enabled=False):
        assert preds[item["kind"]].step_s == pytest.approx(wall - item["predicted_saving_s"])
    assert "channels-last" not in preds  # no convolution
    # re-timed at another wall time, a prediction moves as much as it was built on the wall time
    assert preds["batch"].at_wall(wall, wall + 1e-4) == pytest.approx(preds["batch"].step_s + 0.5e-4)
    assert preds["bf16"].at_wall(wall, wall + 1e-4) == pytest.approx(preds["bf16"].step_s + 1e-4)
    assert preds["compile"].at_wall(wall, wall + 1e-4) == preds["compile"].step_s
    cpu = predict_steps(records, make_ceilings(kind="cpu"), split, wall, busy, tf32_enabled=False)
    assert "cuda-graphs" not in cpu and "tf32" not in cpu and cpu["compile"].step_s == cpu["inductor"].step_s


def test_inductor_s_launches_are_paced_by_its_wrapper_on_a_gpu_and_brrr_s_by_the_launch():
    """100 matmuls of 1 us each (none fuses): launched by brrr at the measured 5 us launch latency, by Inductor's
    default wrapper at INDUCTOR_KERNEL_S each; on the CPU both launch alike."""
    records = [make_record(i, "contraction", name="aten.mm.default", flops=10**6, bytes_read=MB, time_s=1e-6,
                           regime="overhead") for i in range(100)]
    split = {"compute": 1e-4, "bandwidth": 0.0, "overhead": 3e-3}
    preds = predict_steps(records, make_ceilings(launch_latency=5e-6), split, 3.1e-3, 1e-4)
    assert preds["compile"].step_s < preds["inductor"].step_s
    assert preds["inductor"].step_s == pytest.approx(100 * INDUCTOR_KERNEL_S + COMPILED_CALL_S)
    assert "Inductor's wrapper" in preds["inductor"].how
    # what each figure is built from travels with it (the sweep fits the constants on these)
    parts = preds["inductor"].to_dict()["parts"]
    assert parts["launches"] == 100 and parts["graph_calls"] == 1 and parts["graph_call_s"] == COMPILED_CALL_S
    assert parts["host_s"] == pytest.approx(preds["inductor"].step_s)
    compile_parts = preds["compile"].to_dict()["parts"]
    assert min(max(compile_parts["device_s"], compile_parts["host_s"]), compile_parts["replayed_s"]) == \
        pytest.approx(preds["compile"].step_s)
    cpu = predict_steps(records, make_ceilings(kind="cpu", launch_latency=5e-6), split, 3.1e-3, 1e-4)
    assert cpu["inductor"].step_s == pytest.approx(100 * 5e-6 + COMPILED_CALL_S) == cpu["compile"].step_s


def test_overhead_advice_quotes_the_predicted_steps():
    records = [make_record(i, "elementwise", bytes_read=4096, bytes_written=4096, time_s=2e-6, regime="overhead")
               for i in range(100)]
    split = {"compute": 0.0, "bandwidth": 0.0, "overhead": 1e-3}
    ceilings = make_ceilings()
    preds = predict_steps(records, ceilings, split, 1e-3, 0.2e-3)
    items = {a["kind"]: a for a in advise(records, ceilings, split, 1e-3, 0.2e-3, predictions=preds)}
    for kind in ("compile", "cuda-graphs", "batch"):
        assert items[kind]["predicted_step_s"] == pytest.approx(preds[kind].step_s)


def test_calibration_table_keeps_the_latest_ratios_and_corrects_by_their_median(monkeypatch, tmp_path):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    for i in range(MAX_SAMPLES + 5):
        record_ratios("GPU X", {"compile": 1.0 + i})
    table = load_table("GPU X")
    assert table["compile"] == [1.0 + i for i in range(5, MAX_SAMPLES + 5)]
    assert correction(table, "compile") == (pytest.approx(sum(table["compile"]) / MAX_SAMPLES), MAX_SAMPLES)
    assert load_table("GPU Y") == {} and correction(table, "bf16") is None
    advice = [{"kind": "compile", "message": "compile", "predicted_saving_s": 6e-3, "predicted_step_s": 4e-3},
              {"kind": "fuse", "message": "fuse", "predicted_saving_s": 1e-3}]
    calibrate_advice(advice, {"compile": [1.5, 2.0, 1.0]}, wall_time_s=10e-3)
    compile_item = next(a for a in advice if a["kind"] == "compile")
    assert compile_item["predicted_step_s"] == pytest.approx(6e-3)
    assert compile_item["predicted_saving_s"] == pytest.approx(4e-3)
    assert compile_item["predicted_step_uncalibrated_s"] == 4e-3
    assert compile_item["predicted_saving_uncalibrated_s"] == 6e-3
    assert "calibrated from 3 measurements" in compile_item["message"]
    (tmp_path / "calibration-gpu-z.json").write_text("not json")
    assert load_table("GPU Z") == {}


def test_tf32_reaches_cublas_matmuls_only_while_bf16_autocast_reaches_every_contraction():
    records = [make_record(0, "contraction", name="aten.mm.default", flops=10**9, bytes_read=MB, time_s=1e-4,
                           regime="compute"),
               make_record(1, "contraction", name="aten._scaled_dot_product_efficient_attention.default",
                           flops=10**9, bytes_read=MB, time_s=1e-4, regime="compute")]
    ceilings = make_ceilings()
    assert precision_seconds(records, ceilings, "tf32", tf32_enabled=False)[2] == 1
    assert precision_seconds(records, ceilings, "bf16", tf32_enabled=False)[2] == 2
    assert precision_seconds(records, ceilings, "tf32", tf32_enabled=True) is None  # on already


def test_a_mode_priced_by_its_roofs_saves_the_plain_steps_share_of_its_traced_matmuls():
    """Traced on a loaded host, the matmuls took 4 ms of a step whose plain run took 2 ms, all of it busy: the
    saving is scaled to the plain step (half the traced time), never more than the step."""
    records = [make_record(0, "contraction", name="aten.mm.default", flops=10**9, bytes_read=MB, time_s=4e-3,
                           regime="compute")]
    ceilings = make_ceilings()
    old, new, _ = precision_seconds(records, ceilings, "bf16")
    preds = predict_steps(records, ceilings, {"compute": 2e-3, "bandwidth": 0.0, "overhead": 0.0}, 2e-3, 2e-3)
    assert 0 < preds["bf16"].step_s == pytest.approx(2e-3 - (old - new) / 2)


def test_a_step_cut_into_many_graphs_pays_each_graphs_call_and_guards():
    """A host-bound training step that Dynamo cuts into 12 graphs (11 breaks, 100 guards each): each call of each
    graph, forward and backward, pays the compiled call and its guards; the launched prediction grows by exactly
    that over one graph's, and says so."""
    from brrr.analyze import predict
    from brrr.analyze.graphs import GraphStructure

    records = _chain(op_time=10e-6)
    ceilings = make_ceilings(bandwidth=2e11, launch_latency=1e-3)   # the host's launches dominate
    split = {"compute": 1e-4, "bandwidth": 3e-5, "overhead": 3e-3}
    one = predict_steps(records, ceilings, split, 3.2e-3, 1.3e-4, train=True)
    many = predict_steps(records, ceilings, split, 3.2e-3, 1.3e-4, train=True,
                         structure=GraphStructure(graphs=12, breaks=11, guards=1200))
    extra = 2 * 12 * (COMPILED_CALL_S + 100 * predict.GUARD_S) - 2 * COMPILED_CALL_S
    assert many["inductor"].step_s == pytest.approx(one["inductor"].step_s + extra)
    assert "12 graphs (11 breaks, 1200 guards)" in many["compile"].how


def test_the_graphs_of_a_model_with_a_break_are_counted():
    from brrr.analyze.graphs import graph_structure

    class Breaks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            torch._dynamo.graph_break()
            return self.b(h)

    found = graph_structure(Breaks(), (torch.randn(2, 4),))
    assert (found.graphs, found.breaks) == (2, 1) and found.guards > 0
    assert graph_structure(torch.compile(Breaks(), backend="eager"), (torch.randn(2, 4),)) is None


def test_counting_graphs_leaves_no_trace_on_the_model():
    """Explaining runs the forward once more: batch norm's statistics and the random generator stay as they were."""
    from brrr.analyze.graphs import graph_structure

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5)).train()
    x = torch.randn(8, 4) + 3
    stats = [b.clone() for b in model[1].buffers()]
    rng = torch.get_rng_state()
    found = graph_structure(model, (x,))
    assert found is not None and found.graphs == 1 and found.breaks == 0
    assert all(torch.equal(a, b) for a, b in zip(stats, model[1].buffers()))
    assert torch.equal(rng, torch.get_rng_state())


def test_a_graph_that_cannot_be_captured_launches_its_share_of_the_kernels():
    """An .item() in the step (aten._local_scalar_dense) keeps one of its graphs from replaying: with 4 graph calls
    and 2 kernels, that graph call launches its half of them."""
    from brrr.analyze.graphs import GraphStructure

    records = _chain(op_time=10e-6)
    ceilings = make_ceilings(kind="cuda", bandwidth=2e11, launch_latency=5e-6)
    split = {"compute": 1e-4, "bandwidth": 3e-5, "overhead": 7e-5}
    structure = GraphStructure(graphs=2, breaks=1, guards=0)
    records.append(make_record(5, "other", name="aten.clone.default", time_s=1e-6))
    clean = predict_steps(records, ceilings, split, 2e-4, 1.3e-4, train=True, structure=structure)
    records[-1].name = "aten._local_scalar_dense.default"   # the same op times, one that cannot be captured
    blocked = predict_steps(records, ceilings, split, 2e-4, 1.3e-4, train=True, structure=structure)
    _, launches = compiled_program(records, ceilings, 2e-4, 1.3e-4)
    assert blocked["cuda-graphs"].step_s == pytest.approx(
        clean["cuda-graphs"].step_s - (5e-6 + COMPILED_CALL_S) + (launches / 4 * 5e-6 + COMPILED_CALL_S))
    assert "1 of 4 graph calls cannot be captured (aten._local_scalar_dense.default reads a device value" in \
        blocked["cuda-graphs"].how


def test_attention_traced_with_dropout_keeps_its_graph_from_replaying():
    """Memory-efficient attention with dropout keeps its RNG state on the host when launched: the capture rule of
    host_copies, read from the traced call's arguments (meta tensors: nothing runs)."""
    from brrr.analyze.capture import record_step
    from brrr.analyze.step import Step

    class Attention(torch.nn.Module):
        def __init__(self, p):
            super().__init__()
            self.p = p

        def forward(self, q, k, v):
            return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False, self.p)[0]

    q = torch.randn(2, 4, 16, 8, device="meta")
    ceilings = make_ceilings(kind="cuda", launch_latency=5e-6)
    split = {"compute": 1e-4, "bandwidth": 0.0, "overhead": 1e-4}
    how = {}
    for p in (0.0, 0.1):
        records = record_step(Step(Attention(p), (q, q, q)), mark_ranges=False).records()
        for r in records:
            r.time_s = 1e-4
        how[p] = predict_steps(records, ceilings, split, 2e-4, 1e-4)["cuda-graphs"].how
    assert "cannot be captured" not in how[0.0]
    assert "1 of 1 graph calls cannot be captured (aten._scaled_dot_product_efficient_attention.default with " \
           "dropout keeps its RNG state on the host" in how[0.1]


def test_an_aten_call_the_compiler_keeps_costs_its_measured_host_time_beyond_the_median_call():
    """Ten 1 us matmuls whose host ranges take 5 us, and a cuDNN RNN whose range takes 2 ms: compiled, the RNN
    still takes its host time less the median call's; an op that waits for the device (.item()) adds nothing."""
    records = [make_record(i, "contraction", name="aten.mm.default", flops=10**6, bytes_read=MB, time_s=1e-6)
               for i in range(10)]
    records.append(make_record(10, "other", name="aten._cudnn_rnn.default", bytes_read=MB, time_s=1e-4))
    records.append(make_record(11, "other", name="aten._local_scalar_dense.default", bytes_read=4, time_s=1e-6))
    timeline = [("host", i * 10_000, i * 10_000 + 5_000, i, "") for i in range(10)]
    timeline += [("host", 200_000, 2_200_000, 10, ""), ("host", 2_300_000, 5_300_000, 11, "")]
    split = {"compute": 1e-4, "bandwidth": 0.0, "overhead": 5e-3}
    ceilings = make_ceilings(launch_latency=5e-6)
    with_ranges = predict_steps(records, ceilings, split, 5.4e-3, 1.1e-4, timeline=timeline)
    without = predict_steps(records, ceilings, split, 5.4e-3, 1.1e-4)
    assert dict(with_ranges["compile"].parts)["kept_host_s"] == pytest.approx(2e-3 - 5e-6)
    kept = 2e-3 - 5e-6
    # no more than the time eager's device waited on its host: a range that waits for the device holds its time
    idle = predict_steps(records, ceilings, dict(split, overhead=1e-3), 5.4e-3, 1.1e-4, timeline=timeline)
    assert dict(idle["compile"].parts)["kept_host_s"] == pytest.approx(1e-3)
    for kind in ("compile", "inductor"):   # the host's share grows by it; the step is now the host's
        assert dict(with_ranges[kind].parts)["host_s"] == pytest.approx(dict(without[kind].parts)["host_s"] + kept)
        assert with_ranges[kind].step_s == pytest.approx(dict(with_ranges[kind].parts)["host_s"])
    assert with_ranges["cuda-graphs"].step_s == pytest.approx(without["cuda-graphs"].step_s + kept)
