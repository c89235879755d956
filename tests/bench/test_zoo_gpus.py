"""The zoo on several GPUs at once (--gpus): configurations split by cost, one worker process per GPU, the
workers' files merged into one. On the CPU the GPU index only labels a worker; the workers still run."""

import json
import os

from tests.bench.benchmark_scripts import load


def _load(name):
    return load("zoo", name)


def test_quick_zoo_on_two_gpus_merges_the_workers_into_one_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    zoo, models = _load("run_zoo"), _load("models")
    only = "seed-mlp-train,resnet50-infer,llama-decode"
    code = zoo.main(["--quick", "--gpus", "2", "--out", str(tmp_path), "--only", only, "--backends", "eager,brrr",
                     "--warm-compile", "brrr", "--commit", "abc1234"])
    assert code == 0
    [path] = tmp_path.glob("*-cpu-abc1234.json")                    # the merged file, named as one GPU's
    assert sorted(p.name[11:] for p in tmp_path.glob("*.json")) == [   # after the date: the workers' own
        "cpu-abc1234-gpu0.json", "cpu-abc1234-gpu1.json", "cpu-abc1234.json"]
    results = json.loads(path.read_text())
    configs = results["configs"]
    assert list(configs) == ["llama-decode", "resnet50-infer", "seed-mlp-train"]     # each once, the zoo's order
    expected = {c.name: i for i, part in enumerate(models.parts(models.select(only), 2)) for c in part}
    assert {name: e["gpu_index"] for name, e in configs.items()} == expected
    assert set(expected.values()) == {0, 1}
    for entry in configs.values():
        assert entry["status"] == "ok", entry.get("traceback")
        assert entry["concurrent_gpus"] == 2
        assert all(r["status"] == "ok" for r in entry["result"]["rows"])
    env = results["environment"]
    assert env["concurrent_gpus"] == 2 and "worker" not in env
    workers = {w["gpu_index"]: w for w in env["workers"]}
    assert sorted(workers) == [0, 1]
    for i, w in workers.items():
        assert w["cuda_visible_devices"] == str(i)
        assert w["configs"] == sum(1 for g in expected.values() if g == i)
        assert w["torch_threads"] <= max(1, env["host_cpus"] // 2)
    assert set(results["warm_compile"]) == set(expected)          # each worker's warm-compile process, merged
    assert all(t["brrr"] > 0 for t in results["warm_compile"].values())
    markdown = path.with_suffix(".md").read_text()
    table = markdown.split("## Configurations")[1].split("##")[0]
    for name, gpu in expected.items():
        [row] = [line for line in table.splitlines() if line.startswith(f"| {name} |")]
        assert row.split(" | ")[2] == str(gpu)
    assert "Workers ran at once on one host, one GPU each: gpu 0 (" in markdown


def test_parts_balance_costs_longest_first_and_are_deterministic():
    models = _load("models")
    total = sum(c.cost for c in models.CONFIGS)
    for count in range(1, 9):
        parts = models.parts(models.CONFIGS, count)
        assert parts == models.parts(models.CONFIGS, count)
        assert sorted(c.name for part in parts for c in part) == sorted(models.BY_NAME)
        for part in parts:
            assert part == [c for c in models.CONFIGS if c in part]          # the zoo's order
            # longest first: the cheapest configuration went in last, onto the least loaded part
            assert sum(c.cost for c in part) - min(c.cost for c in part) <= total / count
    assert models.parts(models.select("seed"), 3) == [[models.BY_NAME["seed-mlp-train"]], [], []]


def test_a_part_split_across_gpus_covers_it_once():
    models = _load("models")
    for k in range(3):
        part = models.parts(models.CONFIGS, 3)[k]
        shares = models.parts(part, 2)
        assert sorted(c.name for s in shares for c in s) == sorted(c.name for c in part)


def test_workers_get_their_gpu_their_cpus_and_this_checkout(monkeypatch):
    zoo = _load("run_zoo")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    env = zoo.worker_env(1, [8, 9, 10, 11])
    assert env["CUDA_VISIBLE_DEVICES"] == "3"                       # the second of the GPUs this process sees
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "4" and env["OMP_NUM_THREADS"] == "3"   # explicit wins
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(zoo.HERE.parents[1])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert zoo.worker_env(1, [0])["CUDA_VISIBLE_DEVICES"] == "1"
    shares = zoo.cpu_shares(2)
    cpus = zoo.host_cpus()
    if len(cpus) >= 2:
        assert not set(shares[0]) & set(shares[1]) and len(shares[0]) == len(shares[1]) == len(cpus) // 2
    args = zoo.parse_args(["--quick", "--gpus", "2", "--backends", "eager,brrr", "--budget-s", "100"])
    models = _load("models")
    cmd = zoo.worker_command(args, 1, 2, models.select("seed"), [4, 5], "abc", "2026-01-01")
    assert cmd[cmd.index("--worker") + 1] == "1/2" and cmd[cmd.index("--only") + 1] == "seed-mlp-train"
    assert cmd[cmd.index("--cpus") + 1] == "4,5" and "--quick" in cmd and "--part" not in cmd
    assert zoo._ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_merging_calls_keeps_each_calls_workers_and_gpu_indices(tmp_path):
    report = _load("report")
    paths = []
    for call, part in enumerate(("1/2", "2/2")):
        workers = [{"gpu_index": i, "cpus": f"{16 * i}-{16 * i + 15}", "torch_threads": 16, "configs": 1,
                    "part": part} for i in (0, 1)]
        env = {"device": "GPU", "torch": "2", "triton": "3", "commit": "abc", "date": "d", "dtype": "bfloat16",
               "mode": "full", "backends": ["eager"], "part": part, "concurrent_gpus": 2, "workers": workers}
        configs = {name: {"name": name, "family": "seed", "train": True, "status": "ok", "kind": "static",
                          "gpu_index": i, "concurrent_gpus": 2,
                          "result": {"rows": [{"backend": "eager", "status": "ok", "median_s": 1e-3}]}}
                   for i, name in enumerate(("llama-train", "resnet50-infer") if call else ("bert-mlm-train",
                                                                                         "seed-mlp-train"))}
        paths.append(tmp_path / f"{call}.json")
        paths[-1].write_text(json.dumps({"environment": env, "configs": configs}))
    merged = report.merge(paths)
    assert [(w["part"], w["gpu_index"]) for w in merged["environment"]["workers"]] == [
        ("1/2", 0), ("1/2", 1), ("2/2", 0), ("2/2", 1)]
    assert {n: e["gpu_index"] for n, e in merged["configs"].items()} == {
        "bert-mlm-train": 0, "seed-mlp-train": 1, "llama-train": 0, "resnet50-infer": 1}
    markdown = report.markdown(merged)
    assert "part 1/2: gpu 0 (1 configurations, CPUs 0-15, 16 torch threads)" in markdown
    assert "part 2/2: gpu 0 (" in markdown and "| resnet50-infer | train | 1 |" in markdown
