"""A brrr-compiled model analyzed: its fused kernels land on the roofline with their plan's FLOPs and bytes, their
modules and readable names (analyze/kernels.py, compile/pricing.py, compile/kernel_registry.py); and the trace of
the analyzed step (analyze/trace.py). Kernels run in the Triton interpreter on CPU."""

import json
import os
import re

import pytest
import torch

import brrr
from brrr.analyze import Analysis, analyze
from brrr.cost.ops import ELEMENTWISE_FLOPS_PER_ELEMENT
from tests.analyze.synthetic import make_record

TRACE_ARGS = {"op", "module", "phase", "flops", "bytes", "roofline_fraction", "regime"}


@pytest.fixture(scope="module")
def compiled_mlp(cpu_ceilings):
    """(model, inputs, its explanation, the analysis of its brrr-compiled train step)."""
    from brrr.examples import mlp

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("brrr's kernels need a GPU or TRITON_INTERPRET=1")
    torch.manual_seed(0)
    model, inputs = mlp(batch=64, dim=128)
    explanation = brrr.explain(model, *inputs, train=True)
    analysis = analyze(brrr.compile(model), *inputs, train=True, ceilings=cpu_ceilings, profile_runs=1)
    return model, inputs, explanation, analysis


def test_compiled_kernels_carry_their_plans_flops_bytes_and_modules(compiled_mlp):
    model, (x,), explanation, analysis = compiled_mlp
    kernels = {r.name: r for r in analysis.ops if r.kernel}
    planned = {k.kernel_name: k for k in explanation.kernels}
    assert kernels.keys() == planned.keys()   # every fused kernel launched once, under the name explain gives it
    modules = {name for name, _ in model.named_modules() if name}
    for name, record in kernels.items():
        plan = planned[name]
        assert (record.flops, record.bytes_read, record.bytes_written) == \
            (plan.flops, plan.bytes_read, plan.bytes_written)
        assert record.flops > 0 and record.bytes == plan.bytes
        assert record.module in modules and record.module in record.modules
        assert record.phase == plan.graph
        assert re.fullmatch(r"brrr_[a-z0-9_]+_[0-9a-f]{8}(_v\d+)?", name)   # a function named after its source
        assert record.fused_ops and all(op.startswith(("aten.", "prims.")) for op in record.fused_ops)
        assert record.time_s > 0 and record.roofline_time_s > 0 and record.regime in ("bandwidth", "compute")

    # the forward GELU kernel, counted by hand: GELU's FLOPs per element, one fp32 read and one write per element
    (gelu,) = [r for r in kernels.values() if r.phase == "forward" and "aten.gelu.default" in r.fused_ops]
    numel = x.shape[0] * model.fc1.out_features
    assert gelu.module == "act" and "gelu" in gelu.name
    assert gelu.flops == ELEMENTWISE_FLOPS_PER_ELEMENT["gelu"] * numel
    assert (gelu.bytes_read, gelu.bytes_written) == (4 * numel, 4 * numel)
    assert gelu.op_class == "elementwise"
    # the layer norm: reads its input and affine parameters, writes its output and the per-row mean and 1/std
    # saved for the backward
    (norm,) = [r for r in kernels.values() if r.phase == "forward" and "layer_norm" in r.name]
    dim, rows = model.norm.normalized_shape[0], x.shape[0]
    assert norm.module == "norm" and norm.op_class == "normalization"
    assert norm.bytes_read == 4 * (rows * dim + 2 * dim)
    assert norm.bytes_written == 4 * (rows * dim + 2 * rows)


def test_compiled_kernels_show_in_the_report_like_ops(compiled_mlp):
    from brrr.analyze.report import op_dict, op_row

    *_, analysis = compiled_mlp
    kernel = next(r for r in analysis.ops if r.kernel)
    row = op_row(kernel, 1.0)
    assert row["class"] == kernel.op_class and row["% of roof"] != "-" and row["FLOP/s"] != "-"
    assert op_dict(kernel)["achieved_fraction"] > 0 and op_dict(kernel)["fused_ops"] == list(kernel.fused_ops)
    # the interpreter's own tensor calls around each launch are not the model's ops
    assert not any(r.name in ("aten.set_.source_Storage", "aten.set_.source_Storage_storage_offset")
                   for r in analysis.ops)


def _validate_chrome_trace(data):
    """Chrome's trace event format, strictly (trace.validate), and the slices' ts/dur as the JSON gives them."""
    from brrr.analyze.trace import validate

    slices = validate(data)
    assert all(TRACE_ARGS <= s["args"].keys() for s in slices)
    return slices


