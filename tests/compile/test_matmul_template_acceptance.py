"""Smoke run of benchmarks/acceptance/matmul_template.py (--quick: one tiny shape in the Triton interpreter)."""

import json

from tests.compile.helpers import load_acceptance


def test_matmul_acceptance_times_both_templates_against_cublas(tmp_path, capsys):
    script = load_acceptance("matmul_template")
    out = tmp_path / "rows.json"
    assert script.main(["--quick", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    [row] = data["rows"]
    assert row["shape"] == "tiny" and row["cublas_ms"] > 0
    assert [(w["way"], w["tma"]) for w in row["ways"]] == [("template", True), ("pointer template", False)]
    for way in row["ways"]:
        assert way["status"] == "ok", way        # each way's product was checked against cuBLAS's
        assert way["of_cublas"] == row["cublas_ms"] / way["ms"]
    assert "of cuBLAS" in capsys.readouterr().out
