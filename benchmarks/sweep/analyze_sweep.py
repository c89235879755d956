"""`brrr analyze --verify` over the sweep's configurations (issue 45): each remedy's predicted step time beside
its measurement, the prediction errors per remedy kind, and the calibration the analyzer learns from them.

    PYTHONPATH=$PWD python3 benchmarks/sweep/analyze_sweep.py --per-family 8 --gpus 4 --out $OUT/analyze \
        [--configs a,b | --configs-from FILE] [--remedies compile,cuda-graphs] [--previous FILE] [--budget-s S]
        [--timeout-s S]

Each configuration runs in a process of its own (a crash, a hang or an out-of-memory loses that one only), on one
GPU and one share of the CPUs, in its sweep precision (amp: the forward under bf16 autocast). The analysis is
uncalibrated (an empty table, nothing recorded), so the errors are the cost model's own. The summary gives, per
remedy kind, the median and 90th percentile of |prediction error| two ways:

- uncalibrated: the cost model alone;
- calibrated, leave one out: each configuration's prediction corrected by the median measured / predicted ratio
  of the *other* configurations of that kind (what a table learnt from the sweep predicts for a model it has not
  seen). The issue's acceptance reads these: median at most 25%, 90th percentile at most 60%.

It also checks, per configuration, that the advice equals the ranking of measured gains. With `--prior` (or
`--prior-from FILE`, from a results file, running nothing), the measured / predicted ratios are written into
brrr's shipped calibration (brrr/analyze/calibration_prior.json, per device; `--prior-skip` leaves out kinds whose
prediction changed since), which `brrr analyze` uses for a kind its own table has not measured. `--previous` merges an
earlier results file (a sweep spread over sessions): the configurations it measured are not run again unless named
in --configs, where the new row replaces the old.
Writes <date>-<gpu>-<commit>-analyze-sweep.json and .md under --out (default
benchmarks/results/sweep-analyze/).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
MAX_MEDIAN_ERROR, MAX_P90_ERROR = 0.25, 0.60


def percentile(values, q):
    """The q-quantile of `values` by linear interpolation (q in [0, 1])."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def pick(configs, per_family, names=None):
    """The configurations to analyze: those named, or the first `per_family` of each family in turn (each
    family in the catalog's own order, so no model is picked for how it fares)."""
    import catalog

    if names:
        by_name = {c.name: c for c in configs}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise SystemExit(f"unknown configurations: {', '.join(missing)}")
        return [by_name[n] for n in names]
    taken = {}
    for c in configs:
        if len(taken.setdefault(c.family, [])) < per_family:
            taken[c.family].append(c)
    return catalog.interleaved([c for family in taken.values() for c in family])


# ------------------------------------------------------------------------------------------------ one process

class Amp(torch.nn.Module):
    """`model`'s forward under bf16 autocast: the sweep's amp precision."""

    def __init__(self, model, device_type):
        super().__init__()
        self.inner, self.device_type = model, device_type

    def forward(self, *args, **kwargs):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.inner(*args, **kwargs)


def child(name, device_name, quick, remedy_kinds):
    """Analyze and verify configuration `name`; print its row as one RESULT line of JSON."""
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import catalog
    from brrr.analyze import analyze
    from brrr.analyze import verify as verify_mod
    from brrr.analyze.report import json_safe

    config = next(c for c in catalog.all_configs() if c.name == name)
    device = torch.device(device_name)
    work = config.build(device, quick)
    model = Amp(work.model, device.type) if config.precision == "amp" else work.model
    remedies = [r for r in verify_mod.REMEDIES if not remedy_kinds or r.kind in remedy_kinds]
    start = time.perf_counter()
    analysis = analyze(model, *work.inputs, train=work.train, calibrate=False)
    analyzed_s = time.perf_counter() - start
    verify_mod.verify(analysis, model, work.inputs, train=work.train, remedies=remedies, table={}, record=False)
    structure = analysis.structure
    row = {"config": name, "family": config.family, "precision": config.precision, "train": work.train,
           "analysis_s": analyzed_s, "verify_s": time.perf_counter() - start - analyzed_s,
           "wall_time_s": analysis.wall_time_s, "regimes": analysis.regimes,
           "graphs": None if structure is None else {"graphs": structure.graphs, "breaks": structure.breaks,
                                                     "guards": structure.guards},
           "op_classes": {k: v["time_s"] for k, v in analysis.op_classes.items()},
           "baseline_s": analysis.verify["baseline_s"], "remedies": analysis.verify["remedies"],
           "predictions": {kind: p.to_dict() for kind, p in analysis.predictions.items()},
           "advice": [{k: a.get(k) for k in ("kind", "basis", "measured_saving_s", "predicted_saving_s")}
                      for a in analysis.advice]}
    print("RESULT " + json.dumps(json_safe(row)), flush=True)


