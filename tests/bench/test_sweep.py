"""The sweep (benchmarks/sweep/): its enumeration covers every family and precision, its CPU smoke run writes
the JSON and Markdown, the peer cache is reused and invalidated, a wrong backend is caught, and the report's
summary counts what the issue asks."""

import json
import math

import pytest
import torch

from tests.bench.benchmark_scripts import load


@pytest.fixture(scope="module")
def catalog():
    return load("sweep", "catalog")


def test_enumeration_covers_every_family_and_precision(catalog):
    configs = catalog.all_configs()
    names = [c.name for c in configs]
    assert len(names) == len(set(names)) and len(configs) >= 150
    assert sum(c.train for c in configs) >= 50
    assert {c.family for c in configs} == set(catalog.FAMILIES)
    for family in catalog.FAMILIES:   # each family has all three precisions or is the zoo's own bf16
        precisions = {c.precision for c in configs if c.family == family}
        assert precisions == ({"bf16"} if family == "zoo" else set(catalog.PRECISIONS)), (family, precisions)
    timm = [c for c in configs if c.family == "timm"]
    assert sum(not c.train for c in timm) >= 60 and sum(c.train for c in timm) >= 25
    assert len(catalog.TRANSFORMERS) >= 25
    hf = [c for c in configs if c.family == "transformers"]
    assert sum("padded-lengths" in c.name for c in hf) >= 5
    kinds = {kind for _, _, kind, _ in catalog.TRANSFORMERS}
    assert {"masked", "causal", "seq2seq", "speech-seq2seq", "ctc", "image"} <= kinds
    assert len([c for c in configs if c.family == "others"]) >= 5
    assert len([c for c in configs if c.family == "zoo"]) == 21
    assert catalog.select(configs, family="zoo") == [c for c in configs if c.family == "zoo"]
    with pytest.raises(ValueError):
        catalog.select(configs, only="no-such-configuration")


def test_timm_and_torchvision_rules_pick_by_registration_not_by_hand(catalog):
    modules = {"resnet": ["resnet10t", "resnet18", "resnet50", "resnet101", "resnet152"],
               "vit": ["vit_large_patch16_224", "vit_small_patch16_384", "vit_base_patch16_224", "a", "b"],
               "tiny": ["tiny_a", "tiny_b"]}   # too few models: not a family users pick from
    assert catalog.timm_rule(modules) == {"resnet": "resnet10t", "vit": "vit_base_patch16_224"}
    classifiers, segmenters = catalog.torchvision_rule(
        ["resnet18", "resnet50", "vit_b_16", "vit_l_16", "regnet_y_400mf", "regnet_x_400mf", "wide_resnet50_2"],
        ["fcn_resnet50", "fcn_resnet101", "lraspp_mobilenet_v3_large"])
    assert classifiers == ["resnet18", "vit_b_16", "regnet_y_400mf", "wide_resnet50_2"]
    assert segmenters == ["fcn_resnet50", "lraspp_mobilenet_v3_large"]
    pinned = catalog.pins()
    assert len(pinned["timm"]["models"]) >= 60 and len(pinned["torchvision"]["classification"]) >= 10


def test_quick_sweep_writes_json_and_markdown_for_every_family(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    sweep = load("sweep", "run_sweep")
    only = "timm-convnext_zepto_rms-infer,tv-resnet18-infer-bf16,hf-gpt2-infer-bf16,pyg-gcn-infer-fp32,zoo-seed-mlp-train"
    code = sweep.main(["--quick", "--out", str(tmp_path), "--only", only, "--keep-caches", "--commit", "abc1234",
                       "--peers", str(tmp_path / "no-peers.json")])
    assert code == 0
    [path] = tmp_path.glob("*-cpu-abc1234.json")
    results = json.loads(path.read_text())
    assert set(results["configs"]) == set(only.split(","))
    assert results["environment"]["dynamo"] == "defaults"
    for name, entry in results["configs"].items():
        assert entry["status"] == "ok", (name, entry.get("traceback"))
        rows = entry["rows"]
        assert set(rows) == {"eager", "brrr"}
        assert rows["brrr"]["status"] == "ok", rows["brrr"]
        assert rows["brrr"]["median_s"] > 0 and rows["brrr"]["steady_s"] > 0 and rows["brrr"]["first_call_s"] > 0
        assert rows["brrr"]["error_vs_reference"] >= 0
        assert isinstance(entry["brrr_fallbacks"], list) and isinstance(entry["graph_breaks"], list)
    assert results["configs"]["zoo-seed-mlp-train"]["train"] is True
    markdown = path.with_suffix(".md").read_text()
    assert "brrr passed 5/5" in markdown and "| training | 1 |" in markdown and "| inference | 4 |" in markdown


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


class _Loss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _Tiny()

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.model(x), y)


