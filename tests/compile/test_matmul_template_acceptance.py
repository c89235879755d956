"""Smoke run of benchmarks/acceptance/matmul_template.py (--quick: one tiny shape in the Triton interpreter)."""

import json

from tests.compile.helpers import load_acceptance


def test_matmul_acceptance_times_both_templates_against_cublas(tmp_path, capsys):
    script = load_acceptance("matmul_template")
    out = tmp_path / "rows.json"
    assert script.main(["--quick", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    [row] = data["rows"]
    assert row["shape"] == "tiny" and row["cublas"]["device_ms"] > 0 and row["cublas"]["call_ms"] > 0
    assert [(w["way"], w["tma"]) for w in row["ways"]] == [("TMA 16x16x16 w4 s2", True), ("pointer template", False)]
    for way in row["ways"]:
        assert way["status"] == "ok", way        # each way's product was checked against cuBLAS's
        assert way["of_cublas"] == row["cublas"]["device_ms"] / way["device_ms"] and way["call_ms"] > 0
    assert row["best_template_of_cublas"] == max(w["of_cublas"] for w in row["ways"])
    assert "of cuBLAS" in capsys.readouterr().out
