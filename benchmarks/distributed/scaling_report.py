"""The distributed benchmark's judgement: train_ranks.py's per-rank records -> rows, verdicts, JSON, Markdown.

A row is one (model, wrapping, backend) on N GPUs: the per-GPU step time (the slowest rank's median), the
one-GPU step time of the same backend at the same per-GPU batch, their ratio (scaling efficiency), the peak
memory of the busiest rank, the largest relative difference of the rank-averaged loss from eager DDP's over
the same steps (from eager under the same wrapping where DDP was not run; the row says which), whether every
rank ends with the same parameters, and what Dynamo and brrr reported. The verdicts are the distributed issue's acceptance, for brrr under each wrapping: correct, per-GPU step time at
or below Inductor's, and DDP scaling efficiency of at least 90%.

    python3 benchmarks/distributed/scaling_report.py FILE.json   # print its Markdown again
"""

import json
import sys
from pathlib import Path

LOSS_RTOL = 2e-2   # bf16 keeps 8 bits of mantissa (0.4%); twenty AdamW steps compound a few such roundings
MIN_DDP_EFFICIENCY = 0.90
REFERENCE = ("ddp", "eager")


def _key(record):
    return record["model"], record["wrap"], record["backend"]


def _group(records):
    groups = {}
    for record in records:
        groups.setdefault(_key(record), []).append(record)
    return groups


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def rows(records):
    """One dict per (model, wrapping, backend) of the multi-GPU runs, in the order they ran."""
    groups = _group(records)
    out = []
    for (model, wrap, backend), ranks in groups.items():
        if wrap == "none":
            continue
        errors = sorted({r["error"] for r in ranks if "error" in r})
        row = {"model": model, "wrap": wrap, "backend": backend, "world": len(ranks), "error": "; ".join(errors)}
        single = [r for r in groups.get((model, "none", backend), ()) if "error" not in r]
        reference, reference_wrap = [r for r in groups.get((model,) + REFERENCE, ()) if "error" not in r], "ddp"
        if not reference:   # a run without DDP: eager under the same wrapping
            reference, reference_wrap = [r for r in groups.get((model, wrap, "eager"), ()) if "error" not in r], wrap
        row["loss_reference"] = f"eager {reference_wrap}" if reference else None
        if not errors:
            row["step_s"] = _max(r["step_s"] for r in ranks)
            row["host_step_s"] = _max(r.get("host_step_s") for r in ranks)
            row["single_step_s"] = single[0]["step_s"] if single else None
            row["efficiency"] = row["single_step_s"] / row["step_s"] if single and row["step_s"] else None
            row["peak_memory_bytes"] = _max(r.get("peak_memory_bytes") for r in ranks)
            row["single_peak_memory_bytes"] = single[0].get("peak_memory_bytes") if single else None
            row["first_step_s"] = _max(r["first_step_s"] for r in ranks)
            row["loss_rel_err"] = _loss_error(ranks[0]["losses"], reference[0]["losses"]) if reference else None
            sums = [r["parameter_sum"] for r in ranks]
            row["ranks_agree"] = max(sums) - min(sums) <= 1e-12 * max(1.0, abs(sums[0]))
            row["graphs"] = ranks[0]["graphs"]
            row["graph_breaks"] = ranks[0]["graph_breaks"]
            row["graph_break_reasons"] = ranks[0]["graph_break_reasons"]
            row["brrr_fallbacks"] = sorted({f for r in ranks for f in r.get("brrr_fallbacks", [])})
            row["losses"] = ranks[0]["losses"]
            verdicts_by_rank = [[tuple(v[:2]) for v in r.get("replay_verdicts", [])] for r in ranks]
            row["replay_verdicts"] = [r.get("replay_verdicts", []) for r in ranks]
            row["verdicts_agree"] = all(v == verdicts_by_rank[0] for v in verdicts_by_rank)
        out.append(row)
    return out


def _loss_error(losses, reference):
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference))


def verdicts(table):
    """{model: {"wrap backend": {...}}} for brrr and brrr-cudagraphs: the acceptance of the distributed issue,
    each check True/False/None."""
    out = {}
    index = {(r["model"], r["wrap"], r["backend"]): r for r in table}
    for (model, wrap, backend), row in index.items():
        if not backend.startswith("brrr"):
            continue
        inductor = index.get((model, wrap, "inductor"))
        correct = not row["error"] and row.get("loss_rel_err") is not None and \
            row["loss_rel_err"] <= LOSS_RTOL and row.get("ranks_agree", False)
        faster = None
        if not row["error"] and inductor and not inductor["error"]:
            faster = row["step_s"] <= inductor["step_s"]
        check = {"correct": correct, "at_or_below_inductor": faster,
                 "vs_inductor": inductor["step_s"] / row["step_s"] if faster is not None else None}
        if wrap == "ddp":
            eff = row.get("efficiency")
            check["efficiency_ok"] = eff >= MIN_DDP_EFFICIENCY if eff is not None else None
        out.setdefault(model, {})[f"{wrap} {backend}"] = check
    return out


def summarize(results):
    table = rows(results["records"])
    return {**results, "rows": table, "verdicts": verdicts(table)}