def _tiny_config(catalog, models, train, precision):
    def build(device, quick):
        torch.manual_seed(0)
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        x = torch.randn(32, 8, dtype=dtype)
        if train:
            return models.Workload(_Loss().to(dtype).train(), (x, torch.randint(0, 4, (32,))), train=True)
        return models.Workload(_Tiny().to(dtype).eval(), (x,))
    return catalog.Config(f"tiny-{precision}-{'train' if train else 'infer'}", "others", train, build, precision)


def _noisy_backend(gm, example_inputs):
    """A backend that computes the wrong function: every floating output 1% too large."""
    def run(*args):
        out = gm(*args)
        return type(out)(o * 1.01 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in out)
    return run


@pytest.mark.parametrize("precision", ["amp", "fp32"])
def test_a_training_step_under_an_optimizer_is_judged_from_the_same_weights(catalog, precision):
    measure = load("sweep", "measure")
    models = load("zoo", "models")
    config = _tiny_config(catalog, models, True, precision)
    work = config.build("cpu", True)
    before = [p.detach().clone() for p in work.model.parameters()]
    rows = measure.measure(config, work, ["eager", "aot_eager"], "cpu", warmup=1, rep=2)
    assert rows["aot_eager"]["status"] == "ok", rows["aot_eager"]
    # judged from the saved weights: an optimizer that had moved them would show as an error
    assert rows["aot_eager"]["error_vs_eager"] < (1e-2 if precision == "amp" else 1e-5)
    assert all(torch.equal(a, b) for a, b in zip(before, work.model.parameters()))   # put back afterwards


def test_a_backend_computing_another_function_is_wrong(catalog):
    measure = load("sweep", "measure")
    models = load("zoo", "models")
    config = _tiny_config(catalog, models, False, "bf16")
    rows = measure.measure(config, config.build("cpu", True), ["eager", _noisy_backend], "cpu", warmup=1, rep=2)
    noisy = rows[_noisy_backend]
    assert noisy["status"] == "wrong" and "3x eager's" in noisy["reason"]


def _fake_measure(calls, later=1.1):
    def fake(config, work, backends, device, warmup, rep, profile=False):
        calls.append(list(backends))
        scale = later if len(calls) > 1 else 1.0   # the host of later runs is this much slower
        times = {"eager": 10e-3, "brrr": 5e-3, "inductor": 8e-3, "inductor-reduce-overhead": 6e-3}
        return {b: {"backend": b, "status": "ok", "median_s": times[b] * scale, "steady_s": times[b] * scale,
                    "peak_memory_bytes": 100} for b in ["eager"] + [b for b in backends if b != "eager"]}
    return fake


