import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_suite():
    spec = importlib.util.spec_from_file_location("run_suite", ROOT / "benchmarks" / "suite" / "run_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_suite_writes_json_and_markdown_and_records_failures(tmp_path):
    suite = _load_suite()
    code = suite.main(["--quick", "--out", str(tmp_path), "--sections", "repeat,mlp,nonsense",
                       "--backends", "eager,aot_eager,no_such_backend_xyz", "--keep-caches"])
    assert code == 0
    [json_path] = tmp_path.glob("*-cpu-*.json")  # <date>-<gpu>-<commit>.json
    results = json.loads(json_path.read_text())
    assert json_path.stem.endswith("-cpu-" + results["environment"]["commit"])
    assert results["environment"]["mode"] == "quick" and "torch" in results["environment"]["versions"]
    sections = results["sections"]
    assert sections["mlp"]["status"] == "ok"
    configs = sections["mlp"]["data"]
    assert len(configs) == 4  # 1 batch x fp32/bf16 x inference/train
    for entry in configs.values():
        rows = {r["backend"]: r for r in entry["data"]["rows"]}
        assert rows["aot_eager"]["status"] == "ok"
        assert rows["no_such_backend_xyz"]["status"] == "failed"
    repeat = sections["repeat"]["data"]
    assert repeat["aot_eager"]["status"] == "ok" and repeat["no_such_backend_xyz"]["status"] == "ok"
    assert all(r["time_s"] is None for r in repeat["no_such_backend_xyz"]["data"]["rows"])
    markdown = json_path.with_suffix(".md").read_text()
    assert "## seed MLP" in markdown and "FAILED" in markdown
    assert list(tmp_path.glob("*-repeat-aot_eager.png"))
