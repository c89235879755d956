"""What the acceptance scripts that measure an issue's patterns as sweep configurations share (floor_patterns.py,
layout_patterns.py): their arguments, the environment they record, the earlier call's file a call adds to, and the
loop that measures each configuration within the time budget and rewrites the JSON and Markdown after each.

Each configuration runs through the sweep's `run_config` (sweep/run_sweep.py, sweep/measure.py): eager, brrr,
Inductor and Inductor reduce-overhead in this process, each compiled afresh after a Dynamo reset, on the same
weights and inputs. Its entry keeps the sweep's shape, with the issue's pattern number (`pattern`), the commit
measured and the verdict (pattern_report.py).

Writes `<out>/<date>-<gpu>-<commit>-<what>.json` and `.md`; a later call on the same day, GPU and commit adds its
configurations to that file (`--resume`: and skips those it already holds), so `--only` can split a run over
several calls. A configuration does not start once `--budget-s` is spent (recorded as skipped, unless an earlier
call measured it). `--peers FILE` takes Inductor's rows from a sweep peer cache where it holds the configuration
(read only: what this run measures is not written back).
"""

import argparse
import functools
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "sweep"), str(HERE.parent / "zoo"), str(HERE.parent)]

import pattern_report as report  # noqa: E402
from result_files import RESULTS, git_commit, result_stem, utc_date  # noqa: E402

DONE = ("ok", "unavailable")   # what `--resume` does not measure again


@dataclass(frozen=True)
class Bench:
    what: str               # the result file's last word: <date>-<gpu>-<commit>-<what>.json
    tag: str                # what the printed lines start with: [tag]
    select: object          # args -> [(pattern, Config)]; called once the environment is set
    markdown: object        # results -> the Markdown report
    logs: object = dict     # () -> {key: list}: brrr's logs beyond the sweep's, recorded as the sweep records its


def parser(doc, results_dir, only_help):
    """The arguments every pattern script takes; a script adds its own to what this returns."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", str(RESULTS / results_dir)))
    p.add_argument("--only", help=only_help)
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny shapes, eager and brrr")
    p.add_argument("--backends", help="comma-separated (default eager,brrr,inductor,inductor-reduce-overhead; "
                                      "--quick: eager,brrr)")
    p.add_argument("--budget-s", type=float, default=540.0, help="no configuration starts after this many seconds")
    p.add_argument("--rep-ms", type=float, default=200.0, help="do_bench's timed milliseconds per backend")
    p.add_argument("--commit", help="the commit measured (default: BRRR_COMMIT, else git rev-parse --short HEAD)")
    p.add_argument("--keep-caches", action="store_true", help="keep the existing compile caches")
    p.add_argument("--resume", action="store_true", help="skip the configurations the day's file already holds "
                                                         "measured (ok or unavailable)")
    p.add_argument("--peers", help="a sweep peer cache to take Inductor's rows from (read only), e.g. "
                                   "benchmarks/results/sweep/peers.json")
    return p


def named(every, only=None):
    """The (pattern, Config) pairs of `every` named in the comma-separated `only` (configuration names or pattern
    numbers); all of them by default."""
    if not only:
        return list(every)
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    known = {c.name for _, c in every} | {str(n) for n, _ in every}
    if wanted - known:
        raise ValueError(f"unknown pattern(s) {sorted(wanted - known)}; known: {sorted(known)}")
    return [(n, c) for n, c in every if c.name in wanted or str(n) in wanted]


def sweep_config(name):
    """The sweep's configuration of that name, as the catalog builds it."""
    import catalog

    [config] = catalog.select(catalog.all_configs(), only=name)
    return config


def _version(package):
    try:
        return __import__(package).__version__
    except ImportError:
        return None


def environment(device_name, commit, date, backends, quick):
    import torch

    return {"device": device_name, "date": date, "commit": commit, "torch": torch.__version__,
            "triton": _version("triton"), "transformers": _version("transformers"), "cuda": torch.version.cuda,
            "python": sys.version.split()[0], "backends": list(backends), "mode": "quick" if quick else "full",
            "dynamo": "defaults", "calls": []}


def previous(path):
    """What an earlier call wrote to `path`: its configurations and its calls, or empty ones."""
    try:
        earlier = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}, []
    return earlier.get("configs", {}), earlier.get("environment", {}).get("calls", [])


def _skipped(config, elapsed):
    return {"name": config.name, "family": config.family, "train": config.train, "precision": config.precision,
            "status": "skipped", "error": f"time budget: {elapsed:.0f} s spent"}


def run(args, bench):
    """Every configuration `bench` selects, each written as soon as measured; 0, or 2 without a GPU."""
    from run_zoo import fresh_caches

    if not args.keep_caches:
        fresh_caches()
    import torch

    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # brrr's kernels in Triton's interpreter on the CPU
    elif not torch.cuda.is_available():
        print("no CUDA GPU here: use --quick for a CPU smoke run")
        return 2
    import measure
    import run_sweep
    from peers import PeerCache

    device = "cpu" if args.quick else "cuda"
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    commit, date = args.commit or git_commit(), utc_date()
    backends = run_sweep.backends_of(args)
    chosen = bench.select(args)
    stem = result_stem(args.out, device_name, commit=commit, date=date)
    path = stem.with_name(f"{stem.name}-{bench.what}.json")
    configs, calls = previous(path)
    results = {"environment": environment(device_name, commit, date, backends, args.quick), "configs": configs}
    results["environment"]["calls"] = calls + [{"only": args.only, "started": time.strftime("%Y-%m-%d %H:%M:%S")}]
    measure_fn = functools.partial(measure.measure, smoke=args.quick)
    versions = run_sweep.Versions(device_name, torch.__version__, _version("triton"), commit, date)
    cache = PeerCache(args.peers) if args.peers else None
    started = time.perf_counter()
    for number, config in chosen:
        if args.resume and configs.get(config.name, {}).get("status") in DONE:
            continue
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s or (elapsed > 0 and not args.quick and elapsed + config.cost > args.budget_s):
            if config.name in configs:   # an earlier call's measurement stands
                continue
            entry = _skipped(config, elapsed)
        else:
            print(f"[{bench.tag}] pattern {number}: {config.name} ...", flush=True)
            logs = bench.logs()
            marks = {k: len(v) for k, v in logs.items()}
            entry = run_sweep.run_config(config, backends, device, cache, versions, args.quick, args.rep_ms,
                                         profile=True, measure_fn=measure_fn)
            entry.update({k: [str(item) for item in items[marks[k]:]] for k, items in logs.items()})
        entry.update(pattern=number, commit=commit, verdict=report.verdict(entry))
        results["configs"][config.name] = entry
        print(f"[{bench.tag}] {config.name} in {entry.get('elapsed_s', 0):.0f} s: {report.line(entry)}", flush=True)
        report.write(results, path, bench.markdown)
    report.write(results, path, bench.markdown)   # a call that measured nothing is on record too
    print(bench.markdown(results), flush=True)
    print(f"[{bench.tag}] wrote {path} and .md", flush=True)
    return 0
