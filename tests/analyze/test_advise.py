"""Advice and its predicted savings, on synthetic records and on a real elementwise chain."""

import pytest
import torch

from brrr.analyze import analyze
from brrr.analyze.advise import (advise, common_module, fusion_advice, fusion_bytes_saved, fusion_groups,
                                 overhead_advice, precision_advice)
from tests.analyze.synthetic import make_ceilings, make_record

MB = 1_000_000


def _chain():
    """x -> mul -> add -> gelu, 1 MB tensors, each intermediate read only by the next op; then a matmul."""
    return [
        make_record(0, "elementwise", name="aten.mul.Tensor", module="block.scale", bytes_read=MB,
                    bytes_written=MB, time_s=2e-6, consumers=[1]),
        make_record(1, "elementwise", name="aten.add.Tensor", module="block.shift", bytes_read=MB,
                    bytes_written=MB, time_s=2e-6, inputs_from=[(0, MB)], consumers=[2]),
        make_record(2, "elementwise", name="aten.gelu.default", module="block.act", bytes_read=MB,
                    bytes_written=MB, time_s=2e-6, inputs_from=[(1, MB)], consumers=[3]),
        make_record(3, "contraction", name="aten.mm.default", module="head", flops=10**9, bytes_read=2 * MB,
                    bytes_written=MB, time_s=1e-4, inputs_from=[(2, MB)]),
    ]


def test_chain_of_elementwise_ops_gives_fusion_advice_with_bytes_over_bandwidth():
    ceilings = make_ceilings(bandwidth=2e12)
    [item] = fusion_advice(_chain(), ceilings)
    # two intermediates, each written once and read back once: 4 MB that one kernel would not move
    assert item["kind"] == "fuse"
    assert item["bytes_saved"] == 4 * MB
    assert item["predicted_saving_s"] == pytest.approx(4 * MB / 2e12)
    assert item["ops"] == [0, 1, 2]
    assert "mul -> add -> gelu" in item["message"] and "block" in item["message"]
    assert item["module"] == "block"


def test_intermediate_with_a_reader_outside_the_group_breaks_the_chain():
    records = _chain()
    records[1].consumers = [2, 3]  # add's output is also read by the matmul
    records[3].inputs_from.append((1, MB))
    groups = fusion_groups(records)
    # mul -> add still fuses (add is mul's only reader); gelu can't join without taking the matmul along
    assert [[r.index for r in g] for g in groups] == [[0, 1]]
    assert fusion_bytes_saved(groups[0]) == 2 * MB


def test_forward_and_backward_ops_are_not_fused_together():
    records = _chain()
    records[1].phase = "backward"
    assert fusion_groups(records) == []


def test_step_output_is_still_written():
    records = _chain()[:2]
    records[0].is_step_output = True
    [group] = fusion_groups(records)
    assert fusion_bytes_saved(group) == MB  # only the read back is saved


def test_common_module():
    assert common_module(["enc.layer.0.a", "enc.layer.0.b"]) == "enc.layer.0"
    assert common_module(["a", "b", "c", "d"]) == "a, b, c and 1 more"


def test_fp32_matmul_gets_tf32_and_bf16_advice_from_measured_rates():
    ceilings = make_ceilings(bandwidth=1e12, fp32=1e13, tf32=8e13, bf16=1.6e14)
    # compute-bound fp32 matmul: 1e11 FLOPs, floor 10 ms at fp32; measured 12 ms
    mm = make_record(0, "contraction", name="aten.mm.default", flops=10**11, bytes_read=10**8, bytes_written=0,
                     time_s=12e-3, regime="compute")
    items = {a["kind"]: a for a in precision_advice([mm], ceilings, tf32_enabled=False)}
    # time scales with the floor: tf32 floor = max(1e11/8e13, 1e8/1e12) = 1.25 ms, i.e. 1/8 of 10 ms
    assert items["tf32"]["predicted_saving_s"] == pytest.approx(12e-3 * (1 - 1 / 8))
    # bf16: max(1e11/1.6e14, 0.5e8/1e12) = 0.625 ms -> 1/16 of the fp32 floor
    assert items["bf16"]["predicted_saving_s"] == pytest.approx(12e-3 * (1 - 1 / 16))
    assert "set_float32_matmul_precision" in items["tf32"]["message"]
    assert "autocast" in items["bf16"]["message"]


