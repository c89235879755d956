"""The sweep's report: the summary a compiler change is judged by, the Markdown tables, the README block.

    python3 benchmarks/sweep/sweep_report.py readme benchmarks/results/sweep/<file>.json   # README's "Where it stands"
    python3 benchmarks/sweep/sweep_report.py md benchmarks/results/sweep/<file>.json       # print the Markdown

Summary: the pass rate (brrr's result within the zoo's rule, of the configurations eager ran); the geometric
means of brrr over eager, over Inductor's default mode and over Inductor's better mode (the faster of default
and `reduce-overhead` for each configuration), for training and inference separately; how many
configurations are more than 3% slower than eager and how many are behind Inductor's better mode; the peak
memory of brrr over Inductor's for every training configuration; and the 15 worst configurations by brrr over
Inductor's better mode, with their top kernels where the run profiled them.
"""

import json
import math
import re
import sys
from pathlib import Path

SLOWER_THAN_EAGER = 1.03   # a configuration is slower than eager beyond this ratio of times
WORST = 15
README_BEGIN, README_END = "<!-- sweep:begin -->", "<!-- sweep:end -->"


def _time(row):
    return row.get("median_s") if row and row.get("status") in ("ok", "wrong") else None


def better_inductor(rows):
    """(mode, row) of the faster Inductor mode that ran, or (None, None)."""
    timed = [(b, r) for b, r in rows.items() if b.startswith("inductor") and _time(r)]
    return min(timed, key=lambda br: br[1]["median_s"]) if timed else (None, None)


def ratios(entry):
    """brrr's speed over eager, Inductor default and Inductor's better mode (>1: brrr faster), or None each;
    none for a configuration measured on a GPU other workers shared (`--share-gpu`): its times are contended."""
    if entry.get("shared_gpu", 1) > 1:
        return {}
    rows = entry.get("rows", {})
    brrr = _time(rows.get("brrr"))
    if not brrr:
        return {}
    out = {}
    for label, row in (("eager", rows.get("eager")), ("inductor", rows.get("inductor")),
                       ("best_inductor", better_inductor(rows)[1])):
        if _time(row):
            out[label] = _time(row) / brrr
    return out


def memory_ratio(entry, peer="inductor", field="peak_memory_bytes"):
    rows = entry.get("rows", {})
    b, i = (rows.get(k, {}).get(field) for k in ("brrr", peer))
    return b / i if b and i else None


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def ran(results):
    """The configurations whose eager ran: the ones the summary counts."""
    return {n: e for n, e in results["configs"].items()
            if e.get("status") == "ok" and _time(e.get("rows", {}).get("eager"))}


def summarize(results):
    configs = ran(results)
    passed = [n for n, e in configs.items() if e["rows"].get("brrr", {}).get("status") == "ok"]
    summary = {"configurations": len(results["configs"]), "ran": len(configs), "brrr_passed": len(passed),
               "pass_rate": len(passed) / len(configs) if configs else None,
               "not_run": {s: sum(e.get("status") == s for e in results["configs"].values())
                           for s in ("unavailable", "error", "skipped")}}
    for kind, train in (("training", True), ("inference", False)):
        mine = [e for e in configs.values() if e["train"] == train]
        r = [ratios(e) for e in mine]
        summary[kind] = {"configurations": len(mine),
                         **{f"brrr_over_{k}": geomean([x.get(k) for x in r])
                            for k in ("eager", "inductor", "best_inductor")}}
    slower = sorted(n for n, e in configs.items() if ratios(e).get("eager", 2) < 1 / SLOWER_THAN_EAGER)
    behind = sorted(n for n, e in configs.items() if ratios(e).get("best_inductor", 2) < 1)
    failed = sorted(n for n, e in configs.items() if e["rows"].get("brrr", {}).get("status") != "ok")
    summary.update(slower_than_eager=slower, behind_best_inductor=behind, brrr_not_ok=failed)
    summary["training_memory_ratio"] = {n: memory_ratio(e) for n, e in configs.items() if e["train"]}
    # against reduce-overhead, allocated and reserved: its cudagraph trees hand out pool memory the allocator does
    # not count as allocated, which the reserved peak does count
    summary["training_memory_over_reduce_overhead"] = {
        kind: geomean([memory_ratio(e, "inductor-reduce-overhead", field) for e in configs.values() if e["train"]])
        for kind, field in (("allocated", "peak_memory_bytes"), ("reserved", "peak_reserved_bytes"))}
    summary["worst"] = [{"name": n, "brrr_over_best_inductor": ratios(configs[n])["best_inductor"],
                         "best_inductor_mode": better_inductor(configs[n]["rows"])[0],
                         "kernels": configs[n].get("kernels")} for n in ranked(results)[:WORST]]
    return summary


