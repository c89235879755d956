"""`analyze(..., verify=True)`: each remedy applied to a copy of the model and measured beside its prediction;
losses never advised; the measurements feed the calibration table."""

import io
import os
import json
import time

import pytest
import torch
from rich.console import Console

import brrr.analyze as analyze_mod
from brrr.analyze import analyze, calibration
from brrr.analyze.advise import advice_item
from brrr.analyze.verify import DoubledBatch, Prepared, REMEDIES, Remedy, tf32_matmuls, verify
from tests.analyze.synthetic import make_ceilings

CPU_APPLICABLE = {"compile", "inductor", "bf16", "batch"}   # an fp32 MLP on CPU: no CUDA, no convolutions


@pytest.fixture(scope="module")
def verified_mlp(mlp_target, cpu_ceilings, tmp_path_factory):
    """The seed MLP analyzed with verify=True, its calibration table in a fresh cache directory."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BRRR_CACHE_DIR", str(cache))
        model, inputs = mlp_target
        analysis = analyze(model, *inputs, ceilings=cpu_ceilings, verify=True)
        table = calibration.load_table(analysis.device)
    return analysis, table


def test_verify_on_the_seed_mlp_predicts_and_measures_every_applicable_remedy(verified_mlp):
    analysis, _ = verified_mlp
    rows = {row["kind"]: row for row in analysis.verify["remedies"]}
    assert list(rows) == [r.kind for r in REMEDIES]
    assert analysis.verify["baseline_s"] > 0
    for kind in CPU_APPLICABLE:
        row = rows[kind]
        assert row["status"] in ("gain", "loss"), row
        assert row["predicted_s"] > 0 and row["measured_s"] > 0
        assert row["prediction_error"] == pytest.approx((row["predicted_s"] - row["measured_s"]) / row["measured_s"])
        assert row["saving_s"] == pytest.approx(analysis.verify["baseline_s"] - row["measured_s"])
        assert (row["status"] == "loss") == (row["saving_s"] <= 0)
    for kind in set(rows) - CPU_APPLICABLE:
        assert rows[kind]["status"] == "not applicable" and rows[kind]["reason"]
        assert rows[kind]["measured_s"] is None
    # compiling happens in the warm-up and is reported apart from the step; eager remedies compile nothing
    assert rows["compile"]["compile_s"] > 0 and rows["inductor"]["compile_s"] > 0
    assert rows["bf16"]["compile_s"] is None and rows["batch"]["compile_s"] is None
    # the baseline is the faster of the model as analyzed timed before and after the remedies
    assert analysis.verify["baseline_s"] == min(analysis.verify["baseline_runs_s"])


def test_verify_is_in_the_json_the_terminal_report_and_the_html(verified_mlp, tmp_path):
    analysis, _ = verified_mlp
    data = json.loads(analysis.to_json())
    assert [r["kind"] for r in data["verify"]["remedies"]] == [r.kind for r in REMEDIES]
    assert set(data["predictions"]) >= CPU_APPLICABLE
    for item in data["advice"]:  # advice of a measured kind carries the measurement; no loss is advised
        row = next((r for r in data["verify"]["remedies"] if r["kind"] == item["kind"]), None)
        if row is not None and row["measured_s"] is not None:
            assert row["status"] == "gain"
            assert item["measured_s"] == row["measured_s"] and item["prediction_error"] == row["prediction_error"]
    out = io.StringIO()
    analysis.print(Console(file=out, width=80), top=3)
    text = out.getvalue()
    assert "Remedies applied and measured" in text and "inductor" in text
    table = text[text.index("Remedies applied and measured"):].splitlines()[:12]
    assert max(len(line) for line in table) <= 80
    page = tmp_path / "report.html"
    analysis.save_html(page)
    assert "Remedies applied and measured" in page.read_text()


def test_each_measurement_is_recorded_in_the_calibration_table(verified_mlp):
    analysis, table = verified_mlp
    for row in analysis.verify["remedies"]:
        if row["measured_s"] is not None:
            assert table[row["kind"]] == [pytest.approx(row["measured_s"] / row["predicted_uncalibrated_s"])]


class Slowed(torch.nn.Module):
    """A test double of a remedy's result: the model, plus a sleep per call."""

    def __init__(self, model, seconds):
        super().__init__()
        self.model, self.seconds = model, seconds

    def forward(self, *inputs):
        time.sleep(self.seconds)
        return self.model(*inputs)