def test_trace_of_the_analyzed_step_is_a_chrome_trace_with_each_slices_numbers(compiled_mlp, tmp_path):
    *_, analysis = compiled_mlp
    path = tmp_path / "step.json"
    analysis.save_trace(str(path))
    slices = _validate_chrome_trace(json.loads(path.read_text()))
    kernels = [s for s in slices if s["cat"] == "kernel"]
    records = {r.name: r for r in analysis.ops if r.kernel}
    assert sorted(s["name"] for s in kernels) == sorted(records)
    for s in kernels:
        record = records[s["name"]]
        args = s["args"]
        assert (args["flops"], args["bytes"], args["module"], args["regime"]) == \
            (record.flops, record.bytes, record.module, record.regime)
        assert args["roofline_fraction"] == pytest.approx(record.roofline_time_s / record.time_s)
        assert args["op"] == ", ".join(record.fused_ops)
        assert s["dur"] == pytest.approx(record.time_s * 1e6, abs=1e-3)
    ops = [s for s in slices if s["cat"] == "op"]
    assert ops and {(s["pid"], s["tid"]) for s in ops}.isdisjoint({(s["pid"], s["tid"]) for s in kernels})
    assert any(s["args"]["op"] == "aten.addmm.default" and s["args"]["flops"] > 0 for s in ops)
    # slices follow the step's order: the forward GELU kernel runs after the first matmul and before the second
    addmm = sorted(s["ts"] for s in ops if s["args"]["op"] == "aten.addmm.default")
    gelu = next(s for s in kernels if "gelu" in s["name"] and s["args"]["phase"] == "forward")
    assert addmm[0] < gelu["ts"] < addmm[1]
    _load_with_trace_processor(path)


def _load_with_trace_processor(path):
    """Load the trace with Perfetto's trace processor when it is installed and can start here."""
    try:
        from perfetto.trace_processor import TraceProcessor
    except ImportError:
        return
    try:
        processor = TraceProcessor(trace=str(path))
    except Exception as e:   # it fetches its binary on first use: no network, no check
        pytest.skip(f"trace_processor could not start: {e}")
    try:
        count = next(iter(processor.query("select count(*) as n from slice"))).n
        assert count > 0
    finally:
        processor.close()


def test_a_trace_without_a_profiler_timeline_lays_ops_end_to_end(cpu_ceilings, tmp_path):
    records = [make_record(0, flops=10**6, bytes_read=4096, time_s=2e-6),
               make_record(1, name="brrr_add_0", flops=0, time_s=3e-6, kernel=True)]
    analysis = Analysis.from_measurements(records, cpu_ceilings, wall_time_s=1e-5)
    path = tmp_path / "synthetic.json"
    analysis.save_trace(str(path))
    slices = _validate_chrome_trace(json.loads(path.read_text()))
    assert [(s["ts"], s["dur"]) for s in slices] == [(0.0, 2.0), (2.0, 3.0)]
    assert slices[1]["args"]["roofline_fraction"] is None   # an unpriced kernel: no fraction


def test_a_trace_that_is_not_a_chrome_trace_is_refused():
    from brrr.analyze.trace import validate

    good = {"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 0, "dur": 1,
            "args": dict.fromkeys(TRACE_ARGS, 0)}
    assert validate({"traceEvents": [good]}) == [good]
    for bad in ({"events": []}, {"traceEvents": [{**good, "ph": "B"}]}, {"traceEvents": [{**good, "dur": -1}]},
                {"traceEvents": [{**good, "args": {"op": "x"}}]}, {"traceEvents": [{**good, "pid": "1"}]}):
        with pytest.raises(ValueError):
            validate(bad)


def test_inductor_kernels_get_their_fused_ops_from_their_names_and_numbers_where_inductor_kept_them(monkeypatch):
    import sys
    from types import ModuleType, SimpleNamespace

    from brrr.analyze.kernels import inductor_ops, kernel_records

    assert inductor_ops("add_native_layer_norm") == ("aten.add", "aten.native_layer_norm")
    assert inductor_ops("gelu_view_2") == ("aten.gelu", "aten.view")
    output_code = ModuleType("inductor_output_code")
    # compiled with benchmark_kernel: Inductor's own FLOPs and bytes of the kernel
    output_code.triton_per_fused_add_native_layer_norm_1 = SimpleNamespace(
        inductor_meta={"kernel_flop": 4096, "kernel_num_gb": 2e-6})
    codecache = SimpleNamespace(PyCodeCache=SimpleNamespace(modules=[output_code], modules_no_attr={}))
    monkeypatch.setitem(sys.modules, "torch._inductor.codecache", codecache)
    near = make_record(0, module="encoder", phase="forward")
    poi, per, other = kernel_records([("triton_poi_fused_gelu_0", 1e-5, 0),
                                      ("triton_per_fused_add_native_layer_norm_1", 2e-5, 0),
                                      ("void cutlass_kernel", 3e-5, 0)], [near])
    assert (poi.op_class, poi.fused_ops, poi.unpriced, poi.module) == \
        ("elementwise", ("aten.gelu",), True, "encoder")
    assert (per.op_class, per.flops, per.bytes, per.unpriced) == ("normalization", 4096, 2000, False)
    assert per.fused_ops == ("aten.add", "aten.native_layer_norm")
    assert (other.op_class, other.unpriced, [r.index for r in (poi, per, other)]) == ("other", True, [1, 2, 3])


