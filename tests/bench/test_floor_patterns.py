"""The floor issue's acceptance script (benchmarks/acceptance/floor_patterns.py): its CPU smoke run measures one
configuration of each of the five patterns, brrr's results within tolerance of eager's, and writes the JSON and
the Markdown table; the verdicts (pattern_report.py, which the layout patterns share) apply the issue's two
criteria with their 3% slack."""

import json

import pytest

from tests.bench.benchmark_scripts import load

# one configuration per pattern: the ResNet stem and Whisper take as long again in Triton's interpreter
QUICK = "bn-relu-block-train-fp32,2,3,4,wav2vec2-ctc-host-lengths-train-amp"


@pytest.fixture(scope="module")
def floor():
    return load("acceptance", "floor_patterns")


def test_quick_run_measures_every_pattern_and_writes_json_and_markdown(floor, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert floor.main(["--quick", "--out", str(tmp_path), "--only", QUICK, "--keep-caches", "--commit", "abc1234"]) == 0
    [path] = tmp_path.glob("*-cpu-abc1234-floor-patterns.json")
    results = json.loads(path.read_text())
    env = results["environment"]
    assert env["device"] == "cpu" and env["commit"] == "abc1234" and env["torch"] and env["triton"]
    assert env["backends"] == ["eager", "brrr"] and env["mode"] == "quick"
    configs = results["configs"]
    assert sorted(e["pattern"] for e in configs.values()) == [1, 2, 3, 4, 5]
    for name, entry in configs.items():
        assert entry["status"] == "ok", (name, entry.get("traceback"))
        rows = entry["rows"]
        assert set(rows) == {"eager", "brrr"}
        assert rows["brrr"]["status"] == "ok", (name, rows["brrr"])   # within 3x eager's error vs the precise copy
        tolerance = 1e-4 if entry["precision"] == "fp32" else 3e-2
        assert 0 <= rows["brrr"]["error_vs_eager"] <= tolerance, (name, rows["brrr"]["error_vs_eager"])
        assert rows["brrr"]["median_s"] > 0 and rows["eager"]["median_s"] > 0
        verdict = entry["verdict"]
        assert verdict["at_or_below_best_inductor"] is None and isinstance(verdict["at_or_below_eager"], bool)
        assert verdict["pass"] == verdict["at_or_below_eager"]
        assert "kernels" in rows["brrr"]   # profiled (an empty list off CUDA)
    markdown = path.with_suffix(".md").read_text()
    assert markdown.startswith("# Floor patterns") and "| # | configuration | prec | eager ms | brrr ms |" in markdown
    assert all(f"| {name} |" in markdown for name in configs)


def _entry(brrr_s, eager_s=1.0, inductor_s=1.5, reduce_overhead_s=0.9, brrr_status="ok"):
    rows = {"eager": {"status": "ok", "median_s": eager_s}, "brrr": {"status": brrr_status, "median_s": brrr_s},
            "inductor": {"status": "ok", "median_s": inductor_s},
            "inductor-reduce-overhead": {"status": "ok", "median_s": reduce_overhead_s}}
    return {"status": "ok", "rows": rows}


def test_verdicts_take_inductors_better_mode_and_three_percent_slack(floor):
    import pattern_report as report

    v = report.verdict(_entry(0.92))
    assert v["best_inductor_mode"] == "inductor-reduce-overhead" and v["pass"] is True
    assert v["brrr_over_eager"] == pytest.approx(0.92) and v["brrr_over_best_inductor"] == pytest.approx(0.92 / 0.9)
    v = report.verdict(_entry(1.02))
    assert v["at_or_below_eager"] is True and v["at_or_below_best_inductor"] is False and v["pass"] is False
    assert report.verdict(_entry(0.5, brrr_status="wrong"))["pass"] is False   # fast and wrong is no floor
    assert report.verdict({"status": "error", "rows": {}})["pass"] is False
    results = {"configs": {"a": dict(_entry(0.5), pattern=1), "b": dict(_entry(2.0), pattern=1),
                           "c": dict(_entry(0.5), pattern=2), "d": {"status": "skipped", "pattern": 3}}}
    results["configs"]["e"] = dict(_entry(2.0), pattern="sweep")   # a sweep's configurations are judged together
    for entry in results["configs"].values():
        entry["verdict"] = report.verdict(entry)
    assert report.pattern_verdicts(results) == {"1": False, "2": True, "3": None}


def test_patterns_are_chosen_by_name_or_number(floor):
    import floor_models
    import pattern_bench

    every = floor_models.patterns()
    assert sorted({n for n, _ in every}) == [1, 2, 3, 4, 5] and len({c.name for _, c in every}) == len(every)
    assert [c.name for _, c in pattern_bench.named(every, "5")] == ["hf-whisper-train-fp32",
                                                                    "wav2vec2-ctc-host-lengths-train-amp"]
    assert [c.name for _, c in pattern_bench.named(every, "4,bn-relu-block-train-fp32")] == [
        "bn-relu-block-train-fp32", "gat-train-bf16"]
    with pytest.raises(ValueError):
        pattern_bench.named(every, "6")
