"""GPU acceptance for the "floor" issue: its five patterns as micro-benchmarks, each with brrr at or below eager
and at or below Inductor's better mode (the faster of default and reduce-overhead), 3% slack.

    PYTHONPATH=$PWD python3 benchmarks/acceptance/floor_patterns.py --out $OUT                 # on the GPU machine
    PYTHONPATH=$PWD python3 benchmarks/acceptance/floor_patterns.py --only 5 --out $OUT        # one pattern
    PYTHONPATH=$PWD python3 benchmarks/acceptance/floor_patterns.py --quick --out /tmp/floor   # CPU smoke run

The patterns and their shapes: floor_models.py. Each configuration runs as a sweep configuration
(sweep/run_sweep.py's `run_config`, sweep/measure.py): eager, brrr, Inductor and Inductor reduce-overhead in
this process, each compiled afresh after a Dynamo reset, on the same weights and inputs; the `do_bench` median
and back-to-back time of a call, peak memory, the error against eager and against a higher-precision copy, the
top kernels of each compiled backend (torch.profiler), and what brrr logged (fallbacks, graph breaks, replay
choices). The verdicts: floor_report.py. `--quick`: tiny shapes, eager and brrr on the CPU (Triton's
interpreter).

Writes `<out>/<date>-<gpu>-<commit>-floor-patterns.json` and `.md` (default <out>:
benchmarks/results/acceptance-floor/), rewritten after each configuration; a later call on the same day,
GPU and commit adds its configurations to that file, so `--only` can split a run over several calls. A
configuration does not start once `--budget-s` is spent (recorded as skipped). Keep the printed output as the
`.log` of the same name.

On an H100 (torch 2.11, triton 3.6, at 1aca9d1) the whole run takes about 6 minutes: 30-45 s for each
configuration of patterns 1-4, about 90 s for each of pattern 5's two; no backend's peak passed 4 GiB.
"""

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "sweep"), str(HERE.parent / "zoo"), str(HERE.parent)]

from result_files import RESULTS, git_commit, result_stem, utc_date  # noqa: E402

WHAT = "floor-patterns"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", str(RESULTS / "acceptance-floor")))
    p.add_argument("--only", help="comma-separated configuration names or pattern numbers (1-5)")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny shapes, eager and brrr")
    p.add_argument("--backends", help="comma-separated (default eager,brrr,inductor,inductor-reduce-overhead; "
                                      "--quick: eager,brrr)")
    p.add_argument("--budget-s", type=float, default=540.0, help="no configuration starts after this many seconds")
    p.add_argument("--rep-ms", type=float, default=200.0, help="do_bench's timed milliseconds per backend")
    p.add_argument("--commit", help="the commit measured (default: BRRR_COMMIT, else git rev-parse --short HEAD)")
    p.add_argument("--keep-caches", action="store_true", help="keep the existing compile caches")
    return p.parse_args(argv)


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


def _previous(path):
    """What an earlier call wrote to `path`: its configurations and its calls, or empty ones."""
    try:
        earlier = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}, []
    return earlier.get("configs", {}), earlier.get("environment", {}).get("calls", [])


def main(argv=None):
    args = parse_args(argv)
    from run_zoo import fresh_caches

    if not args.keep_caches:
        fresh_caches()
    import torch

    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # brrr's kernels in Triton's interpreter on the CPU
    elif not torch.cuda.is_available():
        print("no CUDA GPU here: use --quick for a CPU smoke run")
        return 2
    import floor_models
    import floor_report as report
    import measure
    import run_sweep

    device = "cpu" if args.quick else "cuda"
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    commit, date = args.commit or git_commit(), utc_date()
    backends = run_sweep.backends_of(args)
    chosen = floor_models.select(args.only)
    stem = result_stem(args.out, device_name, commit=commit, date=date)
    path = stem.with_name(f"{stem.name}-{WHAT}.json")
    configs, calls = _previous(path)
    results = {"environment": environment(device_name, commit, date, backends, args.quick), "configs": configs}
    results["environment"]["calls"] = calls + [{"only": args.only, "started": time.strftime("%Y-%m-%d %H:%M:%S")}]
    measure_fn = functools.partial(measure.measure, smoke=args.quick)
    versions = run_sweep.Versions(device_name, torch.__version__, _version("triton"), commit, date)
    started = time.perf_counter()
    for number, config in chosen:
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s or (elapsed > 0 and not args.quick and elapsed + config.cost > args.budget_s):
            if config.name in configs:   # an earlier call's measurement stands
                continue
            entry = {"name": config.name, "train": config.train, "precision": config.precision, "status": "skipped",
                     "error": f"time budget: {elapsed:.0f} s spent"}
        else:
            print(f"[floor] pattern {number}: {config.name} ...", flush=True)
            entry = run_sweep.run_config(config, backends, device, None, versions, args.quick, args.rep_ms,
                                         profile=True, measure_fn=measure_fn)
        entry.update(pattern=number, commit=commit, verdict=report.verdict(entry))
        results["configs"][config.name] = entry
        print(f"[floor] {config.name} in {entry.get('elapsed_s', 0):.0f} s: {report.line(entry)}", flush=True)
        report.write(results, path)
    print(report.markdown(results), flush=True)
    print(f"[floor] wrote {path} and .md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
