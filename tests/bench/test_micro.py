import pytest
import torch

from brrr.bench.micro import MICROS, ideal_bytes, rotation_sets, run_micro


def test_ideal_bytes_count_each_input_and_output_once():
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    assert ideal_bytes((x,), MICROS["softmax"].fn(x)) == 2 * 8 * 16 * 2
    target = torch.randint(0, 16, (8,))
    loss = MICROS["cross_entropy"].fn(x, target)
    assert ideal_bytes((x, target), loss) == 8 * 16 * 2 + 8 * 8 + 2


def test_rotation_sets_exceed_the_requested_bytes_and_differ():
    sets = rotation_sets(MICROS["layer_norm"], 8, 16, torch.bfloat16, "cpu", rotate_bytes=2048)
    per_set = 8 * 16 * 2 + 2 * 16 * 2
    assert len(sets) == -(-2048 // per_set) and len(sets) * per_set >= 2048
    assert not torch.equal(sets[0][0], sets[1][0])


def test_rms_norm_matches_its_definition():
    x, w = torch.randn(4, 8), torch.randn(8)
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(MICROS["rms_norm"].fn(x, w), expected)


@pytest.mark.parametrize("name", list(MICROS))
def test_every_micro_benchmark_runs_and_reports_bandwidth(name):
    data, result = run_micro(name, 8, 16, device="cpu", backends=("eager", "aot_eager"), bandwidth=10e9,
                             rotate_bytes=4096, warmup=1, rep=3)
    assert [r["status"] for r in data["rows"]] == ["ok", "ok"]
    assert data["flops"] == MICROS[name].flops_per_element * 8 * 16 and data["input_sets"] >= 2
    for row in data["rows"]:
        assert row["achieved_bytes_per_s"] == pytest.approx(data["ideal_bytes"] / row["median_s"])
        assert row["fraction_of_copy_bandwidth"] == pytest.approx(row["achieved_bytes_per_s"] / 10e9)
    assert data["rows"][0]["error_vs_reference"]["norm_rel"] < 2e-2  # bf16 against the fp64 run
