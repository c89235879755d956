"""The op_db coverage table: how much of torch's op_db brrr lowers to its own kernels rather than running as ATen.

    .venv/bin/python benchmarks/coverage.py               # runs the whole sweep (2 workers)
    .venv/bin/python benchmarks/coverage.py --from DIR    # tabulates the outcomes a run recorded in DIR

The sweep (tests/compile/opdb.py, run by tests/compile/test_opdb.py) records one JSON line per sample when
BRRR_OPDB_RECORD is set; this script counts them per outcome, case (dtype, forward or backward), op family and
OpInfo, and writes

    benchmarks/results/coverage/<date>-cpu-<commit>.md     the table
    benchmarks/results/coverage/<date>-cpu-<commit>.json   the same numbers, per OpInfo and case
    docs/coverage.md                                       the headline and what still falls back, by reason

It exits non-zero when a sample was wrong or crashed.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from result_files import RESULTS, git_commit, result_stem, utc_date  # noqa: E402

OUTCOMES = ("kernels", "partial", "graph_aten", "wrong", "crash")
HEADS = {"kernels": "in brrr kernels", "partial": "partly ATen", "graph_aten": "whole graph ATen",
         "wrong": "wrong", "crash": "crash"}
CASES = [("float32", False), ("bfloat16", False), ("float16", False), ("int64", False), ("bool", False),
         ("float32", True)]
FAMILIES = ("pointwise", "reduction", "view", "other", "factory", "random", "contraction", "linalg", "fft")


def run_sweep(record_dir, workers, full=True):
    env = dict(os.environ, BRRR_OPDB_RECORD=str(Path(record_dir) / "outcomes"), TRITON_INTERPRET="1",
               PYTHONPATH=str(ROOT), BRRR_OPDB_CUT="0" if full else "1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", "-n", str(workers),
           "tests/compile/test_opdb.py", "-k", "test_op_matches_eager"]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def load(record_dir):
    rows = []
    for path in sorted(Path(record_dir).glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def case_name(dtype, backward):
    return f"{dtype} {'backward' if backward else 'forward'}"


def pct(n, total):
    return f"{100 * n / total:.1f}%" if total else "-"


# ------------------------------------------------------------------------------------- the numbers


def lowered(rows):
    """Whether brrr ran every sample of `rows` in its own kernels (or a designed extern: matmul, conv, SDPA)."""
    return all(r["outcome"] == "kernels" for r in rows)


def summary(rows):
    by_op, by_case = collections.defaultdict(list), collections.defaultdict(list)
    for r in rows:
        by_op[r["op"]].append(r)
        by_case[(r["op"], r["dtype"], r["backward"])].append(r)
    return {
        "ops": [sum(lowered(rs) for rs in by_op.values()), len(by_op)],
        "cases": [sum(lowered(rs) for rs in by_case.values()), len(by_case)],
        "samples": [sum(r["outcome"] == "kernels" for r in rows), len(rows)],
        "wrong": sum(r["outcome"] == "wrong" for r in rows),
        "crash": sum(r["outcome"] == "crash" for r in rows),
    }


TARGET_FAMILIES = ("pointwise", "reduction", "view")


def target_share(rows):
    """The reliability issue's measure, ([in kernels, samples], {family: [in kernels, samples]}): the float32
    forward samples of pointwise, reduction and view OpInfos that ran wholly in brrr's kernels."""
    counts = {f: [0, 0] for f in TARGET_FAMILIES}
    for e in per_opinfo(rows).values():
        case = e["cases"].get("float32 forward")
        if e["family"] in counts and case:
            counts[e["family"]][0] += case[0]
            counts[e["family"]][1] += case[1]
    return [sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())], counts