class SleepyCompile(Remedy):
    kind, label = "compile", "a compile that sleeps"

    def prepare(self, model, inputs, target):
        return Prepared(Slowed(model, 0.05), inputs, warmup_calls=1)


class RaisingRemedy(Remedy):
    kind, label = "batch", "a remedy that raises"

    def prepare(self, model, inputs, target):
        raise RuntimeError("no such luck")


@pytest.fixture
def fresh_mlp_analysis(mlp_target, cpu_ceilings):
    model, inputs = mlp_target
    analysis = analyze(model, *inputs, ceilings=cpu_ceilings, calibrate=False)
    wall = analysis.wall_time_s
    # advice the sleepy remedy contradicts: a compile item and a fusion item that says brrr.compile does it
    analysis.advice = [advice_item("compile", "compile it", wall / 2, predicted_step_s=wall / 2),
                       advice_item("fuse", "fuse a -> b; brrr.compile does this", wall / 10),
                       advice_item("bf16", "autocast", wall / 4, predicted_step_s=wall * 3 / 4)]
    return analysis


def test_a_remedy_that_measures_slower_is_a_loss_and_is_not_advised(fresh_mlp_analysis, mlp_target):
    analysis = fresh_mlp_analysis
    model, inputs = mlp_target
    verify(analysis, model, inputs, remedies=[SleepyCompile()], table={}, record=False)
    [row] = analysis.verify["remedies"]
    assert row["status"] == "loss" and row["measured_s"] >= 0.05
    assert row["saving_s"] < 0 and row["prediction_error"] < 0
    assert [a["kind"] for a in analysis.advice] == ["bf16"]  # compile and its fusion advice are gone
    out = io.StringIO()
    analysis.print(Console(file=out, width=80), top=3)
    text = out.getvalue()
    verified, advice = text.split("Remedies applied and measured")[1].split("Advice")
    assert "LOSS" in verified and "compile" not in advice and "fuse" not in advice


def test_a_remedy_that_raises_is_reported_failed_and_the_analysis_goes_on(fresh_mlp_analysis, mlp_target):
    analysis = fresh_mlp_analysis
    model, inputs = mlp_target
    verify(analysis, model, inputs, remedies=[RaisingRemedy(), SleepyCompile()], table={}, record=False)
    failed, slept = analysis.verify["remedies"]
    assert failed["status"] == "failed" and "RuntimeError: no such luck" in failed["reason"]
    assert failed["measured_s"] is None and slept["status"] == "loss"


def test_the_doubled_batch_needs_one_leading_dim_and_is_measured_per_current_batch():
    remedy = DoubledBatch()
    target = type("T", (), {"inputs": (torch.ones(4, 3), torch.ones(4)), "model": None})
    assert remedy.not_applicable(target) is None
    target.inputs = (torch.ones(4, 3), torch.ones(5))
    assert "leading" in remedy.not_applicable(target)
    target.inputs = (torch.ones(4, 3), 2.0)
    assert "not a tensor" in remedy.not_applicable(target)
    leaf = torch.ones(4, 3, requires_grad=True)
    prepared = remedy.prepare(None, (leaf,), None)
    [doubled] = prepared.inputs
    assert doubled.shape == (8, 3) and doubled.is_leaf and doubled.requires_grad and prepared.batches == 2


def test_tf32_settings_are_restored_after_the_remedy():
    before = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(ValueError):
        with tf32_matmuls():
            assert torch.get_float32_matmul_precision() == "high" and torch.backends.cuda.matmul.allow_tf32
            raise ValueError
    assert (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32) == before