def write(results, stem):
    results = summarize(results)
    Path(f"{stem}.json").write_text(json.dumps(results, indent=1))
    Path(f"{stem}.md").write_text(markdown(results))
    return results


def _ms(s):
    return f"{s * 1e3:.2f}" if s is not None else "-"


def _gib(b):
    return f"{b / 2**30:.1f}" if b is not None else "-"


def _check(value):
    return {True: "yes", False: "**no**", None: "-"}[value]


def _ddp_grads(env):
    how = env.get("ddp_grads", "copied")   # records before the option was DDP's default
    return "views of its buckets (gradient_as_bucket_view)" if how == "bucket-view" else "copied out of its buckets"


def _references(table):
    names = sorted({r["loss_reference"] for r in table if r.get("loss_reference")})
    return " or ".join(names) if names else "eager DDP"


def _timing(env):
    if env.get("timing") == "interleaved":
        return (", every backend's run kept alive and timed in rounds, each round a share of the steps of each "
                "in turn (peak memory: over a few steps of each before the rounds, less what the others hold)")
    return ", each backend's run timed alone"


def markdown(results):
    env = results["environment"]
    lines = [f"# brrr under DDP and FSDP2: {env['device']} x{env['gpus']}", "",
             f"{env['date']}, commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, "
             f"transformers {env['transformers']}, NCCL {env.get('nccl')}; {env['dtype']}, AdamW; loss over the "
             f"first {env['loss_steps']} steps (the first holds the compile), step time the median of "
             f"{env['timed_steps']} steps after them{_timing(env)}. DDP's gradients: {_ddp_grads(env)}.", "",
             "Per-GPU step: the slowest rank's median. Scaling: the one-GPU step of the same backend at the same "
             "per-GPU batch over the per-GPU step. Loss error: the largest relative difference of the "
             f"rank-averaged loss from {_references(results['rows'])}'s, over the same steps.", "",
             "| model | wrap | backend | per-GPU step ms | 1 GPU ms | scaling | peak GiB (1 GPU) | loss error | "
             "ranks agree | graphs / breaks | brrr fallbacks | first step s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        if r["error"]:
            lines.append(f"| {r['model']} | {r['wrap']} | {r['backend']} | error: {r['error'][:120]} |"
                         + " |" * 8)
            continue
        eff = f"{r['efficiency']:.0%}" if r.get("efficiency") is not None else "-"
        err = f"{r['loss_rel_err']:.1e}" if r.get("loss_rel_err") is not None else "-"
        lines.append(f"| {r['model']} | {r['wrap']} | {r['backend']} | {_ms(r['step_s'])} | "
                     f"{_ms(r['single_step_s'])} | {eff} | {_gib(r['peak_memory_bytes'])} "
                     f"({_gib(r['single_peak_memory_bytes'])}) | {err} | {_check(r['ranks_agree'])} | "
                     f"{r['graphs']} / {r['graph_breaks']} | {len(r['brrr_fallbacks'])} | "
                     f"{r['first_step_s']:.1f} |")
    lines += ["", "## Acceptance (brrr's rows)", ""]
    for model, wraps in results["verdicts"].items():
        for wrap, check in wraps.items():
            parts = [f"correct: {_check(check['correct'])}",
                     f"at or below Inductor: {_check(check['at_or_below_inductor'])}"
                     + (f" (Inductor/brrr {check['vs_inductor']:.3f})" if check["vs_inductor"] else "")]
            if "efficiency_ok" in check:
                parts.append(f"scaling >= {MIN_DDP_EFFICIENCY:.0%}: {_check(check['efficiency_ok'])}")
            lines.append(f"- {model}, {wrap}: " + "; ".join(parts))
    breaks = {(r["model"], r["wrap"]): r["graph_break_reasons"] for r in results["rows"]
              if not r["error"] and r["graph_break_reasons"] and r["backend"].startswith("brrr")}
    if breaks:
        lines += ["", "## Graph breaks (brrr's runs; Dynamo's, the same for every backend)", ""]
        for (model, wrap), reasons in breaks.items():
            for reason, n in reasons.items():
                lines.append(f"- {model}, {wrap}: {n}x {reason.splitlines()[0][:140]}")
    replays = [r for r in results["rows"] if not r["error"] and any(r.get("replay_verdicts") or ())]
    if replays:
        lines += ["", "## Launch or replay, per rank (the ranks must take the same verdicts)", ""]
        for r in replays:
            lines.append(f"- {r['model']}, {r['wrap']}, {r['backend']}: verdicts "
                         f"{'the same on every rank' if r['verdicts_agree'] else '**differ between ranks**'}")
            for rank, verdicts in enumerate(r["replay_verdicts"]):
                for graph, replay, reason in verdicts:
                    lines.append(f"  - rank {rank}: {graph} {'replays' if replay else 'launches'} ({reason[:150]})")
    fallbacks = {(r["model"], r["wrap"]): r["brrr_fallbacks"] for r in results["rows"]
                 if not r["error"] and r["brrr_fallbacks"]}
    if fallbacks:
        lines += ["", "## brrr's fallbacks", ""]
        for (model, wrap), items in fallbacks.items():
            lines += [f"- {model}, {wrap}: {item}" for item in items]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(summarize(json.loads(Path(sys.argv[1]).read_text()))))