THEMES = [   # (theme of an ATen op brrr has no lowering for, name patterns)
    ("linear algebra (LAPACK-style factorizations and solves)",
     r"^_?linalg_|^lu_|^cholesky|^triangular_solve|^geqrf|^ormqr|^orgqr|^with_effects|^_?lu_|^lstsq|^slogdet|^det$"),
    ("FFT", r"^_fft_"),
    ("complex numbers", r"^view_as_(real|complex)|^_?conj|^complex|^polar|^angle"),
    ("special functions", r"gamma|^i0|^special_|^erfinv|^igamma|^frexp|^bessel|^_?zeta|^sinc"),
    ("scans (cumulative ops)", r"^cum|^_cum|^logcumsumexp"),
    ("sorting and selection", r"^sort|^argsort|^topk|^kthvalue|^median|^nanmedian|^mode|^searchsorted|^unique"
                              r"|^bucketize|^_unique|^histc|^bincount"),
    ("scatter, indexed writes and segment reductions", r"^scatter|^index_put|^index_reduce|^put|^_?segment_reduce"
                                                       r"|^index_add|^index_copy|^masked_scatter"),
    ("random sampling", r"^rand|^normal|^bernoulli|^multinomial|^poisson|^exponential|^geometric|^cauchy"
                        r"|^log_normal|^uniform|^_standard_gamma|^binomial"),
    ("pooling, resampling and padding backward (3-d, adaptive max, fractional, grid sampling, antialiasing)",
     r"pool|^grid_sampler|^_upsample|^replication_pad"),
    ("`*_copy` forms of views", r"_copy$"),
    ("integer bit and number-theory ops", r"shift|^gcd$|^lcm$|^nextafter$"),
    ("histograms", r"^histogram|^_histogramdd"),
]


def theme(aten_op):
    name = aten_op.replace("aten.", "").split(".")[0]
    for what, pattern in THEMES:
        if re.search(pattern, name):
            return what
    return "other ops"


def category(reason, aten_op=""):
    """A fallback's reason without the op's particulars: what kind of gap it is."""
    if reason.startswith("no brrr lowering for"):
        return f"no lowering: {theme(aten_op or reason.split()[-1])}"
    if "complex" in reason:
        return "complex dtypes: brrr generates no kernels for them"
    if "not generated" in reason:
        return "a dtype brrr generates no kernels for"
    if reason.startswith("no kernel code for") or reason.startswith("integer pow"):
        return "math without kernel code for the operand kind"
    if "DataDependentOutput" in reason or "DynamicOutputShape" in reason or "data-dependent" in reason \
            or "Dynamo graph break" in reason:
        return "data-dependent output (the sample's shapes depend on its values): Dynamo breaks the graph"
    if "AOTAutograd cannot trace" in reason or "no graph" in reason:
        return "no graph to compile (AOTAutograd cannot trace the op)"
    return "the lowering refuses this form of the op"


def fallbacks_by_reason(rows):
    """{category: {ATen op or 'whole graph': {"reason": most common reason, "opinfos": sorted OpInfos}}}."""
    out = collections.defaultdict(lambda: collections.defaultdict(lambda: [collections.Counter(), set()]))
    for r in rows:
        for op, reason in r["fallbacks"]:
            entry = out[category(reason, op)][op]
            entry[0][reason] += 1
            entry[1].add(r["op"])
        if r["outcome"] == "graph_aten":
            entry = out[category(r["detail"])]["whole graph"]
            entry[0][_short_reason(r["detail"])] += 1
            entry[1].add(r["op"])
    return {cat: {op: {"reason": c.most_common(1)[0][0], "opinfos": sorted(ops)} for op, (c, ops) in
                  sorted(entries.items(), key=lambda kv: -len(kv[1][1]))}
            for cat, entries in sorted(out.items(), key=lambda kv: -len(set().union(*(e[1] for e in kv[1].values()))))}


def _short_reason(detail):
    """A whole-graph reason without the sample's particulars (shapes, values), to count alike reasons."""
    text = detail.split(" (AOTAutograd cannot trace it: ")
    if len(text) > 1:
        return f"{text[0]}: AOTAutograd cannot trace it ({text[1].split(':')[0]})"
    return re.sub(r"\s+", " ", detail.split(";")[0][:120].replace("|", "/"))


