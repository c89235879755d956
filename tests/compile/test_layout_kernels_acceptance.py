"""Smoke run of benchmarks/acceptance/layout_kernels.py (--quick: tiny sizes, eager and brrr on CPU)."""

import json

from tests.compile.helpers import load_acceptance


def test_layout_acceptance_runs_every_case_and_reports_roof_fractions(tmp_path, capsys):
    probe = load_acceptance("layout_kernels")
    out = tmp_path / "rows.json"
    assert probe.main(["--quick", "--bandwidth", "1e10", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [c["case"] for c in data["cases"]] == list(probe.cases(True))
    for case in data["cases"]:
        assert case["ideal_bytes"] > 0
        assert [r["backend"] for r in case["rows"]] == ["eager", "brrr"]
        for row in case["rows"]:
            assert row["status"] == "ok", row
            assert row["fraction_of_copy_bandwidth"] == case["ideal_bytes"] / row["seconds"] / 1e10
    nchw = {c["case"]: c for c in data["cases"] if c["issue"] == 42}
    assert any("_forward_" in name for name in nchw) and any("_backward_" in name for name in nchw)
    for name, case in nchw.items():   # brrr's values against eager's, forward outputs and backward gradients
        brrr = case["rows"][1]
        assert brrr["error_vs_eager"]["norm_rel"] <= 1e-2, (name, brrr["error_vs_eager"])
    # a pool backward reads grad_out and the indices, writes grad_input: its input's values are never read
    n, c, h, w = 2, 4, 8, 8
    assert nchw["nchw_max_pool3x3s2_backward_2x4x8x8_bf16"]["ideal_bytes"] == (
        n * c * (h // 2) * (w // 2) * (2 + 8) + n * c * h * w * 2)
    printed = capsys.readouterr().out
    assert "of copy" in printed and "issue 42: brrr below 80% of copy" in printed


def test_layout_acceptance_cases_are_chosen_by_name_prefix_or_tag():
    probe = load_acceptance("layout_kernels")
    every = probe.cases(False)
    pick = lambda *tokens: [k for k, v in every.items() if probe.selected(k, v, tokens)]  # noqa: E731
    assert len(pick("nchw")) == 32 and all(k.startswith("nchw_") for k in pick("nchw"))
    assert pick("issue14") == ["bn_relu_inference", "bn_statistics_training", "add_relu", "transpose",
                               "layer_norm_channels_last"]
    assert len(pick("nchw_bn")) == 12 and len(pick("nchw_group_norm")) == 12 and len(pick("pool")) == 8
    assert len(pick("forward")) == len(pick("backward")) == 16
    assert pick("transpose") == ["transpose"]


def test_shortfalls_read_brrrs_launched_row_on_the_gpu():
    """On the GPU brrr's row is `brrr-launches` (its kernels, capturable by the bench): the shortfalls read it,
    and list a case under the target with its fraction."""
    probe = load_acceptance("layout_kernels")

    def result(case, fraction):
        return {"case": case, "issue": 42, "target": 0.8, "rows": [
            {"backend": "eager", "status": "ok", "fraction_of_copy_bandwidth": 0.1},
            {"backend": probe.BRRR_KERNELS, "status": "ok", "fraction_of_copy_bandwidth": fraction}]}
    lines = probe.shortfalls([result("slow", 0.5), result("fast", 0.9)])
    assert lines == ["issue 42: brrr below 80% of copy on 1 of 2 cases: slow (50.0%)"]


def test_the_run_turns_the_captured_trial_off_for_itself_alone(monkeypatch):
    """The run holds BRRR_CAPTURED_TRIAL=0 while it measures and gives the caller's environment back: a test run
    in the same process would otherwise find the trial off for every later test."""
    import os

    probe = load_acceptance("layout_kernels")
    monkeypatch.delenv("BRRR_CAPTURED_TRIAL", raising=False)
    seen = []
    monkeypatch.setattr(probe, "run", lambda args: seen.append(os.environ.get("BRRR_CAPTURED_TRIAL")) or 0)
    assert probe.main(["--quick"]) == 0
    assert seen == ["0"] and "BRRR_CAPTURED_TRIAL" not in os.environ