def test_peer_cache_is_reused_scaled_and_invalidated_by_versions_or_gpu(catalog, tmp_path):
    sweep = load("sweep", "run_sweep")
    peers = load("sweep", "peers")
    models = load("zoo", "models")
    config = _tiny_config(catalog, models, False, "fp32")
    backends = ["eager", "brrr", "inductor", "inductor-reduce-overhead"]
    calls = []
    cache = peers.PeerCache(tmp_path / "peers.json")
    h100 = sweep.Versions("H100", "2.11", "3.6", "abc", "d1")
    first = sweep.run_config(config, backends, "cpu", cache, h100, True, 5, False, measure_fn=_fake_measure(calls))
    assert calls[-1] == backends and first["status"] == "ok"
    cache.write()
    cache = peers.PeerCache(tmp_path / "peers.json")   # a later process reads it back
    second = sweep.run_config(config, backends, "cpu", cache, h100, True, 5, False, measure_fn=_fake_measure(calls))
    assert calls[-1] == ["eager", "brrr"]                                 # the peers came from the cache
    peer = second["rows"]["inductor"]
    assert math.isclose(peer["median_s"], 8.8e-3) and math.isclose(peer["cached"]["eager_scale"]["median_s"], 1.1)
    for changed in (sweep.Versions("H200", "2.11", "3.6", "abc", "d2"), sweep.Versions("H100", "2.12", "3.6", "abc", "d2"),
                    sweep.Versions("H100", "2.11", "3.7", "abc", "d2")):
        sweep.run_config(config, backends, "cpu", cache, changed, True, 5, False, measure_fn=_fake_measure(calls))
        assert calls[-1] == backends                                      # another GPU or version: measured again
    (tmp_path / "torn.json").write_text('{"half')
    assert peers.PeerCache(tmp_path / "torn.json").entries == {}         # a torn file is not trusted


def test_peers_cached_under_an_eager_too_far_from_this_runs_are_measured_again(catalog, tmp_path):
    """Scaling by eager's ratio assumes every backend moves with eager; past STALE_SCALE the peers are measured
    beside brrr again, and the cache keeps the new rows."""
    sweep = load("sweep", "run_sweep")
    peers = load("sweep", "peers")
    models = load("zoo", "models")
    config = _tiny_config(catalog, models, False, "fp32")
    backends = ["eager", "brrr", "inductor", "inductor-reduce-overhead"]
    calls, cache = [], peers.PeerCache(tmp_path / "peers.json")
    h100 = sweep.Versions("H100", "2.11", "3.6", "abc", "d1")
    fake = _fake_measure(calls, later=2.0)   # this run's host: eager twice as slow as the cached run's
    sweep.run_config(config, backends, "cpu", cache, h100, True, 5, False, measure_fn=fake)
    again = sweep.run_config(config, backends, "cpu", cache, h100, True, 5, False, measure_fn=fake)
    assert calls[1:] == [["eager", "brrr"], ["inductor", "inductor-reduce-overhead"]]
    peer = again["rows"]["inductor"]
    assert "cached" not in peer and math.isclose(peer["median_s"], 16e-3)   # measured now, not scaled
    [entry] = cache.entries.values()
    assert math.isclose(entry["eager"]["median_s"], 20e-3)


def test_a_shared_gpu_keeps_memory_but_neither_caches_nor_compares_its_times(catalog, tmp_path):
    """Workers sharing a GPU (`--share-gpu`) contend for it: a cached peer is taken as it is however far eager
    strays, nothing they measure is cached, and the report leaves their times out of every speed line."""
    sweep = load("sweep", "run_sweep")
    peers = load("sweep", "peers")
    report = load("sweep", "sweep_report")
    models = load("zoo", "models")
    config = _tiny_config(catalog, models, True, "fp32")
    backends = ["eager", "brrr", "inductor", "inductor-reduce-overhead"]
    h100 = sweep.Versions("H100", "2.11", "3.6", "abc", "d1")
    calls, empty = [], peers.PeerCache(tmp_path / "none.json")
    fresh = sweep.run_config(config, backends, "cpu", empty, h100, True, 5, False,
                             measure_fn=_fake_measure(calls), shared=3)
    assert calls == [backends] and empty.entries == {}                    # measured, not cached
    cache = peers.PeerCache(tmp_path / "peers.json")
    sweep.run_config(config, backends, "cpu", cache, h100, True, 5, False, measure_fn=_fake_measure(calls))
    calls = ["the cached run"]                                           # later runs: eager twice its time
    slow = _fake_measure(calls, later=2.0)
    shared = sweep.run_config(config, backends, "cpu", cache, h100, True, 5, False, measure_fn=slow, shared=3)
    assert calls[1:] == [["eager", "brrr"]]                               # the cached peers, not re-measured
    assert shared["shared_gpu"] == 3 and shared["rows"]["inductor"]["peak_memory_bytes"] == 100
    results = {"environment": {"device": "GPU", "commit": "abc", "date": "d", "torch": "2", "triton": "3"},
               "configs": {"a": fresh, "b": shared}}
    s = report.summarize(results)
    assert s["training"]["brrr_over_eager"] is None and s["slower_than_eager"] == []
    assert s["training_memory_ratio"] == {"a": 1.0, "b": 1.0}
    assert "memory only: GPU shared by 3" in report.markdown(results)


