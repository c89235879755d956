"""What the pattern scripts' reports share (floor_report.py, layout_report.py): each configuration's verdict
against eager and Inductor's better mode, the verdict of each pattern, and the Markdown's parts.

The verdict, per configuration, on `do_bench` medians (the sweep's `median_s`): brrr's time at most `SLACK` (3%)
over eager's, and at most 3% over the better of Inductor's default and `reduce-overhead` modes. A criterion whose
peer did not run (the CPU smoke run has no Inductor) is None and not counted; a brrr that failed or was wrong
fails both. A pattern passes when every configuration of it passes. The results keep the sweep's shape
(`environment`, `configs` of rows by backend), so the sweep's report reads them (and INDEX.md's headline).
"""

import json
from pathlib import Path

import sweep_report as sweep

SLACK = sweep.SLOWER_THAN_EAGER   # brrr may be this much slower and still be "at or below"
PEERS = ("eager", "inductor", "inductor-reduce-overhead")
SHOWN = ("eager", "brrr") + PEERS[1:]   # the table's backends, in its order
# the sweep's logs of brrr's decisions (sweep/run_sweep.py's brrr_logs)
LOGS = ("brrr_fallbacks", "graph_breaks", "replay_decisions", "floor_decisions", "captured_decisions")


def verdict(entry):
    """{brrr_over_eager, brrr_over_best_inductor (time ratios), best_inductor_mode, at_or_below_eager,
    at_or_below_best_inductor, pass} of one configuration's entry."""
    rows = entry.get("rows", {})
    brrr = sweep._time(rows.get("brrr"))
    mode, best = sweep.better_inductor(rows)
    out = {"brrr_status": rows.get("brrr", {}).get("status", entry.get("status")), "best_inductor_mode": mode}
    for key, base in (("eager", sweep._time(rows.get("eager"))), ("best_inductor", sweep._time(best))):
        ratio = brrr / base if brrr and base else None
        out[f"brrr_over_{key}"] = ratio
        out[f"at_or_below_{key}"] = None if base is None else bool(ratio is not None and ratio <= SLACK
                                                                     and out["brrr_status"] == "ok")
    judged = [out[k] for k in ("at_or_below_eager", "at_or_below_best_inductor") if out[k] is not None]
    out["pass"] = bool(judged) and all(judged)
    return out


def pattern_verdicts(results):
    """{pattern number: True, False, or None where a configuration of it did not run (skipped, unavailable)
    and none failed}; configurations without a pattern number (a sweep's, judged together) are left out."""
    seen = {}
    for entry in results["configs"].values():
        if not isinstance(entry.get("pattern"), int):
            continue
        status = entry.get("status")
        ok = entry.get("verdict", {}).get("pass") if status == "ok" else \
            None if status in ("skipped", "unavailable") else False
        seen.setdefault(str(entry["pattern"]), []).append(ok)
    return {n: False if False in oks else None if None in oks else True for n, oks in sorted(seen.items())}


def line(entry):
    """One configuration in a line: each backend's median, brrr's ratios and the verdict."""
    if entry.get("status") != "ok":
        return f"{entry.get('status')}: {entry.get('error', '')[:200]}"
    v = entry["verdict"]
    times = "; ".join(f"{b} {sweep._ms(r)} ms" for b, r in entry["rows"].items())
    return (f"{times}; brrr/eager {ratio_text(v['brrr_over_eager'])}, brrr/better Inductor "
            f"{ratio_text(v['brrr_over_best_inductor'])}; {'pass' if v['pass'] else 'FAIL'}")


def ratio_text(value):
    return "—" if value is None else f"{value:.2f}x"


def yes_text(value):
    return "—" if value is None else ("yes" if value else "**no**")


def _mib(row):
    b = (row or {}).get("peak_memory_bytes")
    return "—" if not b else f"{b / 2**20:.0f}"


def _steady(row):
    t = (row or {}).get("steady_s")
    return "—" if t is None else f"{t * 1e3:.2f}"


def _kernels(kernels, count):
    return ", ".join(f"`{k['name'][:60]}` {k['device_ms']:.2f} ms ({100 * k['share']:.0f}%)" for k in kernels[:count])


