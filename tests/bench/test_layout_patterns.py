"""Issue 42's acceptance script (benchmarks/acceptance/layout_patterns.py): its CPU smoke run measures pattern 1's
configurations and one of the sweep's convolution nets into one file, recording brrr's layout decisions; the
report judges each configuration against eager and Inductor's better mode and the sweep's convolution nets by
the issue's three numbers."""

import json

import pytest
from torch import nn

from tests.bench.benchmark_scripts import load


@pytest.fixture(scope="module")
def layouts():
    return load("acceptance", "layout_patterns")


def test_quick_run_measures_patterns_and_sweep_convnets_into_one_file(layouts, tmp_path, monkeypatch):
    import measure

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    decisions = ["a decision of an earlier configuration"]
    monkeypatch.setattr(layouts, "layout_log", lambda: {"layout_decisions": decisions})
    measured = measure.measure

    def measure_and_decide(config, *args, **kwargs):   # stands in for the layouts pass, which times on a GPU
        decisions.append(f"inference graph of {config.name}: converted to channels_last")
        return measured(config, *args, **kwargs)

    monkeypatch.setattr(measure, "measure", measure_and_decide)
    common = ["--quick", "--out", str(tmp_path), "--keep-caches", "--commit", "abc1234"]
    assert layouts.main(common + ["--only", "1"]) == 0
    assert layouts.main(common + ["--sweep-convnets", "--only", "tv-resnet18-infer-bf16", "--resume"]) == 0
    assert layouts.main(common + ["--only", "depthwise-conv9x9-infer-bf16", "--resume"]) == 0   # measured: kept
    [path] = tmp_path.glob("*-cpu-abc1234-layout-patterns.json")
    results = json.loads(path.read_text())
    env = results["environment"]
    assert env["device"] == "cpu" and env["backends"] == ["eager", "brrr"] and env["mode"] == "quick"
    assert [c["only"] for c in env["calls"]] == ["1", "tv-resnet18-infer-bf16", "depthwise-conv9x9-infer-bf16"]
    configs = results["configs"]
    assert {n: e["pattern"] for n, e in configs.items()} == {
        "depthwise-conv9x9-infer-bf16": 1, "convmixer-blocks-infer-bf16": 1, "tv-resnet18-infer-bf16": "sweep"}
    for name, entry in configs.items():
        assert entry["status"] == "ok", (name, entry.get("traceback"))
        rows = entry["rows"]
        assert set(rows) == {"eager", "brrr"} and rows["brrr"]["status"] == "ok", (name, rows["brrr"])
        assert 0 <= rows["brrr"]["error_vs_eager"] <= 3e-2 and rows["brrr"]["median_s"] > 0
        verdict = entry["verdict"]
        assert verdict["at_or_below_best_inductor"] is None and verdict["pass"] == verdict["at_or_below_eager"]
        assert entry["layout_decisions"] == [f"inference graph of {name}: converted to channels_last"]
    markdown = path.with_suffix(".md").read_text()
    assert markdown.startswith("# Layout patterns") and "Patterns passing: 1 " in markdown
    assert "The sweep's convolution nets: 1 measured of 1 selected" in markdown
    assert "- criterion met: —" in markdown   # no Inductor on the CPU
    assert all(f"| {name} |" in markdown for name in configs)
    assert "## Layout decisions" in markdown and "converted to channels_last" in markdown


def _entry(brrr_s, eager_s=1.0, inductor_s=1.5, reduce_overhead_s=1.0, brrr_status="ok", pattern="sweep"):
    rows = {"eager": {"status": "ok", "median_s": eager_s}, "brrr": {"status": brrr_status, "median_s": brrr_s},
            "inductor": {"status": "ok", "median_s": inductor_s},
            "inductor-reduce-overhead": {"status": "ok", "median_s": reduce_overhead_s}}
    return {"status": "ok", "rows": rows, "pattern": pattern, "train": False, "precision": "bf16"}


def _results(**configs):
    import pattern_report

    for entry in configs.values():
        entry["verdict"] = pattern_report.verdict(entry)
    env = {"commit": "abc1234", "device": "NVIDIA H100", "date": "2026-11-28", "torch": "2.11", "triton": "3.6",
           "mode": "full", "backends": ["eager", "brrr", "inductor", "inductor-reduce-overhead"]}
    return {"environment": env, "configs": configs}