# ------------------------------------------------------------------------------------------------ the summary

def _pairs(rows):
    """{kind: [(config, predicted uncalibrated s, measured s)]} over the measured remedies of `rows`."""
    pairs = {}
    for row in rows:
        for r in row.get("remedies", []):
            if r.get("measured_s") and r.get("predicted_uncalibrated_s"):
                pairs.setdefault(r["kind"], []).append((row["config"], r["predicted_uncalibrated_s"],
                                                        r["measured_s"]))
    return pairs


def errors_by_kind(rows):
    """Per remedy kind: each configuration's uncalibrated and leave-one-out calibrated |prediction error|,
    and their median and 90th percentile."""
    out = {}
    for kind, pairs in _pairs(rows).items():
        ratios = [m / p for _, p, m in pairs]
        plain, loo = [], []
        for i, (config, predicted, measured) in enumerate(pairs):
            plain.append(abs(predicted - measured) / measured)
            others = ratios[:i] + ratios[i + 1:]
            if others:
                loo.append(abs(predicted * statistics.median(others) - measured) / measured)
        out[kind] = {"configs": [c for c, _, _ in pairs], "ratios": ratios,
                     "uncalibrated": {"errors": plain, "median": statistics.median(plain),
                                      "p90": percentile(plain, 0.9)},
                     "calibrated": {"errors": loo, "median": statistics.median(loo) if loo else None,
                                    "p90": percentile(loo, 0.9)}}
    return out


def advice_follows_measurements(row):
    """Whether the advice lists exactly the remedies that measured a gain, first and by measured saving."""
    gains = sorted((r for r in row.get("remedies", []) if r.get("status") == "gain"),
                   key=lambda r: -r["saving_s"])
    measured = [a for a in row.get("advice", []) if a.get("basis") == "measured"]
    if [a["kind"] for a in measured] != [r["kind"] for r in gains]:
        return False
    first = row.get("advice", [])[:len(measured)]
    return first == measured


def slower_than_eager(row, kinds=("compile", "cuda-graphs"), slack=1.03):
    """{kind: measured / eager} for brrr's remedies that measured more than `slack` times the step as analyzed
    (issue 41's floor: brrr is never to be slower than eager)."""
    return {r["kind"]: r["measured_s"] / row["baseline_s"] for r in row.get("remedies", [])
            if r["kind"] in kinds and r.get("measured_s") and r["measured_s"] > slack * row["baseline_s"]}


def summary(rows):
    ok = [r for r in rows if "error" not in r]
    kinds = errors_by_kind(ok)
    passing = {k: (v["calibrated"]["median"] is not None and v["calibrated"]["median"] <= MAX_MEDIAN_ERROR and
                   v["calibrated"]["p90"] <= MAX_P90_ERROR) for k, v in kinds.items()}
    return {"configs": len(ok), "failed": [r["config"] for r in rows if "error" in r],
            "families": sorted({r["family"] for r in ok}), "kinds": kinds, "kind_passes": passing,
            "advice_follows_measurements": {r["config"]: advice_follows_measurements(r) for r in ok},
            "slower_than_eager": {r["config"]: slow for r in ok if (slow := slower_than_eager(r))}}


def _commits(rows):
    counts = {}
    for row in rows:
        counts[row.get("commit", "-")] = counts.get(row.get("commit", "-"), 0) + 1
    return counts


