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
    assert "of copy" in capsys.readouterr().out