def per_opinfo(rows):
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["op"], r["dtype"], r["backward"])].append(r)
    out = {}
    for op in sorted({r["op"] for r in rows}):
        cases, fell, graph = {}, {}, False
        for d, b in CASES:
            rs = by.get((op, d, b))
            if rs is None:
                continue
            cases[case_name(d, b)] = [sum(r["outcome"] == "kernels" for r in rs), len(rs)]
            for r in rs:
                for f, why in r["fallbacks"]:
                    fell.setdefault(f, why)
                graph |= r["outcome"] == "graph_aten"
        out[op] = {"family": next(r["family"] for r in rows if r["op"] == op), "cases": cases,
                   "fallbacks": fell, "whole_graph_aten": graph}
    return out


# ------------------------------------------------------------------------------------- the files


def counts_row(label, rows, extra=()):
    c = collections.Counter(r["outcome"] for r in rows)
    cells = [label, *extra, str(len(rows))] + [f"{c[o]} ({pct(c[o], len(rows))})" if o in ("kernels", "partial",
                                                "graph_aten") else str(c[o]) for o in OUTCOMES]
    return "| " + " | ".join(cells) + " |"


def table(head, lines):
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + lines


def headline(s):
    return (f"OpInfos fully lowered: **{s['ops'][0]} of {s['ops'][1]} ({pct(*s['ops'])})**; (OpInfo, dtype, "
            f"forward/backward) cases: **{s['cases'][0]} of {s['cases'][1]} ({pct(*s['cases'])})**; samples: "
            f"{s['samples'][0]} of {s['samples'][1]} ({pct(*s['samples'])}). Wrong: {s['wrong']}, crashed: "
            f"{s['crash']}.")


def versions():
    import torch
    import triton
    return torch.__version__, triton.__version__


