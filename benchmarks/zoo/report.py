"""The zoo's results as tables: per configuration, the summary lines, and the README's "Where it stands".

    python3 benchmarks/zoo/report.py merge OUT_STEM part-a.json part-b.json ...   # one file from the parts
    python3 benchmarks/zoo/report.py readme RESULTS.json                          # rewrite the README block

A backend's time is bench's median (do_bench) for a static configuration and the sum of the medians over the
shapes for a changing-shape one. "ok" means it ran and was correct: within 3x eager's own error against the
fp32 copy, the rule of `brrr.bench.compare.verdict`. The geometric means are over the configurations where
both backends compared ran; training and inference separately.
"""

import json
import math
import os
import sys
from pathlib import Path

COMPILED = ("brrr", "brrr-launches", "brrr-cudagraphs", "brrr-templates", "brrr-recompute", "inductor")
SLOWER_THAN_EAGER = 1.03    # the zoo's rule: brrr never more than 3% slower than eager
README_BEGIN, README_END = "<!-- zoo:begin -->", "<!-- zoo:end -->"


def backend_rows(entry):
    """{backend: row dict} of a configuration that ran."""
    if entry.get("status") != "ok":
        return {}
    return {row["backend"]: row for row in entry["result"]["rows"]}


def seconds(row):
    """The backend's time: median, or the sum of its medians over changing shapes."""
    if row is None or row.get("status") == "failed":
        return None
    return row.get("total_s") if "points" in row else row.get("median_s")


def cold_compile(row):
    if row is None:
        return None
    if "points" in row:
        return row["points"][0].get("first_call_s") if row["points"] else None
    return row.get("cold_compile_s")


def passed(row):
    return row is not None and row.get("status") == "ok"


def speedup(entry, backend, base):
    rows = backend_rows(entry)
    a, b = seconds(rows.get(backend)), seconds(rows.get(base))
    return b / a if a and b else None


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(results):
    """The zoo's headline: pass rate, geomeans by train/inference, the worst configuration, eager losses."""
    entries = list(results["configs"].values())
    backends = results["environment"]["backends"]
    checks = [(e["name"], b) for e in entries for b in backends]
    ok = [(n, b) for n, b in checks if passed(backend_rows(results["configs"][n]).get(b))]
    out = {"pass_rate": len(ok) / len(checks) if checks else None, "passed": len(ok), "checked": len(checks),
           "not_ok": [f"{n}/{b}: {_why(results['configs'][n], b)}" for n, b in checks if (n, b) not in ok],
           "geomean": {}}
    for backend in [b for b in backends if b in COMPILED]:
        for mode, train in (("train", True), ("inference", False)):
            group = [e for e in entries if e["train"] == train]
            for base in ("eager", "inductor"):
                if base == backend or base not in backends:
                    continue
                out["geomean"][f"{backend} over {base}, {mode}"] = geomean(speedup(e, backend, base) for e in group)
    if "brrr" in backends:
        ranked = sorted((s, e["name"]) for e in entries if (s := speedup(e, "brrr", "eager")) is not None)
        out["worst"] = {"config": ranked[0][1], "brrr_over_eager": ranked[0][0]} if ranked else None
        out["slower_than_eager"] = [f"{name}: {1 / s:.2f}x eager's time" for s, name in ranked
                                    if 1 / s > SLOWER_THAN_EAGER]
    return out


def _why(entry, backend):
    if entry.get("status") != "ok":
        return f"{entry.get('status')}: {entry.get('error', '')[:120]}"
    row = backend_rows(entry).get(backend)
    return "not run" if row is None else (row.get("reason") or row.get("status"))


def _ms(s):
    return "—" if s is None else f"{s * 1e3:.2f}"


def _x(v):
    return "—" if v is None else f"{v:.2f}x"


def _cell(entry, backend):
    rows = backend_rows(entry)
    row = rows.get(backend)
    if row is None:
        return "—"
    if row.get("status") == "failed":
        return "FAILED"
    text = _ms(seconds(row))
    if backend != "eager":
        text += f" ({_x(speedup(entry, backend, 'eager'))})"
    if row.get("status") == "wrong":
        text += " WRONG"
    return text


def one_line(entry):
    if entry.get("status") != "ok":
        return entry.get("error", "")[:160]
    return " | ".join(f"{b} {_cell(entry, b)}" for b in backend_rows(entry))


