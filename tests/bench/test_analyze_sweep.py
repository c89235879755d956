"""The sweep's analyze --verify runner (benchmarks/sweep/analyze_sweep.py): its error summary (uncalibrated and
leave-one-out calibrated), the advice-order check, the shipped calibration it writes and that brrr reads, and a
CPU run of one tiny configuration end to end."""

import json
import statistics

import pytest

from brrr.analyze import calibration
from tests.bench.benchmark_scripts import load


@pytest.fixture(scope="module")
def sweep():
    return load("sweep", "analyze_sweep")


def _row(config, remedies, advice=(), family="timm"):
    return {"config": config, "family": family, "train": False, "baseline_s": 1.0,
            "remedies": [dict(kind=k, predicted_uncalibrated_s=p, measured_s=m, status=s, saving_s=1.0 - m)
                         for k, p, m, s in remedies], "advice": list(advice)}


def test_errors_are_given_uncalibrated_and_calibrated_from_the_other_configurations_alone(sweep):
    # the cost model predicts half of every measurement but one: uncalibrated it is 50% off, a table learnt
    # from the others corrects each of those exactly, and the odd one stays off by what it is
    rows = [_row(f"c{i}", [("compile", 0.5 * m, m, "gain")]) for i, m in enumerate((0.2, 0.4, 0.6, 0.8))]
    rows.append(_row("odd", [("compile", 0.3, 0.9, "gain")]))
    kind = sweep.errors_by_kind(rows)["compile"]
    assert kind["configs"] == ["c0", "c1", "c2", "c3", "odd"]
    assert kind["uncalibrated"]["errors"][:4] == pytest.approx([0.5] * 4)
    assert kind["uncalibrated"]["errors"][4] == pytest.approx(2 / 3)
    assert kind["calibrated"]["errors"][:4] == pytest.approx([0.0] * 4)   # the odd ratio (3) never the median
    assert kind["calibrated"]["errors"][4] == pytest.approx(1 / 3)        # 0.3 * 2 against 0.9
    assert kind["calibrated"]["median"] == pytest.approx(0.0)
    assert kind["calibrated"]["p90"] == pytest.approx(sweep.percentile(kind["calibrated"]["errors"], 0.9))
    assert sweep.percentile([0.0, 0.0, 0.0, 0.0, 1 / 3], 0.9) == pytest.approx(0.6 * (1 / 3))
    s = sweep.summary(rows)
    assert s["configs"] == 5 and s["kind_passes"]["compile"]
    assert s["slower_than_eager"] == {}   # every measurement under the 1 s baseline
    rows.append(_row("slow", [("compile", 0.5, 1.2, "loss"), ("cuda-graphs", 0.5, 1.01, "loss")]))
    assert sweep.summary(rows)["slower_than_eager"] == {"slow": {"compile": pytest.approx(1.2)}}   # 1% is noise
    rows.pop()
    rows.append(_row("worse", [("compile", 0.1, 0.9, "gain")]))
    rows.append(_row("worst", [("compile", 0.05, 0.9, "gain")]))
    assert not sweep.summary(rows)["kind_passes"]["compile"]   # its 90th percentile passes 60%


def test_the_advice_check_wants_every_gain_first_and_by_measured_saving(sweep):
    remedies = [("compile", 0.5, 0.5, "gain"), ("batch", 0.9, 0.8, "gain"), ("tf32", 0.5, 1.2, "loss")]
    good = [{"kind": "compile", "basis": "measured"}, {"kind": "batch", "basis": "measured"},
            {"kind": "bf16", "basis": "predicted"}]
    assert sweep.advice_follows_measurements(_row("a", remedies, good))
    assert not sweep.advice_follows_measurements(_row("a", remedies, good[1::-1] + good[2:]))   # order
    assert not sweep.advice_follows_measurements(_row("a", remedies, good[:1] + good[2:]))      # a gain missing
    lost = good[:2] + [{"kind": "tf32", "basis": "measured"}]
    assert not sweep.advice_follows_measurements(_row("a", remedies, lost))                    # a loss advised
    assert not sweep.advice_follows_measurements(_row("a", remedies, good[2:] + good[:2]))     # not first


def test_the_sweep_s_ratios_are_the_prior_of_a_device_that_measured_nothing(sweep, tmp_path, monkeypatch):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path / "cache"))
    prior = tmp_path / "prior.json"
    monkeypatch.setattr(calibration, "PRIOR", prior)
    rows = [_row(f"c{i}", [("compile", 1.0, r, "gain"), ("batch", 1.0, 2 * r, "gain")])
            for i, r in enumerate((0.5, 0.6, 0.7))]
    result = {"environment": {"device": "NVIDIA H200"}, "summary": sweep.summary(rows)}
    sweep.write_prior(result, prior)
    assert json.loads(prior.read_text())["nvidia-h200"]["compile"] == [0.5, 0.6, 0.7]
    table = calibration.load_table("NVIDIA H200")
    assert calibration.correction(table, "compile") == (pytest.approx(0.6), 3)
    assert calibration.load_table("NVIDIA H100 80GB HBM3") == {}   # another GPU learns nothing from it
    # this machine's own measurement of a kind replaces the prior's for that kind alone, and is all it records
    calibration.record_ratios("NVIDIA H200", {"compile": 2.0})
    table = calibration.load_table("NVIDIA H200")
    assert table["compile"] == [2.0] and statistics.median(table["batch"]) == pytest.approx(1.2)
    own = json.loads(calibration.calibration_path("NVIDIA H200").read_text())
    assert own["ratios"] == {"compile": [2.0]}


def test_a_tiny_configuration_is_analyzed_and_verified_in_its_own_process(sweep, tmp_path, monkeypatch):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path / "cache"))
    assert sweep.main(["--device", "cpu", "--quick", "--configs", "tv-alexnet-infer-bf16", "--remedies", "batch",
                       "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*-analyze-sweep.json")
    result = json.loads(path.read_text())
    (row,) = result["rows"]
    assert "error" not in row, row.get("error")
    (batch,) = row["remedies"]
    assert batch["kind"] == "batch" and batch["measured_s"] > 0 and batch["predicted_uncalibrated_s"] > 0
    assert result["summary"]["kinds"]["batch"]["ratios"] == [
        pytest.approx(batch["measured_s"] / batch["predicted_uncalibrated_s"])]
    assert result["summary"]["advice_follows_measurements"] == {"tv-alexnet-infer-bf16": True}
    assert (tmp_path / path.name.replace(".json", ".md")).exists()
    # a later run merges this one: each row keeps the commit it was measured at
    assert row["commit"] == result["environment"]["commit"]
    assert sweep.main(["--device", "cpu", "--quick", "--configs", "tv-alexnet-train-bf16", "--remedies", "batch",
                       "--previous", str(path), "--commit", "later", "--out", str(tmp_path / "later")]) == 0
    (merged,) = (tmp_path / "later").glob("*-analyze-sweep.json")
    commits = {r["config"]: r["commit"] for r in json.loads(merged.read_text())["rows"]}
    assert commits == {"tv-alexnet-infer-bf16": row["commit"], "tv-alexnet-train-bf16": "later"}
    # the same set measured again from an earlier file, at another commit
    assert sweep.main(["--device", "cpu", "--quick", "--configs-from", str(path), "--remedies", "batch",
                       "--commit", "again", "--out", str(tmp_path / "again")]) == 0
    (again,) = (tmp_path / "again").glob("*-analyze-sweep.json")
    assert {r["config"]: r["commit"] for r in json.loads(again.read_text())["rows"]} == {
        "tv-alexnet-infer-bf16": "again"}
