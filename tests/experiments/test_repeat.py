import json

import pytest

from brrr.experiments import repeat


class FakeCeilings:
    bandwidth = 20e9
    vector_fp32 = 50e9

    def to_dict(self):
        return {"bandwidth": self.bandwidth, "vector_fp32": self.vector_fp32}


FAST = {"warmup": 2, "rep": 10}


def test_repeat_counts():
    assert repeat.repeat_counts(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert repeat.repeat_counts(5) == [1, 2, 4]


def test_make_repeat_fn_multiplies_by_two_r_times():
    import torch

    assert repeat.make_repeat_fn(3)(torch.ones(2)).tolist() == [8.0, 8.0]


def test_repeat_eager_writes_dict_png_json(tmp_path):
    png, js = tmp_path / "repeat.png", tmp_path / "repeat.json"
    numel = 2**12
    result = repeat.run(backend="eager", device="cpu", numel=numel, max_repeat=8, png=str(png), json_path=str(js),
                        ceilings=FakeCeilings(), print_table=False, **FAST)
    assert [r["repeat"] for r in result["rows"]] == [1, 2, 4, 8]
    for row in result["rows"]:
        assert row["time_s"] > 0
        assert row["flops"] == numel * row["repeat"] and row["bytes"] == 2 * numel * 4
        assert row["bytes_per_s"] == pytest.approx(row["bytes"] / row["time_s"])
        assert row["flops_per_s"] == pytest.approx(row["flops"] / row["time_s"])
    assert result["ceilings"] == {"bandwidth": 20e9, "vector_fp32": 50e9}
    assert result["device"] == "cpu" and result["dtype"] == "float32" and "torch" in result["versions"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(js.read_text())["knee"] == result["knee"]


def test_every_repeat_count_compiles_afresh():
    compiled = []

    def counting_backend(gm, example_inputs):
        compiled.append(sum(1 for n in gm.graph.nodes if n.op == "call_function"))
        return gm.forward

    result = repeat.run(backend=counting_backend, device="cpu", numel=256, max_repeat=8, ceilings=FakeCeilings(),
                        print_table=False, **FAST)
    assert compiled == [1, 2, 4, 8]  # one graph per r, with r multiplies in it
    assert all(r["time_s"] > 0 for r in result["rows"])


def test_failing_backend_is_recorded_not_raised(tmp_path):
    def raising_backend(gm, example_inputs):
        raise RuntimeError("no kernels today")

    png = tmp_path / "r.png"
    result = repeat.run(backend=raising_backend, device="cpu", numel=256, max_repeat=2, png=str(png),
                        ceilings=FakeCeilings(), print_table=False, **FAST)
    assert [r["time_s"] for r in result["rows"]] == [None, None]
    assert all("no kernels today" in r["error"] for r in result["rows"])
    assert result["knee"] is None and png.exists()
