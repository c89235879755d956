"""The zoo's CPU smoke run (--quick: tiny models of the same code paths) writes its JSON and Markdown, with
correctness judged against the fp32 copy, a changing-shape configuration, and a warm compile in a new process."""

import json

import pytest

from tests.bench.benchmark_scripts import load


def _load(name):
    return load("zoo", name)


def test_quick_zoo_writes_results_for_static_and_changing_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    zoo = _load("run_zoo")
    code = zoo.main(["--quick", "--out", str(tmp_path), "--only", "seed-mlp-train,llama-decode,bert-lengths-infer",
                     "--backends", "eager,aot_eager,brrr", "--warm-compile", "brrr", "--keep-caches",
                     "--commit", "abc1234"])
    assert code == 0
    [path] = tmp_path.glob("*-cpu-abc1234.json")
    results = json.loads(path.read_text())
    configs = results["configs"]
    assert list(configs) == ["llama-decode", "bert-lengths-infer", "seed-mlp-train"]
    for entry in configs.values():
        assert entry["status"] == "ok", entry.get("traceback")
        rows = {r["backend"]: r for r in entry["result"]["rows"]}
        assert set(rows) == {"eager", "aot_eager", "brrr"}
        assert all(r["status"] == "ok" for r in rows.values()), rows
        # nothing runs as ATen, at op scope (recorded too: LLaMA decode's KV-cache write was one) or wider
        assert entry["brrr_fallbacks"] == [] and entry["loss_rewrites"] == []   # tiny logits: below the rewrite's floor
        assert entry["graph_breaks"] == []
    assert results["environment"]["dynamo_skips_logging"] is True
    decode = {r["backend"]: r for r in configs["llama-decode"]["result"]["rows"]}
    assert decode["eager"]["error_vs_reference"]["norm_rel"] > 0    # bf16 against its own fp32 copy
    shapes = {r["backend"]: r for r in configs["bert-lengths-infer"]["result"]["rows"]}
    assert [p["shape"] for p in shapes["brrr"]["points"]] == ["len 8", "len 16", "len 24", "len 32", "len 12"]
    assert shapes["brrr"]["graphs_compiled"] >= 1
    assert results["warm_compile"]["seed-mlp-train"]["brrr"] > 0   # measured in a new process
    markdown = path.with_suffix(".md").read_text()
    assert "pass rate (ran and correct): 9/9" in markdown and "bert-lengths-infer: per shape" in markdown


def test_parts_split_the_zoo_by_cost_and_keep_its_order():
    models = _load("models")
    parts = models.parts(models.CONFIGS, 3)
    assert sorted(c.name for part in parts for c in part) == sorted(models.BY_NAME) and len(parts) == 3
    assert all(part == [c for c in models.CONFIGS if c in part] for part in parts)
    costs = [sum(c.cost for c in part) for part in parts]
    assert max(costs) - min(costs) <= max(c.cost for c in models.CONFIGS)
    with pytest.raises(ValueError):
        models.select("no-such-model")
    assert {c.family for c in models.select("vision")} == {"vision"}


def test_readme_block_is_generated_from_a_results_file(tmp_path):
    report = _load("report")
    row = lambda b, ms, **kw: {"backend": b, "status": "ok", "median_s": ms / 1e3, **kw}  # noqa: E731
    results = {"environment": {"device": "GPU", "torch": "2", "triton": "3", "commit": "abc", "date": "d",
                               "dtype": "bfloat16", "mode": "full", "backends": ["eager", "brrr", "inductor"]},
               "configs": {"a": {"name": "a", "family": "vision", "train": False, "status": "ok", "kind": "static",
                                 "result": {"rows": [row("eager", 10), row("brrr", 5), row("inductor", 4)]}},
                           "b": {"name": "b", "family": "seed", "train": True, "status": "ok", "kind": "static",
                                 "result": {"rows": [row("eager", 10), row("brrr", 11), row("inductor", 20)]}}}}
    s = report.summary(results)
    assert s["pass_rate"] == 1.0 and s["worst"]["config"] == "b" and abs(s["worst"]["brrr_over_eager"] - 10 / 11) < 1e-9
    assert s["slower_than_eager"] == ["b: 1.10x eager's time"]
    assert abs(s["geomean"]["brrr over inductor, inference"] - 0.8) < 1e-9
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{report.README_BEGIN}\nold\n{report.README_END}\nafter\n")
    report.update_readme(readme, results, "benchmarks/results/zoo/x.json")
    text = readme.read_text()
    assert "old" not in text and "| a | 10.00 | 5.00 (2.00x) | 4.00 (2.50x) |" in text and text.endswith("after\n")


def test_merge_keeps_what_ran_and_each_configurations_commit(tmp_path):
    report = _load("report")
    env = lambda commit: {"device": "GPU", "torch": "2", "triton": "3", "commit": commit, "date": "d",  # noqa: E731
                          "dtype": "bfloat16", "mode": "full", "backends": ["eager", "brrr"], "part": None}
    ran = lambda name: {"name": name, "family": "seed", "train": True, "status": "ok", "kind": "static",  # noqa: E731
                        "result": {"rows": [{"backend": "eager", "status": "ok", "median_s": 1e-3}]}}
    skipped = lambda name: {"name": name, "family": "seed", "train": True, "status": "skipped",  # noqa: E731
                            "error": "budget"}
    first = {"environment": env("aaa"), "configs": {"resnet50-infer": ran("resnet50-infer"),
                                                    "llama-train": skipped("llama-train")}}
    second = {"environment": env("bbb"), "configs": {"resnet50-infer": skipped("resnet50-infer"),
                                                     "llama-train": ran("llama-train")}}
    paths = []
    for i, part in enumerate((first, second)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(part))
    merged = report.merge(paths)
    assert list(merged["configs"]) == ["llama-train", "resnet50-infer"]        # the zoo's order
    assert {n: (e["status"], e["commit"]) for n, e in merged["configs"].items()} == {
        "resnet50-infer": ("ok", "aaa"), "llama-train": ("ok", "bbb")}
    assert merged["environment"]["commit"] == "aaa, bbb" and "llama-train @bbb" in report.markdown(merged)


def test_budget_estimates_scale_with_the_backends_run():
    models = _load("models")
    densenet = models.BY_NAME["densenet121-train"]
    full = models.estimated_cost(densenet, ["eager", "brrr", "brrr-cudagraphs", "inductor"])
    two = models.estimated_cost(densenet, ["eager", "brrr"])
    assert full == densenet.cost
    assert two == pytest.approx(densenet.cost * 1.25 / 3.25)
    left = (two + full) / 2   # budget left that fits its two-backend run, not its four-backend one
    assert two < left < full
