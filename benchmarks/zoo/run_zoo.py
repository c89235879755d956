"""The zoo: brrr judged on 20+ real models against eager and Inductor, one command.

    PYTHONPATH=$PWD python3 benchmarks/zoo/run_zoo.py --out $OUT                  # on the GPU machine
    PYTHONPATH=$PWD python3 benchmarks/zoo/run_zoo.py --part 1/3 --out $OUT       # a third of it per call
    PYTHONPATH=$PWD python3 benchmarks/zoo/run_zoo.py --only resnet50-infer,vision --backends eager,brrr
    PYTHONPATH=$PWD python3 benchmarks/zoo/run_zoo.py --quick --out /tmp/zoo       # CPU smoke run, tiny models

Each configuration (benchmarks/zoo/models.py) goes through `brrr.bench` (changing shapes: `bench_shapes`):
eager, brrr, brrr with CUDA graphs, then Inductor last (its compile workers slow the host), in this one
process on the same inputs and weights, bf16, with correctness judged against an fp32 copy of the model.
Compile caches point at fresh directories, so the first compile is cold; after the configurations, a new
process compiles each again with those caches warm (`--warm-compile`). The JSON and Markdown are rewritten
after every configuration, so a cut-off run keeps what it measured; `report.py` merges parts and renders.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]   # models, report; result_files

DEFAULT_BACKENDS = "eager,brrr,brrr-cudagraphs,inductor"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="directory for the JSON and Markdown (default results/zoo)")
    p.add_argument("--only", help="comma-separated configuration names or families")
    p.add_argument("--part", help="K/N: run the K-th of N parts of equal estimated cost")
    p.add_argument("--backends", default=None, help=f"comma-separated (default {DEFAULT_BACKENDS})")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny models, eager,aot_eager,brrr")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="no configuration starts after this many seconds (a started one finishes); the warm "
                        "compiles get what is left, at least --warm-reserve-s")
    p.add_argument("--warm-reserve-s", type=float, default=45.0,
                   help="seconds of the budget kept for the warm-compile process")
    p.add_argument("--warm-compile", default="brrr,inductor",
                   help="backends whose warm compile a new process measures ('none' to skip)")
    p.add_argument("--rep-ms", type=float, default=None, help="do_bench's timed milliseconds per backend")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse --short HEAD)")
    p.add_argument("--keep-caches", action="store_true", help="keep the existing compile caches")
    p.add_argument("--first-call-only", action="store_true", help=argparse.SUPPRESS)   # the warm-compile process
    return p.parse_args(argv)


def fresh_caches():
    """Compile caches of Inductor, Triton and brrr in a new directory (set before torch is imported)."""
    root = tempfile.mkdtemp(prefix="brrr-zoo-cache-")
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                     ("BRRR_CACHE_DIR", "brrr")):
        os.environ[var] = os.path.join(root, sub)
    return root


def run_config(config, backends, device, dtype, quick, rep_ms):
    """One configuration's entry: its bench result as a dict, or the error that stopped it."""
    import torch

    from brrr.bench import bench, bench_shapes
    from brrr.bench.backends import stop_inductor_workers
    from brrr.compile import replay_choice

    entry = {"name": config.name, "family": config.family, "train": config.train}
    start = time.perf_counter()
    decided = len(replay_choice.DECISIONS)
    try:
        work = config.build(device, dtype, quick)
        warmup, rep = (2, 5) if quick else (25, rep_ms or 300)
        if work.shapes:
            result = bench_shapes(work.model, work.shapes, backends=backends, train=work.train, warmup=warmup,
                                  rep=rep, reference_dtype=torch.float32, label=config.name)
            entry["kind"] = "shapes"
        else:
            result = bench(work.model, *work.inputs, backends=backends, train=work.train, warmup=warmup, rep=rep,
                           compile_warm=False, reference_dtype=torch.float32, reference=work.reference,
                           label=config.name)
            entry["kind"] = "static"
        entry.update(status="ok", result=result.to_dict())
    except Exception as e:
        from models import Unavailable

        entry.update(status="unavailable" if isinstance(e, Unavailable) else "error",
                     error=f"{type(e).__name__}: {e}"[:500], traceback=traceback.format_exc()[-3000:])
    entry["elapsed_s"] = time.perf_counter() - start
    # what brrr's cuda_graphs="auto" chose for each graph of this configuration, with the timings behind it
    entry["replay_decisions"] = [str(d) for d in replay_choice.DECISIONS[decided:]]
    work = None
    stop_inductor_workers()   # idle compile workers would share the host with the next configuration's timing
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return entry


