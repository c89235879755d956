from brrr.experiments import cos_chain


def test_cos_chain_benches_each_backend_against_a_single_eager_cos(tmp_path):
    js = tmp_path / "cos.json"
    result = cos_chain.run(device="cpu", numel=2**12, backends=("eager", "aot_eager"), warmup=1, rep=5,
                           json_path=str(js), print_table=False)
    rows = {r["backend"]: r for r in result["bench"]["rows"]}
    assert set(rows) == {"eager", "aot_eager"} and all(r["status"] == "ok" for r in rows.values())
    assert result["eager_single_cos_s"] > 0
    for backend, ratio in result["ratio_to_single_cos"].items():
        assert ratio == rows[backend]["median_s"] / result["eager_single_cos_s"]
    assert js.exists()