def test_a_later_analysis_is_calibrated_by_the_table_and_says_so(mlp_target, monkeypatch, tmp_path):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    model, inputs = mlp_target
    fast_bf16 = make_ceilings(kind="cpu", bandwidth=2e10, fp32=1e11, tf32=1e11, bf16=1e13, fp16=2e10,
                              vector_fp32=1e11, launch_latency=1e-7)
    # bf16 priced by the ratio of its roofs (no mode measured): advised for the MLP's fp32 matmuls
    monkeypatch.setattr(analyze_mod, "measure_modes", lambda *args: {})
    plain = analyze(model, *inputs, ceilings=fast_bf16)
    kinds = {a["kind"] for a in plain.advice if "predicted_step_s" in a}
    assert "bf16" in kinds
    calibration.record_ratios(plain.device, {kind: 1.5 for kind in kinds})
    calibration.record_ratios(plain.device, {kind: 2.5 for kind in kinds})
    calibrated = analyze(model, *inputs, ceilings=fast_bf16)
    for item in calibrated.advice:
        if item["kind"] in kinds:
            assert item["calibrated_from"] == 2 and "calibrated from 2 measurements" in item["message"]
            assert item["predicted_step_s"] == pytest.approx(2.0 * item["predicted_step_uncalibrated_s"])
            assert item["predicted_saving_s"] == pytest.approx(
                max(calibrated.wall_time_s - item["predicted_step_s"], 0.0))


def test_the_cli_passes_verify_to_analyze(monkeypatch, tmp_path):
    import brrr
    from brrr.cli import main
    from brrr.errors import BrrrError

    seen = {}

    def fake_analyze(model, *inputs, **options):
        seen.update(options)
        raise BrrrError("stop here")

    monkeypatch.setattr(brrr, "analyze", fake_analyze)
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    assert main(["analyze", "--example", "mlp", "--device", "cpu", "--batch", "4", "--verify"]) == 2
    assert seen["verify"] is True
    # the remedies are timed after the analysis: CUPTI must not stay attached, slowing every launch
    assert "TEARDOWN_CUPTI" not in os.environ


class Tagged(Remedy):
    """A remedy whose step the test-double timer times by its kind."""

    def __init__(self, kind):
        self.kind, self.label = kind, f"the {kind} remedy"

    def prepare(self, model, inputs, target):
        prepared = Prepared(model, inputs, warmup_calls=1)
        prepared.tag = self.kind
        return prepared


@pytest.fixture
def timed_by_kind(monkeypatch):
    """verify.measure replaced: the baseline takes 10 ms a step, each Tagged remedy what the test says."""
    from brrr.analyze import verify as verify_mod

    times = {}
    monkeypatch.setattr(verify_mod, "measure",
                        lambda prepared, train, device, runs=None: (times.get(getattr(prepared, "tag", None), 10e-3),
                                                                   0.0))
    return times


def test_advice_is_every_measured_gain_ranked_by_measured_saving(fresh_mlp_analysis, mlp_target, timed_by_kind):
    """batch was predicted a loss and measured the largest gain; compile was predicted the largest gain and measured
    a smaller one; bf16 measured a loss; fusion advice was never measured. The advice: batch, then compile (each with
    its prediction beside the measurement), then fusion as a prediction; bf16 never."""
    from brrr.analyze.predict import Prediction

    analysis = fresh_mlp_analysis
    wall = analysis.wall_time_s
    analysis.predictions = {"batch": Prediction("batch", wall * 1.3, "a slower doubled batch", 1.0),
                            "compile": Prediction("compile", wall / 2, "half the step", 1.0),
                            "bf16": Prediction("bf16", wall * 3 / 4, "faster matmuls", 1.0)}
    timed_by_kind.update(batch=4e-3, compile=7e-3, bf16=12e-3)
    model, inputs = mlp_target
    verify(analysis, model, inputs, remedies=[Tagged("compile"), Tagged("batch"), Tagged("bf16")], table={},
           record=False)
    kinds = [a["kind"] for a in analysis.advice]
    assert kinds == ["batch", "compile", "fuse"]
    batch, compile_, fuse = analysis.advice
    assert batch["basis"] == compile_["basis"] == "measured" and fuse["basis"] == "predicted"
    assert batch["measured_saving_s"] == pytest.approx(6e-3) and compile_["measured_saving_s"] == pytest.approx(3e-3)
    assert batch["predicted_saving_s"] == pytest.approx(10e-3 - (wall * 1.3 + 10e-3 - wall))   # a loss, predicted
    assert batch["prediction_error"] > 0 and "the batch remedy" in batch["message"]
    out = io.StringIO()
    analysis.print(Console(file=out, width=120), top=3)
    advice = out.getvalue().split("Advice")[-1]
    assert advice.index("batch") < advice.index("compile") < advice.index("fuse")
    lines = {line.split()[0]: line for line in advice.splitlines() if line.strip()[:5] in ("batch", "compi", "fuse ")}
    assert "6 ms" in lines["batch"] and "measured (predicted a loss of" in lines["batch"]
    assert "3 ms" in lines["compile"] and "measured (predicted " in lines["compile"]
    assert "predicted" in lines["fuse"] and "measured" not in lines["fuse"]
    assert "bf16" not in advice
    from brrr.analyze.report import html_report

    assert "measured (predicted" in html_report(analysis).split("Advice")[-1].split("Remedies")[0]
    saved = json.loads(analysis.to_json())["advice"]
    assert [a["basis"] for a in saved] == ["measured", "measured", "predicted"]