def header(results, title, criteria):
    """The title, where and what was measured, the `criteria` sentence and each pattern's verdict."""
    env = results["environment"]
    patterns = pattern_verdicts(results)
    return [f"# {title}", "",
            f"At {env['commit']} on {env['device']} ({env['date']}; torch {env['torch']}, triton {env['triton']}, "
            f"transformers {env.get('transformers')}; {env['mode']} run, backends {', '.join(env['backends'])}). "
            + criteria, "",
            "Patterns passing: " + (", ".join(f"{n} {yes_text(p) if p is not None else 'not all run'}"
                                              for n, p in patterns.items()) or "none measured"), ""]


def criteria():
    """The per-configuration criteria as a sentence."""
    return (f"Criteria: brrr's `do_bench` median at most {SLACK:.2f}x eager's and at most {SLACK:.2f}x the better "
            "of Inductor's default and reduce-overhead modes.")


def table(results, names=None):
    """Every configuration (or those `names`) in a row: times, ratios, verdicts, peaks, errors and status; then
    the back-to-back times."""
    names = list(results["configs"]) if names is None else names
    lines = ["| # | configuration | prec | eager ms | brrr ms | Inductor ms | Ind. reduce-overhead ms | brrr / eager "
             "| brrr / better Ind. | <= eager | <= better Ind. | peak MiB eager / brrr / Ind. / r-o | brrr err vs "
             "eager / vs precise | status |", "|" + "---|" * 14]
    for name in names:
        e = results["configs"][name]
        rows, v = e.get("rows", {}), e.get("verdict", {})
        brrr = rows.get("brrr", {})
        status = e.get("status") if e.get("status") != "ok" else brrr.get("status", "—")
        reason = (e.get("error") or brrr.get("reason") or "")[:100].replace("|", "/")
        err = brrr.get("error_vs_eager"), brrr.get("error_vs_reference")
        lines.append(f"| {e['pattern']} | {name} | {e.get('precision')}{' train' if e.get('train') else ''} | "
                     + " | ".join(sweep._ms(rows.get(b)) for b in SHOWN) + " | "
                     f"{ratio_text(v.get('brrr_over_eager'))} | {ratio_text(v.get('brrr_over_best_inductor'))} | "
                     f"{yes_text(v.get('at_or_below_eager'))} | {yes_text(v.get('at_or_below_best_inductor'))} | "
                     + " / ".join(_mib(rows.get(b)) for b in SHOWN) + " | "
                     + " / ".join("—" if value is None else f"{value:.1e}" for value in err)
                     + f" | {status}{': ' + reason if reason else ''} |")
    return lines + ["", "Back-to-back ms per call (host overhead included; eager / brrr / Inductor / reduce-overhead): "
                    + "; ".join(f"{n} " + " / ".join(_steady(results["configs"][n].get("rows", {}).get(b))
                                                      for b in SHOWN) for n in names), ""]


def top_kernels(results):
    """Each profiled configuration's top five kernels of brrr's, and three of Inductor's better mode; none off
    CUDA, where the profiler records none."""
    lines = []
    for name, e in results["configs"].items():
        kernels = e.get("kernels") or {}
        if not kernels:
            continue
        lines.append(f"- **{name}**: brrr: {_kernels(kernels.get('brrr', []), 5) or '—'}")
        mode = e.get("verdict", {}).get("best_inductor_mode")
        if mode in kernels:
            lines.append(f"  - {mode}: {_kernels(kernels[mode], 3)}")
    return ["## Top kernels", ""] + lines if lines else []


def logged(results, title, keys, count=6, width=160):
    """A section of what brrr logged under `keys`, `count` items a configuration and log, `width` characters
    each; none if nothing was."""
    found = [(n, k, e[k]) for n, e in results["configs"].items() for k in keys if e.get(k)]
    if not found:
        return []
    return ["", f"## {title}", ""] + [f"- {n}, {k}: " + "; ".join(str(item)[:width] for item in items[:count])
                                      + (" ..." if len(items) > count else "") for n, k, items in found]


def write(results, path, markdown):
    """`path` (.json) and `markdown(results)` beside it (.md)."""
    path = Path(path)
    path.write_text(json.dumps(results, indent=1, default=str))
    path.with_suffix(".md").write_text(markdown(results))