def ranked(results):
    """The configurations that ran with both brrr and an Inductor mode, brrr's worst ratio to the better first."""
    configs = ran(results)
    timed = [n for n in configs if ratios(configs[n]).get("best_inductor")]
    return sorted(timed, key=lambda n: ratios(configs[n])["best_inductor"])


def _fmt(x, spec=".2f", none="—"):
    return none if x is None else format(x, spec)


def _ms(row):
    t = _time(row)
    if t is None:
        return (row or {}).get("status", "—") if row else "—"
    return f"{t * 1e3:.2f}" + ("*" if row.get("cached") else "")


def _gb(row):
    b = (row or {}).get("peak_memory_bytes")
    return _fmt(b / 2**30 if b else None)


def summary_lines(results, summary=None):
    s = summary or summarize(results)
    env = results.get("environment", {})
    lines = [f"Sweep at {env.get('commit')} on {env.get('device')} ({env.get('date')}, torch {env.get('torch')}, "
             f"triton {env.get('triton')}): {s['ran']} of {s['configurations']} configurations ran "
             f"({', '.join(f'{v} {k}' for k, v in s['not_run'].items() if v) or 'all'}); brrr passed "
             f"{s['brrr_passed']}/{s['ran']} ({_fmt((s['pass_rate'] or 0) * 100, '.0f')}%).", "",
             "| | configurations | brrr over eager | over Inductor default | over Inductor's better mode |",
             "|---|---|---|---|---|"]
    for kind in ("training", "inference"):
        k = s[kind]
        lines.append(f"| {kind} | {k['configurations']} | {_fmt(k['brrr_over_eager'])}x | "
                     f"{_fmt(k['brrr_over_inductor'])}x | {_fmt(k['brrr_over_best_inductor'])}x |")
    commits = {}
    for e in ran(results).values():
        commits[e.get("commit", env.get("commit"))] = commits.get(e.get("commit", env.get("commit")), 0) + 1
    if len(commits) > 1:   # a file that joins several runs: each configuration keeps the commit it measured
        lines += ["", "Measured at " + ", ".join(f"{c} ({n} configurations)" for c, n in sorted(commits.items()))
                  + "; each row's commit is in the JSON."]
    mem = [v for v in s["training_memory_ratio"].values() if v]
    lines += ["", f"- more than 3% slower than eager: {len(s['slower_than_eager'])}"
                  + (f" ({', '.join(s['slower_than_eager'])})" if s["slower_than_eager"] else ""),
              f"- behind Inductor's better mode: {len(s['behind_best_inductor'])}",
              f"- brrr failed or wrong: {len(s['brrr_not_ok'])}"
              + (f" ({', '.join(s['brrr_not_ok'])})" if s["brrr_not_ok"] else ""),
              f"- training peak memory, brrr / Inductor default: median {_fmt(_median(mem))}x, "
              f"max {_fmt(max(mem) if mem else None)}x over {len(mem)} configurations",
              "- training peak memory, brrr / Inductor reduce-overhead (geometric mean): allocated "
              f"{_fmt(s['training_memory_over_reduce_overhead']['allocated'])}x, reserved "
              f"{_fmt(s['training_memory_over_reduce_overhead']['reserved'])}x"]
    return lines


