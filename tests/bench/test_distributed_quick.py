"""The distributed benchmark (benchmarks/distributed/) on the CPU: two gloo ranks train the zoo's tiny GPT-2
under DDP and FSDP2, eagerly and with brrr, and the report judges loss, rank agreement and scaling; the
report's arithmetic and verdicts on made-up records."""

import json

from tests.bench.benchmark_scripts import load


def _load(name):
    return load("distributed", name)


def test_quick_run_trains_under_ddp_and_fsdp2_as_eager_does(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run = _load("run_distributed")
    assert run.main(["--quick", "--models", "gpt2-lm-train", "--loss-steps", "2", "--timed-steps", "1",
                     "--out", str(tmp_path), "--commit", "abc1234"]) == 0
    [path] = tmp_path.glob("*-cpu-abc1234-gpt2-lm-train.json")
    results = json.loads(path.read_text())
    rows = {(r["wrap"], r["backend"]): r for r in results["rows"]}
    assert set(rows) == {(w, b) for w in ("ddp", "fsdp2") for b in ("eager", "brrr")}
    for (wrap, backend), row in rows.items():
        assert not row["error"], row["error"]
        assert row["ranks_agree"] and row["world"] == 2
        assert row["loss_rel_err"] < 1e-3, (wrap, backend, row["loss_rel_err"])
        assert row["single_step_s"] > 0 and row["efficiency"] > 0
    assert rows[("ddp", "brrr")]["graphs"] > 0 and rows[("ddp", "eager")]["graphs"] == 0
    assert rows[("ddp", "eager")]["loss_rel_err"] == 0   # the reference itself
    assert all(v["correct"] for v in results["verdicts"]["gpt2-lm-train"].values())
    text = path.with_suffix(".md").read_text()
    assert "| gpt2-lm-train | fsdp2 | brrr |" in text and "timed in rounds" in text   # interleaved by default
    assert all(len(r["step_times_s"]) == 6 for r in results["records"])   # a step a round (--timed-steps 1)


def _record(wrap, backend, rank, step_s, losses, psum=1.0, world=2):
    return {"model": "m", "wrap": wrap, "backend": backend, "world": world, "rank": rank, "step_s": step_s,
            "first_step_s": 1.0, "losses": losses, "parameter_sum": psum, "graphs": 1, "graph_breaks": 0,
            "graph_break_reasons": {}, "brrr_fallbacks": [], "peak_memory_bytes": 2**30}


def test_report_takes_the_slowest_rank_and_judges_brrr_against_inductor_and_one_gpu():
    report = _load("scaling_report")
    ref = [10.0, 9.0]
    records = [_record("none", "brrr", 0, 0.009, [1.0], world=1), _record("none", "inductor", 0, 0.009, [1.0], world=1)]
    records += [_record("ddp", "eager", r, 0.02, ref) for r in (0, 1)]
    records += [_record("ddp", "brrr", 0, 0.010, [10.0, 9.09]), _record("ddp", "brrr", 1, 0.011, [10.0, 9.09])]
    records += [_record("ddp", "inductor", r, 0.0105, ref) for r in (0, 1)]
    records += [_record("fsdp2", "brrr", 0, 0.03, ref, psum=1.0), _record("fsdp2", "brrr", 1, 0.03, ref, psum=1.5)]
    table = {(r["wrap"], r["backend"]): r for r in report.rows(records)}
    ddp = table[("ddp", "brrr")]
    assert ddp["step_s"] == 0.011                                   # the slowest rank
    assert abs(ddp["efficiency"] - 0.009 / 0.011) < 1e-12
    assert abs(ddp["loss_rel_err"] - 0.01) < 1e-9
    verdicts = report.verdicts(list(table.values()))["m"]
    assert verdicts["ddp brrr"] == {"correct": True, "at_or_below_inductor": False,
                                    "vs_inductor": 0.0105 / 0.011, "efficiency_ok": False}
    assert not verdicts["fsdp2 brrr"]["correct"]                   # the ranks' parameters differ
    records[4]["losses"] = [10.0, 9.5]                              # 5.6% off eager DDP's loss
    assert not report.verdicts(report.rows(records))["m"]["ddp brrr"]["correct"]


def test_report_says_whether_the_ranks_took_the_same_launch_or_replay_verdicts():
    report = _load("scaling_report")
    same = [("forward", True, "faster replayed, the slowest of 2 ranks"), ("backward", True, "as its forward graph")]
    records = [dict(_record("ddp", "brrr", r, 0.01, [1.0]), replay_verdicts=same) for r in (0, 1)]
    records += [dict(_record("fsdp2", "brrr", 0, 0.01, [1.0]), replay_verdicts=same),
                dict(_record("fsdp2", "brrr", 1, 0.01, [1.0]),
                     replay_verdicts=[("forward", False, "not faster replayed"), same[1]])]
    table = {(r["wrap"], r["backend"]): r for r in report.rows(records)}
    assert table[("ddp", "brrr")]["verdicts_agree"] and not table[("fsdp2", "brrr")]["verdicts_agree"]
    text = report.markdown(report.summarize({"environment": dict(device="d", gpus=2, date="x", commit="c", torch="t",
                                                                 triton="t", transformers="t", dtype="bf16",
                                                                 loss_steps=2, timed_steps=1),
                                             "records": records}))
    assert "- m, ddp, brrr: verdicts the same on every rank" in text
    assert "- m, fsdp2, brrr: verdicts **differ between ranks**" in text
    assert "  - rank 1: forward launches (not faster replayed)" in text


def test_without_ddp_the_loss_is_judged_against_eager_under_the_same_wrapping():
    report = _load("scaling_report")
    ref = [10.0, 9.0]
    records = [_record("fsdp2", "eager", r, 0.03, ref) for r in (0, 1)]
    records += [_record("fsdp2", "brrr", r, 0.02, [10.0, 9.09]) for r in (0, 1)]
    table = {(r["wrap"], r["backend"]): r for r in report.rows(records)}
    row = table[("fsdp2", "brrr")]
    assert row["loss_reference"] == "eager fsdp2" and abs(row["loss_rel_err"] - 0.01) < 1e-9
    assert report.verdicts(list(table.values()))["m"]["fsdp2 brrr"]["correct"]
    records += [_record("ddp", "eager", r, 0.02, [10.0, 9.0 * 1.001]) for r in (0, 1)]   # DDP's, when it ran
    assert report.rows(records)[2]["loss_reference"] == "eager ddp"