def test_overlapping_kernels_of_one_track_go_to_lanes_of_their_own(cpu_ceilings):
    from brrr.analyze.trace import chrome_trace, validate

    records = [make_record(0, flops=10, bytes_read=40, time_s=1e-6), make_record(1, flops=10, time_s=1e-6),
               make_record(2, flops=10, time_s=1e-6)]
    timeline = [("host", 0, 100, 0, ""), ("device", 1000, 2000, 0, "gemm"), ("device", 1500, 2500, 1, "gelu"),
                ("device", 2000, 3000, 2, "add")]   # gelu overlaps gemm (another stream); add follows gemm
    analysis = Analysis.from_measurements(records, cpu_ceilings, wall_time_s=1e-5, timeline=timeline)
    slices = {s["name"]: s for s in validate(chrome_trace(analysis))}
    assert slices["gemm"]["tid"] == slices["add"]["tid"] != slices["gelu"]["tid"]
    assert {s["pid"] for s in slices.values()} == {1, 2} and slices["gelu"]["ts"] == 1.5
    assert slices["gemm"]["args"]["op"] == "aten.add.Tensor" and slices["gemm"]["dur"] == 1.0


def test_cli_analyze_writes_the_trace(tmp_path, monkeypatch, cpu_ceilings):
    import brrr.cost.device
    from brrr.analyze.trace import validate
    from brrr.cli import main

    monkeypatch.setattr(brrr.cost.device, "get_ceilings", lambda *args, **kwargs: cpu_ceilings)
    path = tmp_path / "step.json"
    assert main(["analyze", "--example", "mlp", "--device", "cpu", "--batch", "8", "--trace", str(path)]) == 0
    slices = validate(json.loads(path.read_text()))
    assert any(s["args"]["op"] == "aten.addmm.default" and s["args"]["regime"] for s in slices)


def test_dynamo_module_paths_read_as_the_analyzers_module_names():
    from brrr.analyze.kernels import module_names, resolve_module

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ModuleList([torch.nn.ReLU()]))
    names, root = module_names(model)
    assert resolve_module((str(id(model[1][0])), "anything"), names, root) == "1.0"
    assert resolve_module((f"{id(model[0])}@1", "anything"), names, root) == "0"
    # a key that names no module of this model: Dynamo's source path, rewritten
    assert resolve_module(("L__self___encoder", "L['self'].encoder.layer[3].output"), names, root) == \
        "encoder.layer.3.output"
    assert resolve_module(("x", "getattr(L['self'].layers, '2').mlp"), names, root) == "layers.2.mlp"
    assert resolve_module(("x", "L['self']"), names, root) == "Sequential"


def test_a_function_repeated_layers_share_is_put_in_the_layer_of_the_op_before_it(monkeypatch):
    """A repeated layer's kernels launch one function (registered once, with every layer's module): each launch is
    put in the module of the op launched just before it, where that is one of them."""
    from brrr.analyze.capture import OpRecord
    from brrr.analyze.kernels import kernel_records
    from brrr.compile.runtime import kernel_registry

    model = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
    meta = kernel_registry.KernelMeta(8, 32, 32, "elementwise", torch.float32, ("aten.add.Tensor",),
                                      tuple(("x", f"L['self'][{i}]") for i in range(3)), name="brrr_add_0a1b2c3d")
    monkeypatch.setattr(kernel_registry, "lookup", lambda name: meta if name == meta.name else None)
    ops = [OpRecord(i, "aten.mm.default", str(i), "forward", "matmul", 1, 1, 1, torch.float32) for i in range(3)]
    launches = [(meta.name, 1e-6, i) for i in (2, 0, 1)] + [(meta.name, 1e-6, -1)]
    records = kernel_records(launches, ops, model)
    assert [r.module for r in records] == ["2", "0", "1", "0"]   # the op's layer; none before: the first listed
    assert all(r.modules == ("0", "1", "2") and r.flops == 8 for r in records)