def test_no_tf32_advice_when_tf32_is_already_on_or_not_faster():
    mm = make_record(0, "contraction", name="aten.mm.default", flops=10**11, bytes_read=10**8, time_s=12e-3,
                     regime="compute")
    on = precision_advice([mm], make_ceilings(), tf32_enabled=True)
    assert [a["kind"] for a in on] == ["bf16"]
    cpu = make_ceilings(kind="cpu", fp32=1e11, tf32=1e11, bf16=5e10)
    assert precision_advice([mm], cpu, tf32_enabled=False) == []
    bf16_mm = make_record(0, "contraction", flops=10**11, time_s=12e-3, dtype=torch.bfloat16, regime="compute")
    assert precision_advice([bf16_mm], make_ceilings(), tf32_enabled=False) == []
    mm.regime = "overhead"  # launch-bound: a faster roof saves nothing
    assert precision_advice([mm], make_ceilings(), tf32_enabled=False) == []


def _overhead_bound():
    # 100 tiny ops of 2 us device time each (busy 0.2 ms) in a 1 ms step: the GPU idles 80% of the time
    records = [make_record(i, "elementwise", bytes_read=4096, bytes_written=4096, time_s=2e-6) for i in range(100)]
    for r in records:
        r.regime = "overhead"
    split = {"compute": 0.0, "bandwidth": 0.0, "overhead": 1e-3}
    return records, split


def test_overhead_bound_run_gets_cuda_graphs_compile_and_batch_advice():
    records, split = _overhead_bound()
    items = {a["kind"]: a for a in overhead_advice(records, split, 1e-3, 0.2e-3, "cuda", [])}
    assert set(items) == {"cuda-graphs", "compile", "batch"}
    assert items["cuda-graphs"]["predicted_saving_s"] == pytest.approx(0.8e-3)  # the idle time
    assert "80%" in items["cuda-graphs"]["message"]
    assert items["batch"]["predicted_saving_s"] == pytest.approx(0.5e-3)
    assert 0 <= items["compile"]["predicted_saving_s"] <= 1e-3


def test_no_cuda_graphs_on_cpu_and_no_overhead_advice_when_overhead_is_small():
    records, split = _overhead_bound()
    kinds = [a["kind"] for a in overhead_advice(records, split, 1e-3, 0.2e-3, "cpu", [])]
    assert kinds == ["compile", "batch"]
    busy_split = {"compute": 0.9e-3, "bandwidth": 0.05e-3, "overhead": 0.05e-3}
    assert overhead_advice(records, busy_split, 1e-3, 0.95e-3, "cuda", []) == []


def test_advise_sorts_by_saving():
    records = _chain()
    records[3].regime = "compute"
    items = advise(records, make_ceilings(), {"compute": 1e-4, "bandwidth": 6e-6, "overhead": 0.0}, 1.06e-4, 1.06e-4,
                   tf32_enabled=False)
    savings = [a["predicted_saving_s"] for a in items]
    assert savings == sorted(savings, reverse=True)
    assert {a["kind"] for a in items} == {"fuse", "tf32", "bf16"}


def test_real_cos_chain_is_captured_and_priced_by_hand():
    """x.cos().cos().sin() on 4096 floats: 2 intermediates of 16 KiB, each written and read back once."""
    n = 4096
    ceilings = make_ceilings(kind="cpu", bandwidth=1e10)
    analysis = analyze(lambda x: x.cos().cos().sin(), torch.randn(n), ceilings=ceilings, profile_runs=1)
    assert [op.name for op in analysis.ops] == ["aten.cos.default", "aten.cos.default", "aten.sin.default"]
    fuse = [a for a in analysis.advice if a["kind"] == "fuse"]
    assert len(fuse) == 1
    bytes_saved = 2 * (4 * n + 4 * n)
    assert fuse[0]["bytes_saved"] == bytes_saved
    assert fuse[0]["predicted_saving_s"] == pytest.approx(bytes_saved / 1e10)
    assert "cos -> cos -> sin" in fuse[0]["message"]