def markdown(result):
    env, s = result["environment"], result["summary"]
    pct = (lambda v: "-" if v is None else f"{v:.0%}")
    lines = [f"# analyze --verify over the sweep ({env['device']}, torch {env['torch']}, triton {env['triton']}, "
             f"commit {env['commit']}, {env['date']})", "",
             f"{s['configs']} configurations ({', '.join(s['families'])}); failed: {', '.join(s['failed']) or 'none'}",
             "", "rows measured at commit: " + ", ".join(
                 f"{c} ({n})" for c, n in sorted(_commits(result["rows"]).items())),
             "", "| remedy kind | n | median uncal. | p90 uncal. | median calibrated (LOO) | p90 calibrated (LOO) | "
             "median measured/predicted | passes |", "|---|---|---|---|---|---|---|---|"]
    for kind, v in sorted(s["kinds"].items()):
        u, c = v["uncalibrated"], v["calibrated"]
        lines.append(f"| {kind} | {len(v['ratios'])} | {pct(u['median'])} | {pct(u['p90'])} | {pct(c['median'])} | "
                     f"{pct(c['p90'])} | {statistics.median(v['ratios']):.2f} | "
                     f"{'yes' if s['kind_passes'][kind] else 'no'} |")
    follows = s["advice_follows_measurements"]
    lines += ["", f"- advice equals the ranking of measured gains: {sum(follows.values())} of {len(follows)}"
              + ("" if all(follows.values()) else f" (not: {', '.join(k for k, v in follows.items() if not v)})"),
              "- brrr slower than eager (over 3%): " + (", ".join(
                  f"{c} ({', '.join(f'{k} {v:.2f}x' for k, v in slow.items())})"
                  for c, slow in s["slower_than_eager"].items()) or "none"),
              "", "| configuration | family | train | baseline ms | " + " | ".join(
                  f"{k} pred/meas ms" for k in sorted(s["kinds"])) + " |",
              "|---|---|---|---|" + "---|" * len(s["kinds"])]
    for row in result["rows"]:
        if "error" in row:
            lines.append(f"| {row['config']} | {row.get('family', '-')} | - | failed: {row['error'][:80]} |")
            continue
        by_kind = {r["kind"]: r for r in row["remedies"]}
        cells = []
        for k in sorted(s["kinds"]):
            r = by_kind.get(k, {})
            p, m = r.get("predicted_uncalibrated_s"), r.get("measured_s")
            cells.append(f"{p * 1e3:.2f} / {m * 1e3:.2f}" if p and m else r.get("status", "-"))
        lines.append(f"| {row['config']} | {row['family']} | {row['train']} | {row['baseline_s'] * 1e3:.2f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PRIOR = Path(__file__).resolve().parents[2] / "brrr" / "analyze" / "calibration_prior.json"


def write_prior(result, path=PRIOR, skip=()):
    """Set the shipped calibration for this sweep's device (calibration.py reads it where the user's own table
    has not measured a kind) to its measured / predicted ratios per remedy kind, but for the kinds in `skip` (a
    prediction changed since the measurement)."""
    from brrr.analyze import calibration

    prior = json.loads(path.read_text()) if path.exists() else {}
    device = calibration.device_slug(result["environment"]["device"])
    prior[device] = {kind: [round(r, 4) for r in v["ratios"]] for kind, v in result["summary"]["kinds"].items()
                     if kind not in skip}
    lines = ["{"]
    for i, (name, kinds) in enumerate(sorted(prior.items())):   # one line per kind's ratios
        rows = [f'  "{kind}": {json.dumps(ratios)}' for kind, ratios in sorted(kinds.items())]
        lines += [f' "{name}": {{', ",\n".join(rows), " }" + ("," if i < len(prior) - 1 else "")]
    path.write_text("\n".join(lines + ["}"]) + "\n")


# ------------------------------------------------------------------------------------------------ the parent

def run_one(args, config, env, cpus):
    cmd = [sys.executable, __file__, "--child", config.name, "--device", args.device] + \
          (["--quick"] if args.quick else []) + (["--remedies", args.remedies] if args.remedies else [])
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s,
                             preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        rc, stdout, stderr = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired:
        rc, stdout, stderr = "timeout", "", ""
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]), process_s=round(time.perf_counter() - start, 1))
    return {"config": config.name, "family": config.family, "error": f"rc {rc}: {stderr.strip()[-600:]}"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", help="comma-separated sweep configuration names (default: --per-family of each)")
    p.add_argument("--configs-from", help="the configurations of an earlier results JSON (to measure them again)")
    p.add_argument("--per-family", type=int, default=8)
    p.add_argument("--remedies", help="remedy kinds to apply (default: all)")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=480.0, help="no configuration starts after this many seconds")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per configuration")
    p.add_argument("--previous", help="an earlier results JSON to merge")
    p.add_argument("--prior", action="store_true", help="write the ratios into brrr's shipped calibration")
    p.add_argument("--prior-from", help="write the shipped calibration from this results JSON, and run nothing")
    p.add_argument("--prior-skip", default="", help="remedy kinds left out of the shipped calibration")
    p.add_argument("--out", help="results directory (default benchmarks/results/sweep-analyze)")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse --short HEAD)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny models (a CPU check of this script)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.device, args.quick, set(args.remedies.split(",")) if args.remedies else None)
    skip = set(filter(None, args.prior_skip.split(",")))
    if args.prior_from:
        result = json.loads(Path(args.prior_from).read_text())
        write_prior(dict(result, summary=summary(result["rows"])), skip=skip)
        return 0
    sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "zoo")]
    import catalog
    from result_files import RESULTS, result_stem, run_environment
    from run_zoo import cpu_shares, worker_env

    previous = []
    if args.previous:   # each row keeps the commit it was measured at
        earlier = json.loads(Path(args.previous).read_text())
        previous = [dict(r, commit=r.get("commit", earlier["environment"]["commit"])) for r in earlier["rows"]]
    done = {r["config"] for r in previous if "error" not in r}   # measured before: not run again unless named
    if args.configs_from:   # the configurations of an earlier results file, failed ones too: the same set again
        args.configs = ",".join(r["config"] for r in json.loads(Path(args.configs_from).read_text())["rows"])
    configs = pick(catalog.all_configs(), args.per_family, args.configs.split(",") if args.configs else None)
    if not args.configs:
        configs = [c for c in configs if c.name not in done]
    gpus = max(1, min(args.gpus, len(configs)))
    shares = [configs[i::gpus] for i in range(gpus)]
    cpus = cpu_shares(gpus) if args.device == "cuda" else [None] * gpus
    environment = run_environment(args.device, gpus, args.commit)
    device = environment["device"]
    out = Path(args.out or RESULTS / "sweep-analyze")
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(out, device, commit=environment["commit"])
    stem = stem.with_name(stem.name + "-analyze-sweep")
    rows, lock, started = [], threading.Lock(), time.perf_counter()

    def save():
        with lock:
            fresh = {r["config"] for r in rows}
            merged = [r for r in previous if r["config"] not in fresh] + list(rows)
            result = {"environment": environment, "rows": merged, "summary": summary(merged)}
            stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
            stem.with_suffix(".md").write_text(markdown(result))
        return result

    def run_share(index, share):
        env = worker_env(index, cpus[index]) if args.device == "cuda" else dict(os.environ)
        for config in share:
            if time.perf_counter() - started > args.budget_s:
                print(f"[gpu {index}] {config.name}: not started, budget spent", flush=True)
                continue
            row = dict(run_one(args, config, env, cpus[index]), commit=environment["commit"])
            with lock:
                rows.append(row)
            print(f"[gpu {index}] {config.name}: " + (row["error"][-300:] if "error" in row else
                  f"{row['process_s']} s, baseline {row['baseline_s'] * 1e3:.2f} ms"), flush=True)
            save()

    threads = [threading.Thread(target=run_share, args=(i, share)) for i, share in enumerate(shares)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = save()
    if args.prior:
        write_prior(result, skip=skip)
    print(markdown(result))
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