def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def markdown(results):
    s = summarize(results)
    lines = ["# The sweep", ""] + summary_lines(results, s) + ["", "## Worst 15 by brrr over Inductor's better mode",
                                                              "", "| configuration | brrr / better Inductor | mode | top kernels (brrr; Inductor) |",
                                                              "|---|---|---|---|"]
    for w in s["worst"]:
        kernels = w.get("kernels") or {}
        tops = "; ".join(f"{b}: " + ", ".join(f"{k['name'][:40]} {k['device_ms']:.2f} ms" for k in ks[:3])
                         for b, ks in kernels.items())
        lines.append(f"| {w['name']} | {w['brrr_over_best_inductor']:.2f}x | {w['best_inductor_mode']} | {tops or '—'} |")
    lines += ["", "## Every configuration", "",
              "Times in ms (`do_bench` median; * = a cached peer scaled by eager's ratio); peaks in GiB over the "
              "whole run; compile = first call, s.", "",
              "| configuration | prec | eager | brrr | Inductor | Ind. reduce-overhead | brrr/eager | brrr/best Ind. "
              "| peak brrr / Ind. | compile brrr / Ind. | status |", "|" + "---|" * 11]
    for name, e in sorted(results["configs"].items()):
        rows = e.get("rows", {})
        r = ratios(e)
        brrr = rows.get("brrr", {})
        status = e.get("status") if e.get("status") != "ok" else brrr.get("status", "—")
        if e.get("shared_gpu", 1) > 1:
            status += f" (memory only: GPU shared by {e['shared_gpu']})"
        reason = (e.get("error") or brrr.get("reason") or "")[:80].replace("|", "/")
        compile_s = f"{_fmt(brrr.get('first_call_s'), '.0f')} / {_fmt(rows.get('inductor', {}).get('first_call_s'), '.0f')}"
        lines.append(f"| {name} | {e.get('precision', '')}{' train' if e.get('train') else ''} | "
                     f"{_ms(rows.get('eager'))} | {_ms(brrr)} | {_ms(rows.get('inductor'))} | "
                     f"{_ms(rows.get('inductor-reduce-overhead'))} | {_fmt(r.get('eager'))} | "
                     f"{_fmt(r.get('best_inductor'))} | {_gb(brrr)} / {_gb(rows.get('inductor'))} | {compile_s} | "
                     f"{status}{': ' + reason if reason else ''} |")
    return "\n".join(lines) + "\n"


def write(results, stem):
    stem = Path(stem)
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    stem.with_suffix(".md").write_text(markdown(results))


def merge(paths):
    """Several runs' files as one: a configuration that ran replaces one that did not; a later file wins."""
    merged = None
    for path in paths:
        results = json.loads(Path(path).read_text())
        if merged is None:
            merged = {"environment": dict(results["environment"]), "configs": {}}
            merged["environment"]["workers"] = []
        merged["environment"]["workers"].append(results["environment"].get("worker"))
        for name, entry in results["configs"].items():
            old = merged["configs"].get(name)
            if old is None or entry.get("status") == "ok" or old.get("status") != "ok":
                merged["configs"][name] = entry
    return merged


def readme_block(results, source):
    return "\n".join([README_BEGIN, f"From [`{source}`]({source}), written by `benchmarks/sweep/sweep_report.py readme`:",
                      ""] + summary_lines(results) + [README_END])


def update_readme(readme, results, source):
    text = Path(readme).read_text()
    block = readme_block(results, source)
    if README_BEGIN in text:
        text = re.sub(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), lambda m: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    Path(readme).write_text(text)


def main(argv=None):
    argv = argv if argv is not None else sys.argv[1:]
    if len(argv) != 2 or argv[0] not in ("readme", "md"):
        raise SystemExit(__doc__.split("\n\n")[1])
    results = json.loads(Path(argv[1]).read_text())
    if argv[0] == "md":
        print(markdown(results))
        return
    root = Path(__file__).resolve().parents[2]
    source = Path(argv[1]).resolve().relative_to(root).as_posix()
    update_readme(root / "README.md", results, source)
    print(f"README.md: 'Where it stands' from {source}")


if __name__ == "__main__":
    main()
