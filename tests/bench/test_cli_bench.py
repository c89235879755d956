import functools
import json

import brrr.examples
from brrr.cli import main


def test_cli_bench_writes_table_and_json(tmp_path, capsys, monkeypatch):
    # the CLI has no size options: shrink the built-in mlp so brrr's kernels stay fast under TRITON_INTERPRET=1
    monkeypatch.setitem(brrr.examples.EXAMPLES, "mlp", functools.partial(brrr.examples.mlp, batch=8, dim=32))
    out = tmp_path / "out.json"
    assert main(["bench", "--example", "mlp", "--device", "cpu", "--backends", "eager,brrr", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SeedMLP: inference, float32 on cpu" in printed and "eager" in printed and "brrr" in printed

    data = json.loads(out.read_text())
    assert data["dtype"] == "float32" and data["train"] is False and data["device"] == "cpu"
    rows = {r["backend"]: r for r in data["rows"]}
    assert list(rows) == ["eager", "brrr"]
    eager = rows["eager"]
    assert eager["status"] == "ok" and eager["median_s"] > 0 and eager["speedup"] == 1.0
    assert eager["p20_s"] <= eager["median_s"] <= eager["p80_s"]
    compiled = rows["brrr"]
    assert compiled["status"] in ("ok", "wrong", "failed")
    if compiled["status"] == "failed":  # until the compiler lands: a marked failure, not a crash
        assert compiled["reason"].startswith("FAILED:") and compiled["median_s"] is None
    else:
        assert compiled["median_s"] > 0 and compiled["cold_compile_s"] > 0
        assert compiled["error_vs_eager"]["norm_rel"] >= 0


def test_brrr_bench_is_callable_after_the_package_is_imported():
    import brrr
    import brrr.bench.runner  # noqa: F401  (imports the subpackage, which shadows the function)
    from brrr.examples import mlp

    model, (x,) = mlp(batch=2, dim=8)
    result = brrr.bench(model, x, backends=("eager",), warmup=1, rep=2)
    assert result.rows[0].status == "ok"