def first_calls(configs, backends, device, dtype, quick, budget_s, path):
    """{config: {backend: seconds}}: the first call of each compiled configuration (compile included), for
    the configurations that start within `budget_s`; rewritten to `path` after each one."""
    started = time.perf_counter()
    from brrr.bench.backends import fresh_compile
    from brrr.bench.step import Step, make_cotangents
    from brrr.cost.device import time_once

    out = {}
    for config in configs:
        if time.perf_counter() - started > budget_s:
            break
        out[config.name] = times = {}
        try:
            work = config.build(device, dtype, quick)
            inputs = work.shapes[0][1] if work.shapes else work.inputs
            cotangents = make_cotangents(work.model(*inputs)) if work.train else None
            for backend in backends:
                step = Step(fresh_compile(work.model, backend), work.model, [inputs], work.train, cotangents)
                times[backend] = time_once(step, device)
        except Exception as e:
            times["error"] = f"{type(e).__name__}: {e}"[:300]
        Path(path).write_text(json.dumps(out))
        work = None
        gc.collect()
    return out


def warm_compiles(args, configs, backends, budget_s):
    """Run this script again in a new process (caches now warm) for the first call of each configuration,
    as many as `budget_s` allows."""
    if not backends or not configs or budget_s <= 0:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, __file__, "--first-call-only", "--only", ",".join(c.name for c in configs),
           "--backends", ",".join(backends), "--out", path, "--keep-caches", "--budget-s", str(budget_s)] + \
        (["--quick"] if args.quick else [])
    try:   # the new process's start, imports and the last configuration run past its budget
        subprocess.run(cmd, check=True, timeout=budget_s + 180, env=os.environ.copy())
    except (subprocess.SubprocessError, OSError) as e:
        print(f"[zoo] warm-compile process: {type(e).__name__}: {e}"[:300], flush=True)
    try:   # what it finished, even if it was stopped
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def main(argv=None):
    args = parse_args(argv)
    if not args.keep_caches:
        fresh_caches()
    import torch

    import models
    import report
    from result_files import RESULTS, git_commit, result_stem, utc_date

    quick = args.quick
    device = "cpu" if quick else "cuda"
    dtype = torch.bfloat16
    backends = (args.backends or ("eager,aot_eager,brrr" if quick else DEFAULT_BACKENDS)).split(",")
    configs = models.select(args.only)
    if args.part:
        k, n = (int(x) for x in args.part.split("/"))
        configs = models.parts(configs, n)[k - 1]
    if quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")

    if args.first_call_only:
        first_calls(configs, backends, device, dtype, quick, args.budget_s, args.out)
        return 0

    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out_dir = Path(args.out) if args.out else RESULTS / "zoo"
    stem = result_stem(out_dir, device_name, commit=args.commit or git_commit())
    results = {"environment": {"device": device_name, "date": utc_date(), "commit": args.commit or git_commit(),
                               "torch": torch.__version__, "triton": _triton_version(), "dtype": "bfloat16",
                               "backends": backends, "mode": "quick" if quick else "full",
                               "part": args.part},
               "configs": {}}
    started = time.perf_counter()
    warm = [b for b in args.warm_compile.split(",") if b and b != "none" and b in backends]
    reserve = args.warm_reserve_s if warm else 0.0
    for config in configs:
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s - reserve or (elapsed > 0 and not quick and
                                                 elapsed + config.cost > args.budget_s - reserve):
            results["configs"][config.name] = {"name": config.name, "family": config.family, "train": config.train,
                                               "status": "skipped",
                                               "error": f"time budget of {args.budget_s:.0f} s: "
                                                        f"{elapsed:.0f} s spent, ~{config.cost:.0f} s needed"}
        else:
            print(f"[zoo] {config.name} ...", flush=True)
            results["configs"][config.name] = entry = run_config(config, backends, device, dtype, quick,
                                                                 args.rep_ms)
            print(f"[zoo] {config.name}: {entry['status']} in {entry['elapsed_s']:.0f} s "
                  f"{report.one_line(entry)}", flush=True)
            for decision in entry["replay_decisions"]:
                print(f"[zoo]   brrr {decision}", flush=True)
        report.write(results, stem)
    ran = [c for c in configs if results["configs"][c.name]["status"] == "ok"]
    if warm and ran:
        left = max(reserve, args.budget_s - (time.perf_counter() - started))
        print(f"[zoo] warm compiles in a new process: {', '.join(warm)}, {left:.0f} s", flush=True)
        results["warm_compile"] = warm_compiles(args, ran, warm, left)
        report.write(results, stem)
    print(report.markdown(results), flush=True)
    print(f"[zoo] wrote {stem}.json and .md", flush=True)
    return 0


def _triton_version():
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