def test_a_gain_with_no_prediction_is_advised_as_measured(fresh_mlp_analysis, mlp_target, timed_by_kind):
    analysis = fresh_mlp_analysis
    analysis.predictions = {}
    timed_by_kind.update({"channels-last": 5e-3})
    model, inputs = mlp_target
    verify(analysis, model, inputs, remedies=[Tagged("channels-last")], table={}, record=False)
    first = analysis.advice[0]
    assert first["kind"] == "channels-last" and first["basis"] == "measured" and first["unpredicted"]
    out = io.StringIO()
    analysis.print(Console(file=out, width=120), top=3)
    assert "measured (no prediction)" in out.getvalue().split("Advice")[-1]


def test_brrr_is_timed_only_after_every_graph_has_decided_how_to_run(monkeypatch):
    """Where each compiled graph is timed against itself as Dynamo captured it (captured_choice.py; a test-double
    clock turns the trial on here), the compile remedy's warm-up outlasts that trial: no timed call of the step
    falls inside it."""
    from brrr.analyze.verify import BrrrCompile, Target, measure
    from brrr.compile.runtime import captured_choice

    class Clock:
        t = 0.0

        def now(self):
            self.t += 1.0
            return self.t

        def sync(self):
            pass
    monkeypatch.setattr(captured_choice, "CLOCK", Clock())
    monkeypatch.setattr(captured_choice, "DECISIONS", [])
    calls, decided_at = [0], []
    call, decide = captured_choice.CompiledOrCaptured.__call__, captured_choice.CompiledOrCaptured._decide

    def counted(self, *args):
        calls[0] += 1
        return call(self, *args)

    def noted(self, *args):
        decided_at.append(calls[0])
        return decide(self, *args)
    monkeypatch.setattr(captured_choice.CompiledOrCaptured, "__call__", counted)
    monkeypatch.setattr(captured_choice.CompiledOrCaptured, "_decide", noted)

    torch._dynamo.reset()
    target = Target(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), (torch.randn(4, 8),), False,
                    torch.device("cpu"))
    remedy = BrrrCompile()
    assert remedy.deciding_calls(target) == captured_choice.TRIAL_LENGTH + 1
    prepared = remedy.prepare(target.model, target.inputs, target)
    seconds, _ = measure(prepared, False, target.device, runs=3)
    assert seconds > 0 and calls[0] == prepared.warmup_calls + 3
    assert decided_at == [captured_choice.TRIAL_LENGTH + 1] and decided_at[0] <= prepared.warmup_calls
    monkeypatch.setattr(captured_choice, "CLOCK", None)
    assert remedy.deciding_calls(target) == 0   # no trial on the CPU: nothing to wait for


def test_precision_remedies_do_not_apply_to_a_step_without_fp32_matmuls():
    """A model with fp32 weights whose forward runs under autocast already: bf16 and TF32 have nothing to do."""
    from brrr.analyze.verify import Autocast, Target, TF32

    model = torch.nn.Linear(4, 4)
    target = Target(model, (torch.ones(2, 4),), False, torch.device("cuda"), fp32_contractions=0, fp32_matmuls=0)
    assert "no matmul-family op" in Autocast().not_applicable(target)
    assert "no cuBLAS matmul" in TF32().not_applicable(target)
    target.fp32_contractions = target.fp32_matmuls = 3
    assert Autocast().not_applicable(target) is None and TF32().not_applicable(target) is None