def tabulate(rows, commit, date, full):
    s = summary(rows)
    torch_v, triton_v = versions()
    matrix = ("float32, bfloat16, float16, int64 and bool forward where the op has the dtype, float32 backward "
              "where it supports autograd; the first two samples of each, as given and as a non-contiguous copy"
              if full else "the cut (BRRR_OPDB_CUT=1, tests/compile/test_opdb.py's docstring)")
    out = ["# op_db coverage", "",
           f"`benchmarks/coverage.py` at commit `{commit}` ({date}; torch {torch_v}, triton {triton_v}; CPU, "
           f"kernels in the Triton interpreter). Every OpInfo of `op_db` and its variants; {matrix}. Outcomes: "
           "**in brrr kernels** (every op in brrr's kernels or a designed extern: matmul, conv, attention), "
           "**partly ATen** (some ops ran as ATen: the fallbacks below), **whole graph ATen** (the graph, or the "
           "whole sample, ran as ATen), **wrong** (differs from eager), **crash** (brrr raised). An OpInfo or a "
           "case counts as lowered when every one of its samples ran in brrr kernels.", "",
           headline(s), "", "## Outcomes per case", ""]
    head = ["case", "samples"] + [HEADS[o] for o in OUTCOMES]
    lines = [counts_row(case_name(d, b), [r for r in rows if r["dtype"] == d and r["backward"] == b])
             for d, b in CASES if any(r["dtype"] == d and r["backward"] == b for r in rows)]
    lines.append(counts_row("**all**", rows))
    out += table(head, lines) + [""]

    out += ["## Per op family", "",
            "Families from torch's own metadata: the OpInfo's class (unary/binary ufunc: pointwise; reduction) "
            "and the tags of the ATen ops eager runs for it (random: `nondeterministic_seeded`; pointwise tag; "
            "a normalization; contraction; views only: view); `other` is indexing, scatter, cat, padding, "
            "pooling, losses, sorting and the rest. OpInfos lowered: every sample of every case in kernels.", ""]
    head = ["family", "OpInfos", "OpInfos lowered", "samples"] + [HEADS[o] for o in OUTCOMES]
    lines = []
    for f in FAMILIES:
        fr = [r for r in rows if r["family"] == f]
        if not fr:
            continue
        ops = collections.defaultdict(list)
        for r in fr:
            ops[r["op"]].append(r)
        k = sum(lowered(rs) for rs in ops.values())
        lines.append(counts_row(f, fr, (str(len(ops)), f"{k} ({pct(k, len(ops))})")))
    out += table(head, lines) + [""]

    out += ["## ATen ops that ran as ATen", "",
            "Each ATen op that fell back, with the number of OpInfos it fell back in and its most common reason.", ""]
    lines = []
    for cat, entries in fallbacks_by_reason(rows).items():
        for op, e in entries.items():
            lines.append(f"| `{op}` | {len(e['opinfos'])} | {e['reason'].replace('|', '/')[:160]} |")
    lines.sort(key=lambda line: -int(line.split("|")[2]))
    out += table(["ATen op", "OpInfos", "reason"], lines) + [""]

    bad = [r for r in rows if r["outcome"] in ("wrong", "crash")]
    if bad:
        out += ["## Wrong and crashed samples", ""]
        out += table(["OpInfo", "case", "sample", "outcome", "detail"],
                     [f"| `{r['op']}` | {case_name(r['dtype'], r['backward'])} | {r['sample']} {r['layout']} | "
                      f"{r['outcome']} | {r['detail'].replace('|', '/')[:200]} |" for r in bad]) + [""]

    out += ["## Per OpInfo", "",
            "Samples in brrr kernels out of the samples run, per case (`-`: the op lacks the dtype or autograd), "
            "and the ATen ops that ran as ATen.", ""]
    present = [(d, b) for d, b in CASES if any(r["dtype"] == d and r["backward"] == b for r in rows)]
    head = ["OpInfo", "family"] + [case_name(d, b).replace(" forward", "") for d, b in present] + ["ran as ATen"]
    lines = []
    for op, e in per_opinfo(rows).items():
        cells = ["-" if case_name(d, b) not in e["cases"] else "{}/{}".format(*e["cases"][case_name(d, b)])
                 for d, b in present]
        fell = sorted(e["fallbacks"])
        note = ", ".join(f"`{f.replace('aten.', '')}`" for f in fell[:6]) + (" ..." if len(fell) > 6 else "")
        if e["whole_graph_aten"]:
            note = (note + "; " if note else "") + "whole graph"
        lines.append(f"| `{op}` | {e['family']} | " + " | ".join(cells) + f" | {note} |")
    out += table(head, lines)
    return "\n".join(out) + "\n"


def as_json(rows, commit, date, full):
    torch_v, triton_v = versions()
    return {"commit": commit, "date": date, "torch": torch_v, "triton": triton_v, "device": "cpu (Triton interpreter)",
            "matrix": "full" if full else "cut", "summary": summary(rows),
            "per_case": {case_name(d, b): dict(collections.Counter(r["outcome"] for r in rows
                                                                   if r["dtype"] == d and r["backward"] == b))
                         for d, b in CASES},
            "fallbacks_by_reason": fallbacks_by_reason(rows), "opinfos": per_opinfo(rows),
            "wrong_or_crash": [r for r in rows if r["outcome"] in ("wrong", "crash")]}