def markdown(results):
    env = results["environment"]
    backends = env["backends"]
    lines = [f"# brrr zoo: {env['device']}, torch {env['torch']}, triton {env['triton']}, {env['dtype']}",
             "", f"Commit {env['commit']}, {env['date']}, mode {env['mode']}. Times in ms (median of do_bench; "
             "changing shapes: sum over the shapes), speedup over eager in brackets.", ""]
    if env.get("workers"):
        lines += [_workers_line(env["workers"]), ""]
    if "dynamo_skips_logging" in env:
        lines += ["Dynamo " + ("skipped logging calls in model code (no graph break there), for every backend."
                               if env["dynamo_skips_logging"] else "broke the graph at logging calls in model code."),
                  ""]
    s = summary(results)
    lines.append("## Summary")
    lines.append("")
    if s["pass_rate"] is not None:
        lines.append(f"- pass rate (ran and correct): {s['passed']}/{s['checked']} = {s['pass_rate']:.0%}")
    for key, value in s["geomean"].items():
        lines.append(f"- geometric mean, {key}: {_x(value)}")
    if s.get("worst"):
        lines.append(f"- worst configuration for brrr: {s['worst']['config']} "
                     f"({_x(s['worst']['brrr_over_eager'])} over eager)")
    if "slower_than_eager" in s:
        lines.append("- brrr more than 3% slower than eager: " + ("; ".join(s["slower_than_eager"]) or "none"))
    for line in s["not_ok"]:
        lines.append(f"- not ok: {line}")
    lines += ["", "## Configurations", ""]
    by_gpu = any("gpu_index" in e for e in results["configs"].values())
    head = ["config", "mode"] + (["gpu"] if by_gpu else []) + backends + \
        (["brrr vs inductor"] if {"brrr", "inductor"} <= set(backends) else [])
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for e in results["configs"].values():
        if e.get("status") != "ok":
            gpu = [_gpu(e)] if by_gpu else []
            lines.append("| " + " | ".join([e["name"], "train" if e["train"] else "infer"] + gpu) +
                         f" | {e['status']}: {e.get('error', '')[:100]} |" + " |" * (len(head) - 3 - len(gpu)))
            continue
        name = f"{e['name']} @{e['commit']}" if "," in str(env["commit"]) and e.get("commit") else e["name"]
        cells = [name, "train" if e["train"] else "infer"] + ([_gpu(e)] if by_gpu else []) + \
            [_cell(e, b) for b in backends]
        if "brrr vs inductor" in head:
            cells.append(_x(speedup(e, "brrr", "inductor")))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Compile, memory and error", "",
              "| config | backend | cold compile s | warm compile s (new process) | back-to-back ms | "
              "peak MiB | error vs fp32 (eager's) |", "|---|---|---|---|---|---|---|"]
    warm = results.get("warm_compile", {})
    for e in results["configs"].values():
        rows = backend_rows(e)
        eager_err = _error(rows.get("eager"))
        for backend, row in rows.items():
            warm_s = warm.get(e["name"], {}).get(backend) if isinstance(warm.get(e["name"]), dict) else None
            lines.append(f"| {e['name']} | {backend} | {_s(cold_compile(row))} | {_s(warm_s)} | "
                         f"{_ms(_steady(row))} | {_mib(_peak(row))} | {_error(row)} ({eager_err}) |")
    shapes = [e for e in results["configs"].values() if e.get("kind") == "shapes" and e.get("status") == "ok"]
    for e in shapes:
        lines += ["", f"### {e['name']}: per shape (ms; graphs compiled so far)", ""]
        rows = backend_rows(e)
        labels = [p["shape"] for p in next(iter(rows.values()))["points"]]
        lines.append("| backend | " + " | ".join(labels) + " |")
        lines.append("|---|" + "---|" * len(labels))
        for backend, row in rows.items():
            cells = [f"{_ms(p.get('median_s'))} ({p.get('graphs_compiled')})" + (" WRONG" if p["status"] == "wrong"
                                                                                 else "") for p in row["points"]]
            lines.append(f"| {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _gpu(entry):
    return "—" if entry.get("gpu_index") is None else str(entry["gpu_index"])


def _workers_line(workers):
    """Which GPU ran what, grouped by the call (`part`) whose workers ran at once on one host."""
    calls = {}
    for w in workers:
        calls.setdefault(w.get("part"), []).append(w)
    each = "; ".join((f"part {part}: " if part else "") + ", ".join(
        f"gpu {w['gpu_index']} ({w.get('configs', '?')} configurations, CPUs {w.get('cpus', '?')}, "
        f"{w.get('torch_threads', '?')} torch threads)" for w in group) for part, group in calls.items())
    return (f"Workers ran at once on one host, one GPU each: {each}. A host-bound time can be disturbed by the "
            "other workers' compiles.")


def _s(v):
    return "—" if v is None else f"{v:.1f}"


def _mib(v):
    return "—" if v is None else f"{v / 2**20:.0f}"


def _steady(row):
    if row is None:
        return None
    if "points" in row:
        values = [p.get("steady_s") for p in row["points"]]
        return sum(values) if values and all(v is not None for v in values) else None
    return row.get("steady_s")


def _peak(row):
    return None if row is None else row.get("peak_memory_bytes")


def _error(row):
    if row is None:
        return "—"
    if "points" in row:
        errs = [p.get("error_vs_reference") for p in row["points"]]
        values = [e["norm_rel"] for e in errs if e]
        return f"{max(values):.1e}" if values else "—"
    err = row.get("error_vs_reference")
    return "—" if not err else f"{err['norm_rel']:.1e}"


def write(results, stem):
    """`stem`.json and .md, each replaced whole, so a reader (the merging parent) never sees half a file."""
    stem = Path(stem)
    for suffix, text in ((".json", json.dumps(results, indent=1, default=str)), (".md", markdown(results))):
        path = stem.with_suffix(suffix)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        os.replace(partial, path)


def merge(paths):
    """One result from parts run in separate calls or by concurrent workers, in the zoo's order. A
    configuration a later part ran replaces one an earlier part skipped; one it skipped never replaces a run.
    When the parts measured different commits, each configuration keeps its own (`commit`) and the environment
    lists them all; the workers' descriptions (`environment.worker`) are gathered in `environment.workers`."""
    merged, commits, workers = None, [], []
    for path in paths:
        part = json.loads(Path(path).read_text())
        commit = part["environment"].get("commit")
        workers += part["environment"].get("workers", [])
        workers += [part["environment"]["worker"]] if part["environment"].get("worker") else []
        if commit not in commits:
            commits.append(commit)
        for entry in part["configs"].values():
            entry.setdefault("commit", commit)
        if merged is None:
            merged = part
            merged["environment"]["part"] = None
            continue
        for name, entry in part["configs"].items():
            if entry.get("status") != "skipped" or merged["configs"].get(name, {}).get("status") in (None, "skipped"):
                merged["configs"][name] = entry
        merged.setdefault("warm_compile", {}).update(part.get("warm_compile", {}))
        merged["environment"].setdefault("hosts", []).append(part["environment"].get("device"))
    if merged is not None and workers:   # parts that ran at once, one GPU each: who ran what
        merged["environment"].pop("worker", None)
        merged["environment"]["workers"] = workers
    if merged is not None and len(commits) > 1:
        merged["environment"]["commit"] = ", ".join(str(c) for c in commits)
    if merged is not None:
        merged["configs"] = {name: merged["configs"][name] for name in _zoo_order(merged["configs"])}
    return merged


def _zoo_order(names):
    """`names` in the zoo's order (models.CONFIGS), any it does not know last."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import models
        order = {c.name: i for i, c in enumerate(models.CONFIGS)}
    except ImportError:          # torch absent: report.py reads results anywhere
        order = {}
    finally:
        sys.path.pop(0)
    return sorted(names, key=lambda n: order.get(n, len(order)))


def readme_block(results, path):
    """The README's "Where it stands": the latest zoo table's summary, generated from `path`."""
    env, s = results["environment"], summary(results)
    lines = [README_BEGIN, f"The zoo (`benchmarks/zoo/`, {len(results['configs'])} configurations, bf16, "
             f"{env['device']}, torch {env['torch']}, triton {env['triton']}, commit {env['commit']}; "
             f"`{path}`):", ""]
    if s["pass_rate"] is not None:
        lines.append(f"- pass rate (ran and correct): {s['passed']}/{s['checked']}")
    for key, value in s["geomean"].items():
        lines.append(f"- geometric mean {key}: {_x(value)}")
    if s.get("worst"):
        lines.append(f"- worst for brrr: {s['worst']['config']} ({_x(s['worst']['brrr_over_eager'])} over eager)")
    if "slower_than_eager" in s:
        lines.append("- brrr more than 3% slower than eager: " + ("; ".join(s["slower_than_eager"]) or "none"))
    lines += ["", "| config | " + " | ".join(env["backends"]) + " |", "|---|" + "---|" * len(env["backends"])]
    for e in results["configs"].values():
        cells = [_cell(e, b) for b in env["backends"]] if e.get("status") == "ok" else \
            [e.get("status", "?")] + ["—"] * (len(env["backends"]) - 1)
        lines.append(f"| {e['name']} | " + " | ".join(cells) + " |")
    lines.append(README_END)
    return "\n".join(lines)


def update_readme(readme, results, path):
    text = Path(readme).read_text()
    block = readme_block(results, path)
    if README_BEGIN in text:
        head, rest = text.split(README_BEGIN, 1)
        text = head + block + rest.split(README_END, 1)[1]
    else:
        raise ValueError(f"{readme} has no {README_BEGIN} ... {README_END} block")
    Path(readme).write_text(text)


def main(argv):
    if argv[:1] == ["merge"] and len(argv) >= 3:
        results = merge(argv[2:])
        write(results, argv[1])
        print(markdown(results))
        return 0
    if argv[:1] == ["readme"] and len(argv) == 2:
        root = Path(__file__).resolve().parents[2]
        path = Path(argv[1]).resolve()
        update_readme(root / "README.md", json.loads(path.read_text()), path.relative_to(root))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
