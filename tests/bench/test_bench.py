import json
import math
import time

import pytest
import torch

from brrr.bench import bench
from brrr.bench.timing import time_graph, time_kernel, time_steady
from tests.bench.conftest import add_offset_backend, raising_backend, wrong_gradient_backend

FAST = {"warmup": 2, "rep": 10}


def test_wrong_backend_flagged_failing_backend_marked_and_others_still_run(tiny_mlp):
    model, (x,) = tiny_mlp
    result = bench(model, x, backends=("eager", add_offset_backend, raising_backend, "aot_eager"), **FAST)
    rows = {r.backend: r for r in result.rows}
    assert list(rows) == ["eager", "add_offset_backend", "raising_backend", "aot_eager"]

    wrong = rows["add_offset_backend"]
    assert wrong.status == "wrong" and wrong.reason.startswith("WRONG: error")
    assert wrong.error_vs_eager.max_abs == pytest.approx(1e-2, rel=1e-3)
    assert wrong.median_s > 0  # still timed

    failed = rows["raising_backend"]
    assert failed.status == "failed"
    assert "this backend always fails" in failed.reason and failed.reason.startswith("FAILED:")
    assert failed.median_s is None

    ok = rows["aot_eager"]  # ran after the failure
    assert ok.status == "ok" and ok.error_vs_eager.norm_rel == 0.0
    assert ok.median_s > 0 and ok.p20_s <= ok.median_s <= ok.p80_s and ok.steady_s > 0
    assert ok.cold_compile_s > 0 and ok.warm_compile_s > 0
    assert ok.speedup == pytest.approx(rows["eager"].median_s / ok.median_s)
    assert rows["eager"].speedup == 1.0
    assert ok.peak_memory_bytes is None  # CPU: not measured


def test_registered_backend_name_is_flagged_wrong(tiny_mlp):
    from torch._dynamo import register_backend

    register_backend(add_offset_backend, name="brrr_test_add_offset")
    model, (x,) = tiny_mlp
    row = bench(model, x, backends=("eager", "brrr_test_add_offset"), **FAST).row("brrr_test_add_offset")
    assert row.status == "wrong"


def test_unknown_backend_name_fails_without_stopping(tiny_mlp):
    model, (x,) = tiny_mlp
    result = bench(model, x, backends=("no_such_backend_xyz", "eager"), **FAST)
    assert [r.backend for r in result.rows] == ["eager", "no_such_backend_xyz"]  # eager first, as reference
    assert result.row("no_such_backend_xyz").status == "failed"


def test_training_compares_gradients(tiny_mlp):
    model, (x,) = tiny_mlp
    result = bench(model, x, backends=("eager", "aot_eager", wrong_gradient_backend), train=True, **FAST)
    assert result.row("aot_eager").status == "ok"
    wrong = result.row("wrong_gradient_backend")
    assert wrong.status == "wrong"
    assert 1e-3 < wrong.error_vs_eager.norm_rel < 2e-2  # 1% on the gradients, exact forward
    assert all(p.grad is not None for p in model.parameters())


def test_bf16_judged_against_fp64():
    from brrr.examples import mlp

    torch.manual_seed(0)
    model, (x,) = mlp(batch=8, dim=32, dtype=torch.bfloat16)
    result = bench(model, x, backends=("eager", "aot_eager", add_offset_backend), **FAST)
    eager, ok, wrong = result.rows
    assert result.dtype == "bfloat16"
    assert 1e-4 < eager.error_vs_reference.norm_rel < 2e-2  # bf16 rounding, seen against fp64
    assert ok.status == "ok" and wrong.status == "wrong" and "vs float64" in wrong.reason


def test_to_dict_is_json_and_print_shows_the_table(tiny_mlp):
    from rich.console import Console

    model, (x,) = tiny_mlp
    result = bench(model, x, backends=("eager", raising_backend), **FAST)
    d = json.loads(json.dumps(result.to_dict()))
    assert d["dtype"] == "float32" and d["train"] is False and "torch" in d["versions"]
    assert {"backend", "status", "median_s", "p20_s", "p80_s", "speedup", "cold_compile_s", "warm_compile_s",
            "peak_memory_bytes", "error_vs_eager", "error_vs_reference"} <= set(d["rows"][0])
    console = Console(record=True, width=160)
    result.print(console)
    text = console.export_text()
    assert "median ms" in text and "FAILED: BackendCompilerFailed" in text and "this backend always" in text


def test_input_sets_are_rotated_while_timing():
    seen = []

    def fn(x):
        seen.append(int(x[0]))
        return x * 2

    sets = [(torch.full((4,), float(i)),) for i in range(1, 4)]
    bench(fn, torch.zeros(4), backends=("eager",), input_sets=sets, **FAST)
    assert {0, 1, 2, 3} <= set(seen)


def test_time_kernel_and_time_steady_measure_a_known_duration():
    def two_ms():
        time.sleep(0.002)

    t = time_kernel(two_ms, "cpu", warmup=5, rep=40)
    assert 0.002 <= t.median_s < 0.02 and t.p20_s <= t.median_s <= t.p80_s and t.calls >= 5
    steady = time_steady(two_ms, "cpu", chunk_s=0.01, chunks=3)
    assert 0.002 <= steady.median_s < 0.02


def test_graph_timing_is_cuda_only():
    calls = []
    assert time_graph(lambda: calls.append(1), "cpu") is None and calls == []   # nothing run, nothing made up
    row = bench(lambda x: x * 2, torch.ones(4), backends=("eager",), graph_timing=True, **FAST).rows[0]
    assert row.graph_s is None and row.median_s > 0


def test_brrr_backend_matches_eager(tiny_mlp):
    pytest.importorskip("brrr.compile.backend", reason="brrr's compiler is not built yet")
    model, (x,) = tiny_mlp
    row = bench(model, x, backends=("eager", "brrr"), **FAST).row("brrr")
    assert row.status == "ok", row.reason
    assert row.error_vs_eager.norm_rel <= 1e-4 and not math.isinf(row.median_s)