def docs_page(rows, commit, date, table_path):
    s = summary(rows)
    target, by_family = target_share(rows)
    rel = os.path.relpath(table_path, ROOT / "docs")
    out = ["# op_db coverage", "",
           "How much of torch's `op_db` brrr compiles itself. `tests/compile/test_opdb.py` runs every OpInfo "
           "through brrr's pipeline (AOTAutograd with brrr's decompositions, lowering, scheduling, Triton kernels "
           "under `TRITON_INTERPRET=1`) and judges each sample against eager (`tests/compile/opdb_judge.py`): a "
           "wrong result or a crash fails the test. Whatever brrr cannot do correctly it refuses at lowering, and "
           "that op runs as an ATen call inside the compiled graph (an op-scope fallback, "
           "`brrr/compile/fallbacks.py`); those fallbacks are what this page counts.", "",
           "Regenerate (about 15 minutes on two cores; writes the table, its JSON and this page):", "",
           "    TRITON_INTERPRET=1 .venv/bin/python benchmarks/coverage.py", "",
           "It runs the whole matrix (the test suite runs a cut): forward in float32, bfloat16, float16, int64 and bool "
           "where the op has the dtype, backward in float32 where it supports autograd, the first two samples of "
           "each as given and as a non-contiguous copy (`BRRR_OPDB_CUT=1` runs a cut, see `test_opdb.py`).", "",
           f"## The numbers (commit `{commit}`, {date})", "",
           headline(s), "",
           "- an **OpInfo** counts as lowered when every sample of every one of its cases ran in brrr's kernels "
           "(a designed extern, matmul, conv or attention, counts as brrr's); one op of one sample falling back "
           "is enough to count it out;",
           "- a **case** is one OpInfo in one dtype, forward or backward, with the same rule over its samples;",
           f"- the reliability issue's target is 90% of the float32 forward samples of pointwise, reduction and "
           f"view ops: {target[0]} of {target[1]} ({pct(*target)}) run in brrr's kernels ("
           + ", ".join(f"{f} {pct(*c)}" for f, c in by_family.items()) + "). The gap is listed below by reason, "
           "largest first: mostly ops brrr has no lowering for (linear algebra, complex numbers and FFT, scatter "
           "and indexed writes, random sampling, sorting, scans), then forms of lowered ops it refuses "
           "(`index_put` other than an accumulating one-index write, advanced indexing) and data-dependent "
           "output shapes.", "",
           f"Per case, per op family and per OpInfo: [{os.path.basename(table_path)}]({rel}).", "",
           "## What still runs as ATen, by reason", "",
           "Each ATen op that fell back somewhere in the sweep, with the OpInfos it fell back in.", ""]
    for cat, entries in fallbacks_by_reason(rows).items():
        n = len(set().union(*(set(e["opinfos"]) for e in entries.values())))
        out += [f"### {cat} ({n} OpInfos)", ""]
        for op, e in entries.items():
            ops = e["opinfos"]
            names = ", ".join(f"`{o}`" for o in ops[:8]) + (f" and {len(ops) - 8} more" if len(ops) > 8 else "")
            why = "" if cat.startswith(("no lowering", "complex")) else f" ({e['reason'].replace('|', '/')[:140]})"
            out.append(f"- `{op}`{why}: {names}")
        out.append("")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="source", help="tabulate outcomes recorded in this directory (no sweep)")
    ap.add_argument("--cut", action="store_true", help="run the cut (BRRR_OPDB_CUT=1) instead of the whole matrix")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--date", help="the date in the file names (default: today, UTC)")
    ap.add_argument("--commit", help="the commit in the file names (default: HEAD's short hash)")
    args = ap.parse_args(argv)
    record_dir = args.source
    if record_dir is None:
        record_dir = tempfile.mkdtemp(prefix="brrr-opdb-")
        print(f"running the sweep, outcomes in {record_dir}")
        run_sweep(record_dir, args.workers, full=not args.cut)
    rows = load(record_dir)
    if not rows:
        sys.exit(f"no outcomes recorded in {record_dir}")
    full = not args.cut
    commit, date = args.commit or git_commit(ROOT), args.date or utc_date()
    stem = result_stem(RESULTS / "coverage", "cpu", commit, date)
    stem.with_suffix(".md").write_text(tabulate(rows, commit, date, full))
    stem.with_suffix(".json").write_text(json.dumps(as_json(rows, commit, date, full), indent=1) + "\n")
    (ROOT / "docs" / "coverage.md").write_text(docs_page(rows, commit, date, stem.with_suffix(".md")))
    s = summary(rows)
    print(headline(s).replace("**", ""))
    print(f"table in {stem}.md, numbers in {stem}.json, docs/coverage.md")
    return 1 if s["wrong"] or s["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