def test_sweep_criterion_geomean_behind_and_slower_than_eager(layouts):
    import layout_report as report

    left_out = {"status": "unavailable", "pattern": "sweep",
                "error": f"NotConvNet: {report.NOT_CONV_NET}: 0 sliding 2-D convolution(s)"}
    results = _results(a=_entry(0.8), b=_entry(0.85), vit=left_out, c={"status": "skipped", "pattern": "sweep"},
                       own=_entry(2.0, pattern=1))
    c = report.sweep_criterion(results)
    assert c["geomean_over_best_inductor"] == pytest.approx((1 / 0.8 / 0.85) ** 0.5)   # own pattern 1 left out
    assert c["pass"] is True and (c["configurations"], c["measured"], c["not_run"]) == (4, 2, 1)
    assert c["not_conv_nets"] == ["vit"]
    markdown = report.markdown(results)
    assert "left out: 1 (vit)" in markdown and "| vit |" not in markdown and "- criterion met: yes" in markdown

    results = _results(a=_entry(0.5), behind=_entry(1.12, eager_s=2.0), slower=_entry(1.05, eager_s=1.0,
                                                                                         inductor_s=1.2))
    c = report.sweep_criterion(results)
    assert c["geomean_over_best_inductor"] > report.GEOMEAN_GOAL   # fast on average is not enough
    assert c["behind_best_inductor"] == ["behind"] and c["slower_than_eager"] == ["slower"] and c["pass"] is False

    c = report.sweep_criterion(_results(a=_entry(0.5), wrong=_entry(0.5, brrr_status="wrong")))
    assert c["brrr_not_ok"] == ["wrong"] and c["pass"] is False   # fast and wrong fails it
    c = report.sweep_criterion(_results(a=_entry(0.9), b=_entry(0.9)))
    assert c["geomean_over_best_inductor"] == pytest.approx(1 / 0.9) and c["pass"] is False   # under 1.15x
    assert report.sweep_criterion(_results(own=_entry(1.0, pattern=2))) is None


def test_each_configuration_says_whether_brrr_is_at_or_below_inductors_better_mode(layouts):
    import layout_report as report

    results = _results(fast=_entry(0.9, pattern=1), slow=_entry(1.2, pattern=1), other=_entry(0.5, pattern=2))
    assert results["configs"]["fast"]["verdict"]["at_or_below_best_inductor"] is True
    assert results["configs"]["slow"]["verdict"]["at_or_below_best_inductor"] is False
    markdown = report.markdown(results)
    assert "Patterns passing: 1 **no**, 2 yes" in markdown and "The sweep's convolution nets:" not in markdown
    [slow] = [row for row in markdown.splitlines() if row.startswith("| 1 | slow |")]
    assert "| 1.20x | 1.20x | **no** | **no** |" in slow


def test_patterns_are_nchw_as_created_in_the_issues_precisions(layouts):
    import layout_models
    import pattern_bench

    every = layout_models.patterns()
    assert sorted({n for n, _ in every}) == [1, 2, 3, 4] and len({c.name for _, c in every}) == len(every)
    sweep_names = {c.name for _, c in layout_models.sweep_convnets()}
    assert not sweep_names & {c.name for _, c in every}   # both can share one file
    for number, config in every:
        assert (config.precision, config.train) == (("fp32", True) if number == 3 else ("bf16", False)), config.name
        work = config.build("cpu", True)
        images = [x for x in work.inputs if getattr(x, "dim", lambda: 0)() == 4]
        assert images and all(x.is_contiguous() for x in images), config.name   # NCHW, not channels_last
    assert [c.name for _, c in pattern_bench.named(every, "4")] == ["efficientnet_b0-infer-bf16",
                                                                    "deeplabv3_resnet50-infer-bf16"]


def test_sweep_convnets_are_the_sweeps_image_configurations_that_slide_convolutions(layouts):
    import layout_models
    from models import TinyConvNet, Unavailable, Workload

    chosen = layout_models.sweep_convnets()
    names = [c.name for _, c in chosen]
    assert {n for n, _ in chosen} == {"sweep"} and len(set(names)) == len(names)
    assert {c.family for _, c in chosen} == {"timm", "torchvision", "transformers"}   # no zoo: channels_last
    assert "hf-convnext-infer-bf16" in names and "tv-resnet18-train-fp32" in names
    assert not any(n.startswith(("hf-bert", "hf-gpt2", "audio-", "pyg-")) for n in names)

    vit_like = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.Flatten(2), nn.Linear(16, 16))   # patches only
    assert layout_models.sliding_convolutions(vit_like) == 0 and layout_models.sliding_convolutions(TinyConvNet()) == 3
    checked = layout_models._convnet_only(lambda device, quick: Workload(vit_like, ()))
    with pytest.raises(Unavailable, match="not a convolution net: 0 sliding"):
        checked("cpu", True)
    assert layout_models._convnet_only(lambda device, quick: Workload(TinyConvNet(), ()))("cpu", True).model