def _row(backend, ms, status="ok", peak=None, reserved=None):
    return {"backend": backend, "status": status, "median_s": ms / 1e3, "peak_memory_bytes": peak,
            "peak_reserved_bytes": reserved}


def test_report_compares_with_the_better_inductor_mode_and_counts_what_the_issue_asks(tmp_path):
    report = load("sweep", "sweep_report")
    configs = {
        "a": {"status": "ok", "train": True, "rows": {
            "eager": _row("eager", 10), "brrr": _row("brrr", 5, peak=200, reserved=300),
            "inductor": _row("inductor", 8, peak=100),
            "inductor-reduce-overhead": _row("inductor-reduce-overhead", 4, peak=50, reserved=400)}},
        "b": {"status": "ok", "train": False, "rows": {"eager": _row("eager", 10), "brrr": _row("brrr", 11),
                                                       "inductor": _row("inductor", 12)}},
        "c": {"status": "ok", "train": False, "rows": {"eager": _row("eager", 10), "brrr": _row("brrr", 2, "wrong"),
                                                       "inductor": _row("inductor", 5)}},
        "d": {"status": "unavailable", "train": False},
    }
    results = {"environment": {"device": "GPU", "commit": "abc", "date": "d", "torch": "2", "triton": "3"},
               "configs": configs}
    s = report.summarize(results)
    assert s["ran"] == 3 and s["brrr_passed"] == 2 and s["not_run"]["unavailable"] == 1
    assert math.isclose(s["training"]["brrr_over_best_inductor"], 4 / 5)        # against reduce-overhead
    assert math.isclose(s["training"]["brrr_over_inductor"], 8 / 5)
    assert s["slower_than_eager"] == ["b"] and s["behind_best_inductor"] == ["a"]
    assert s["brrr_not_ok"] == ["c"] and s["training_memory_ratio"] == {"a": 2.0}
    assert s["training_memory_over_reduce_overhead"] == {"allocated": 4.0, "reserved": 0.75}
    assert "reduce-overhead (geometric mean): allocated 4.00x, reserved 0.75x" in report.markdown(results)
    assert [w["name"] for w in s["worst"]][:2] == ["a", "b"]
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Where it stands\n")
    report.update_readme(readme, results, "benchmarks/results/sweep/x.json")
    report.update_readme(readme, results, "benchmarks/results/sweep/x.json")   # replaced, not appended
    text = readme.read_text()
    assert text.count(report.README_BEGIN) == 1 and "brrr passed 2/3" in text


def test_a_run_cut_short_has_measured_every_family(catalog):
    order = catalog.interleaved(catalog.all_configs())
    assert sorted(c.name for c in order) == sorted(c.name for c in catalog.all_configs())
    assert {c.family for c in order[:len(catalog.FAMILIES)]} == set(catalog.FAMILIES)


def test_a_run_of_training_configurations_alone_takes_every_family_s_and_nothing_else(catalog):
    import argparse

    sweep = load("sweep", "run_sweep")
    args = argparse.Namespace(only=None, worst=None, family=None, mode="train")
    chosen = sweep.selected(args)
    training = [c for c in catalog.all_configs() if c.train]
    assert sorted(c.name for c in chosen) == sorted(c.name for c in training) and all(c.train for c in chosen)
    assert {c.family for c in chosen[:len(catalog.FAMILIES)]} == set(catalog.FAMILIES)
    args.mode = "infer"
    assert not any(c.train for c in sweep.selected(args))
