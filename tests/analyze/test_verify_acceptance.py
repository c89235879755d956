"""benchmarks/acceptance/verify.py --quick: the GPU acceptance script runs end to end on tiny models."""

import json
import statistics

from tests.bench.benchmark_scripts import load


def test_quick_acceptance_writes_predictions_measurements_and_median_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path / "cache"))
    script = load("acceptance", "verify")
    assert script.main(["--quick", "--out", str(tmp_path), "--remedies", "batch,channels-last"]) == 0
    [json_path] = tmp_path.glob("*-verify.json")
    results = json.loads(json_path.read_text())
    assert [r["config"] for r in results["results"]] == list(script.CONFIGS)
    errors = []
    for result in results["results"]:
        rows = {row["kind"]: row for row in result["verify"]["remedies"]}
        assert set(rows) == {"batch", "channels-last"}
        batch = rows["batch"]
        assert batch["predicted_s"] > 0 and batch["measured_s"] > 0
        errors.append(abs(batch["prediction_error_uncalibrated"]))
    assert rows["channels-last"]["status"] == "not applicable"  # the conv net is channels_last already
    assert results["median_error"]["batch"]["median"] == statistics.median(errors)
    assert "median |prediction error|" in json_path.with_suffix(".txt").read_text()
    assert not list((tmp_path / "cache").glob("calibration-*"))  # uncalibrated: nothing recorded
