import json
import time

import torch

from brrr.experiments import overhead


class SleepModel(torch.nn.Module):
    """A step that costs `fixed` seconds plus `per_sample` per batch row: a known overhead-bound region."""

    def __init__(self, fixed, per_sample):
        super().__init__()
        self.fixed, self.per_sample = fixed, per_sample

    def forward(self, x):
        time.sleep(self.fixed + self.per_sample * x.shape[0])
        return x


def test_overhead_finds_the_flat_region_of_a_known_model(tmp_path):
    def sleepy(batch):  # 20 ms fixed + 0.6 ms per sample: within 1.3x of batch 1 up to batch 8, 1.44x at 16
        return SleepModel(0.020, 0.0006), (torch.zeros(batch, 1),)

    png, js = tmp_path / "o.png", tmp_path / "o.json"
    result = overhead.run(model_fn=sleepy, device="cpu", max_batch=32, png=str(png), json_path=str(js),
                          print_table=False, chunk_s=0.01)
    assert [r["batch"] for r in result["rows"]] == [1, 2, 4, 8, 16, 32]
    assert result["overhead_bound_batch"] == 8
    assert 0.0206 <= result["fixed_cost_s"] < 0.03
    assert result["rows"][-1]["time_per_sample_s"] < result["rows"][0]["time_per_sample_s"] / 10
    assert result["stop_reason"] == "reached max batch 32" and result["model"] == "sleepy"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(js.read_text())["overhead_bound_batch"] == 8


def test_overhead_stops_when_runtime_grows_in_proportion():
    # 25 ms per sample, nothing fixed: every doubling doubles the time. Per-sample cost large against a
    # loaded machine's sleep overshoot (a few ms), which would read as a fixed cost and flatten the ratios.
    def proportional(batch):
        return SleepModel(0.0, 0.025), (torch.zeros(batch, 1),)

    result = overhead.run(model_fn=proportional, device="cpu", max_batch=64, print_table=False, chunk_s=0.005)
    assert [r["batch"] for r in result["rows"]] == [1, 2, 4]
    assert result["overhead_bound_batch"] is None
    assert "grew in proportion" in result["stop_reason"]


def test_overhead_on_the_example_mlp():
    result = overhead.run(example="mlp", device="cpu", sizes={"dim": 16}, max_batch=4, print_table=False,
                          chunk_s=0.002)
    assert [r["batch"] for r in result["rows"]] == [1, 2, 4]
    assert all(r["time_s"] > 0 for r in result["rows"]) and result["model"] == "mlp"
