"""Outputs: the JSON schema, the roofline PNG, the HTML page, the terminal report, and the CLI."""

import io
import json
import math

import pytest
import torch
from rich.console import Console

from brrr.analyze.analysis import Analysis
from brrr.analyze.report import json_safe
from tests.analyze.synthetic import make_ceilings, make_record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OP_KEYS = {"name": str, "module": str, "op_class": str, "flops": int, "bytes_read": int, "bytes_written": int,
           "time_s": float, "regime": str}


def check_schema(d):
    assert isinstance(d["device"], str) and d["device"]
    assert isinstance(d["ceilings"], dict) and d["ceilings"]["bandwidth"] > 0
    assert isinstance(d["wall_time_s"], float) and d["wall_time_s"] > 0
    assert isinstance(d["ops"], list) and d["ops"]
    for op in d["ops"]:
        for key, kind in OP_KEYS.items():
            assert isinstance(op[key], kind), (key, op[key])
        assert op["regime"] in ("compute", "bandwidth", "overhead")
        assert op["op_class"] in ("contraction", "normalization", "elementwise", "view", "other")
    assert set(d["regimes"]) == {"compute", "bandwidth", "overhead"}
    assert all(isinstance(v, float) for v in d["regimes"].values())
    assert sum(d["regimes"].values()) == pytest.approx(d["wall_time_s"])
    for cls, row in d["op_classes"].items():
        assert isinstance(row["flops_pct"], float) and isinstance(row["time_pct"], float)
    assert isinstance(d["advice"], list)
    for item in d["advice"]:
        assert isinstance(item["kind"], str) and isinstance(item["message"], str)
        assert isinstance(item["predicted_saving_s"], float) and item["predicted_saving_s"] >= 0


def test_json_follows_the_schema(bert_train_analysis, tmp_path):
    path = tmp_path / "a.json"
    bert_train_analysis.save_json(path)
    d = json.loads(path.read_text())
    check_schema(d)
    assert len(d["ops"]) == len(bert_train_analysis.ops)
    assert d == json.loads(bert_train_analysis.to_json()) == bert_train_analysis.to_dict()
    assert {a["kind"] for a in d["advice"]} >= {"fuse"}


def test_json_is_safe_with_infinities_and_nans():
    assert json_safe({"a": math.inf, "b": [math.nan, 1.5], "c": torch.float32, "d": (1, 2)}) == \
        {"a": None, "b": [None, 1.5], "c": "torch.float32", "d": [1, 2]}
    # an op that moves no bytes has intensity inf in the cost model; the JSON has null
    ceilings = make_ceilings()
    ceilings.datasheet = {"bandwidth": math.inf}
    records = [make_record(0, "view", time_s=0.0), make_record(1, "elementwise", flops=8, bytes_read=64, time_s=1e-6)]
    analysis = Analysis.from_measurements(records, ceilings, wall_time_s=1e-5)
    text = analysis.to_json()
    d = json.loads(text)
    assert d["ops"][0]["intensity"] is None and d["ops"][0]["achieved_fraction"] is None
    assert d["ceilings"]["datasheet"]["bandwidth"] is None
    check_schema(d)


def test_compiled_kernels_render_without_rates_and_are_flagged(tmp_path):
    records = [make_record(0, "contraction", flops=2e9, bytes_read=6e6, time_s=1e-3, name="aten.mm.default"),
               make_record(1, "other", time_s=3e-4, name="triton_poi_fused_gelu_0", kernel=True)]
    analysis = Analysis.from_measurements(records, make_ceilings(), wall_time_s=2e-3, busy_time_s=1.3e-3)
    d = analysis.to_dict()
    check_schema(d)
    kernel = d["ops"][1]
    assert kernel["kernel"] is True and kernel["achieved_fraction"] is None and kernel["regime"] == "bandwidth"
    assert d["ops"][0]["kernel"] is False
    assert d["regimes"]["bandwidth"] == pytest.approx(3e-4)  # the kernel's time is busy time, not overhead
    out = io.StringIO()
    analysis.print(Console(file=out, width=160))
    text = out.getvalue()
    assert "1 kernels were launched by compiled code" in text
    row = next(line for line in text.splitlines() if "triton_poi_fused_gelu_0" in line)
    assert "kernel" in row and " - " in row       # class "kernel", no FLOP/s or bytes/s
    analysis.save_png(tmp_path / "r.png")          # no point for a kernel with unknown bytes, no failure
    assert (tmp_path / "r.png").read_bytes().startswith(PNG_MAGIC)


def test_png_is_a_roofline_image(mlp_analysis, tmp_path):
    path = tmp_path / "roofline.png"
    mlp_analysis.save_png(path)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_html_is_self_contained_with_tables_and_escaped(mlp_analysis, tmp_path):
    mlp_analysis.advice.append({"kind": "test", "message": "<script>alert(1)</script> & more",
                                "predicted_saving_s": 0.0})
    try:
        path = tmp_path / "report.html"
        mlp_analysis.save_html(path)
        page = path.read_text()
    finally:
        mlp_analysis.advice.pop()
    assert page.startswith("<!DOCTYPE html>")
    assert "data:image/png;base64," in page
    for title in ("Where the time goes", "Top ", "Operator classes", "Advice"):
        assert title in page
    assert "aten.addmm.default" in page and "fc1" in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page


def test_terminal_report_shows_ops_regimes_classes_and_advice(bert_train_analysis):
    out = io.StringIO()
    bert_train_analysis.print(Console(file=out, width=160), top=5)
    text = out.getvalue()
    assert "Top 5 ops by time" in text and "Where the time goes" in text
    assert "Operator classes" in text and "contraction" in text and "Advice" in text
    assert "fuse" in text
    narrow = io.StringIO()
    bert_train_analysis.advice.append({"kind": "test", "message": "keep [red]this[/red] literal",
                                       "predicted_saving_s": 0.0})
    try:
        bert_train_analysis.print(Console(file=narrow, width=80), top=5)
    finally:
        bert_train_analysis.advice.pop()
    assert "regime" in narrow.getvalue() and "[red]this[/red]" in narrow.getvalue()


def test_cli_analyze_writes_json_png_html(tmp_path, monkeypatch):
    """The one test that measures: CPU ceilings, once, into a temporary cache."""
    from brrr.cli import main

    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path / "cache"))
    paths = {ext: tmp_path / f"out.{ext}" for ext in ("json", "png", "html")}
    rc = main(["analyze", "--example", "mlp", "--device", "cpu",
               "--json", str(paths["json"]), "--png", str(paths["png"]), "--html", str(paths["html"])])
    assert rc == 0
    check_schema(json.loads(paths["json"].read_text()))
    assert paths["png"].read_bytes().startswith(PNG_MAGIC)
    assert "data:image/png;base64," in paths["html"].read_text()
    assert list((tmp_path / "cache").glob("ceilings-*.json"))


def test_a_step_with_no_ops_still_renders(cpu_ceilings, tmp_path):
    from brrr.analyze import analyze

    analysis = analyze(lambda x: x, torch.randn(4), ceilings=cpu_ceilings, profile_runs=1)
    assert analysis.ops == [] and analysis.regime == "overhead"
    assert analysis.regimes["overhead"] == pytest.approx(analysis.wall_time_s)
    analysis.save_png(tmp_path / "empty.png")
    analysis.save_html(tmp_path / "empty.html")
    assert (tmp_path / "empty.png").read_bytes().startswith(PNG_MAGIC)
    assert json.loads(analysis.to_json())["ops"] == []
    analysis.print(Console(file=io.StringIO(), width=100))
