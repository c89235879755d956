"""The zoo: brrr judged on 20+ real models against eager and Inductor, one command.

    PYTHONPATH=$PWD python3 benchmarks/zoo/run_zoo.py --out $OUT                  # on the GPU machine
    PYTHONPATH=$PWD python3 benchmarks/zoo/run_zoo.py --part 1/3 --out $OUT       # a third of it per call
    PYTHONPATH=$PWD python3 benchmarks/zoo/run_zoo.py --part 1/3 --gpus 2 --out $OUT   # that third on 2 GPUs
    PYTHONPATH=$PWD python3 benchmarks/zoo/run_zoo.py --only resnet50-infer,vision --backends eager,brrr
    PYTHONPATH=$PWD python3 benchmarks/zoo/run_zoo.py --quick --out /tmp/zoo       # CPU smoke run, tiny models

Each configuration (benchmarks/zoo/models.py) goes through `brrr.bench` (changing shapes: `bench_shapes`):
eager, brrr, brrr with CUDA graphs, then Inductor last (its compile workers slow the host), in this one
process on the same inputs and weights, bf16, with correctness judged against an fp32 copy of the model.
Dynamo skips logging calls in model code for every backend (`--keep-logging-breaks` leaves them breaking the
graph): a logging call is a graph break that no backend's user keeps once `brrr explain` or Dynamo's hint names
it. Each configuration records the graph breaks brrr's backend was told of.
Compile caches point at fresh directories, so the first compile is cold; after the configurations, a new
process compiles each again with those caches warm (`--warm-compile`). The JSON and Markdown are rewritten
after every configuration, so a cut-off run keeps what it measured; `report.py` merges parts and renders.

With `--gpus N` this process only plans and merges: N worker processes (this script again, `--worker I/N`)
run at once, worker I on GPU I alone (`CUDA_VISIBLE_DEVICES`), each with fresh caches of its own, its share of
the host's CPUs, and whole configurations whose estimated costs add up to about the same. Each writes its
own `...-gpu<I>` files as above; the merged file, rewritten while they run, is named as a one-GPU run's.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]   # models, report; result_files

DEFAULT_BACKENDS = "eager,brrr,brrr-cudagraphs,inductor"
MERGE_EVERY_S = 15.0   # the parent's merged file trails its workers' files by at most this


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
    p.add_argument("--keep-logging-breaks", action="store_true",
                   help="leave Dynamo's graph breaks at logging calls in model code (by default Dynamo skips "
                        "those calls, for every backend)")
    p.add_argument("--gpus", default="1",
                   help="N or 'all': run on N GPUs of this host at once, one worker process per GPU taking "
                        "whole configurations of about equal total cost; the workers' files are merged")
    p.add_argument("--worker", help=argparse.SUPPRESS)   # I/N: this process is worker I of N, on one GPU
    p.add_argument("--cpus", help=argparse.SUPPRESS)     # a worker's CPUs, comma-separated
    p.add_argument("--date", help=argparse.SUPPRESS)     # a worker's file date: its parent's
    p.add_argument("--first-call-only", action="store_true", help=argparse.SUPPRESS)   # the warm-compile process
    return p.parse_args(argv)


def fresh_caches():
    """Compile caches of Inductor, Triton and brrr in a new directory (set before torch is imported)."""
    root = tempfile.mkdtemp(prefix="brrr-zoo-cache-")
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                     ("BRRR_CACHE_DIR", "brrr")):
        os.environ[var] = os.path.join(root, sub)
    return root


def run_config(config, backends, device, dtype, quick, rep_ms, skip_logging=True):
    """One configuration's entry: its bench result as a dict, or the error that stopped it."""
    import torch

    from brrr.bench import bench, bench_shapes
    from brrr.bench.backends import skip_logging_in_graphs, stop_inductor_workers
    from brrr.compile import fallbacks
    from brrr.compile.passes import graph_breaks, linear_cross_entropy as linear_cross_entropy_pass
    from brrr.compile.runtime import replay_choice

    entry = {"name": config.name, "family": config.family, "train": config.train}
    start = time.perf_counter()
    decided, fell, rewritten = (len(replay_choice.DECISIONS), len(fallbacks.LOG),
                                len(linear_cross_entropy_pass.REWRITES))
    graph_breaks.resync()   # breaks the last configuration's Inductor run was told of are not this one's
    broke = len(graph_breaks.LOG)
    try:
        work = config.build(device, dtype, quick)
        warmup, rep = (2, 5) if quick else (25, rep_ms or 300)
        # entered after the build: the model's package may add logging methods (`warning_once`)
        with skip_logging_in_graphs(skip_logging):
            if work.shapes:
                result = bench_shapes(work.model, work.shapes, backends=backends, train=work.train, warmup=warmup,
                                      rep=rep, reference_dtype=torch.float32, label=config.name)
                entry["kind"] = "shapes"
            else:
                result = bench(work.model, *work.inputs, backends=backends, train=work.train, warmup=warmup,
                               rep=rep, compile_warm=False, reference_dtype=torch.float32,
                               reference=work.reference, label=config.name)
                entry["kind"] = "static"
        entry.update(status="ok", result=result.to_dict())
    except Exception as e:
        from models import Unavailable

        entry.update(status="unavailable" if isinstance(e, Unavailable) else "error",
                     error=f"{type(e).__name__}: {e}"[:500], traceback=traceback.format_exc()[-3000:])
    entry["elapsed_s"] = time.perf_counter() - start
    # what brrr's cuda_graphs="auto" chose for each graph of this configuration, with the timings behind it
    entry["replay_decisions"] = [str(d) for d in replay_choice.DECISIONS[decided:]]
    # what brrr ran as ATen (op, kernel or graph scope), and the losses it computed without their logits
    entry["brrr_fallbacks"] = [f"{f.scope} {f.graph} {f.what}: {f.reason}" for f in fallbacks.LOG[fell:]]
    entry["loss_rewrites"] = [str(r) for r in linear_cross_entropy_pass.REWRITES[rewritten:]]
    entry["graph_breaks"] = [str(b) for b in graph_breaks.LOG[broke:]]
    work = None
    stop_inductor_workers()   # idle compile workers would share the host with the next configuration's timing
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return entry


def first_calls(configs, backends, device, dtype, quick, budget_s, path, skip_logging=True):
    """{config: {backend: seconds}}: the first call of each compiled configuration (compile included), for
    the configurations that start within `budget_s`; rewritten to `path` after each one."""
    started = time.perf_counter()
    from brrr.bench.backends import fresh_compile, skip_logging_in_graphs
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
            with skip_logging_in_graphs(skip_logging):
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
        (["--quick"] if args.quick else []) + (["--keep-logging-breaks"] if args.keep_logging_breaks else [])
    try:   # the new process's start, imports and the last configuration run past its budget
        subprocess.run(cmd, check=True, timeout=budget_s + 180, env=os.environ.copy())
    except (subprocess.SubprocessError, OSError) as e:
        print(f"[zoo] warm-compile process: {type(e).__name__}: {e}"[:300], flush=True)
    try:   # what it finished, even if it was stopped
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def selected(args):
    """The configurations this run covers: `--only`, then the `--part`."""
    import models

    configs = models.select(args.only)
    if args.part:
        k, n = (int(x) for x in args.part.split("/"))
        configs = models.parts(configs, n)[k - 1]
    return configs


def gpu_count(spec, quick):
    """How many GPUs `--gpus` asks for; on the CPU (--quick) the count only labels the workers."""
    import torch

    visible = torch.cuda.device_count()
    count = max(1, visible) if spec == "all" else int(spec) if spec.isdigit() else 0
    if count < 1 or (not quick and count > visible):
        raise SystemExit(f"--gpus {spec}: {visible} GPU(s) visible")
    return count


def host_cpus():
    """The CPUs this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))


def cpu_shares(count):
    """This process's CPUs in `count` disjoint runs of equal size (all of them for each, if too few)."""
    cpus = host_cpus()
    size = len(cpus) // count
    return [cpus[i * size:(i + 1) * size] for i in range(count)] if size else [cpus] * count


def worker_env(index, cpus):
    """A worker's environment: GPU `index` of those this process sees, compile and intra-op threads no more
    than its CPUs (a user's explicit setting wins), and this checkout first on the import path."""
    env = os.environ.copy()
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    env["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)
    for var in ("TORCHINDUCTOR_COMPILE_THREADS", "OMP_NUM_THREADS"):
        env.setdefault(var, str(len(cpus)))
    root = str(HERE.parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def worker_command(args, index, count, configs, cpus, commit, date):
    """This script as worker `index` of `count`: the same options, its own configurations."""
    cmd = [sys.executable, __file__, "--worker", f"{index}/{count}", "--cpus", ",".join(map(str, cpus)),
           "--date", date, "--commit", commit, "--only", ",".join(c.name for c in configs),
           "--budget-s", str(args.budget_s), "--warm-reserve-s", str(args.warm_reserve_s),
           "--warm-compile", args.warm_compile]
    if args.out:
        cmd += ["--out", args.out]
    if args.backends:
        cmd += ["--backends", args.backends]
    if args.rep_ms is not None:
        cmd += ["--rep-ms", str(args.rep_ms)]
    return cmd + [flag for flag, on in (("--quick", args.quick), ("--keep-caches", args.keep_caches),
                                        ("--keep-logging-breaks", args.keep_logging_breaks)) if on]


def _relay(proc, label):
    """A worker's output, each line prefixed with its GPU."""
    for line in proc.stdout:
        print(f"[gpu {label}] {line}", end="", flush=True)


def worker_files(out_dir, date, commit, count, since):
    """The JSON files the workers have written since `since` (a worker writes its first after one
    configuration; older files of the same date and commit are an earlier run's)."""
    found = []
    for i in range(count):
        matches = [p for p in Path(out_dir).glob(f"{date}-*-{commit}-gpu{i}.json") if p.stat().st_mtime >= since]
        found += sorted(matches, key=lambda p: p.stat().st_mtime)[-1:]
    return found


def merge_workers(paths, part, count, stem_of):
    """The workers' files as one result, written to `stem_of(device name)`: (results, stem), or None before
    any worker has written."""
    import report

    if not paths:
        return None
    results = report.merge(paths)
    results["environment"].update(part=part, concurrent_gpus=count, host_cpus=len(host_cpus()))
    results["environment"].pop("hosts", None)   # one host: the workers' devices are in `workers`
    for worker in results["environment"]["workers"]:
        worker["part"] = part
    stem = stem_of(results["environment"]["device"])
    report.write(results, stem)
    return results, stem


def start_workers(args, shares, commit, date):
    """One worker process per share of configurations, worker I on GPU I; their output relayed here."""
    cpus = cpu_shares(len(shares))
    procs, relays = [], []
    for i, configs in enumerate(shares):
        print(f"[zoo] gpu {i}: ~{sum(c.cost for c in configs):.0f} s estimated, CPUs {_ranges(cpus[i])}: "
              f"{', '.join(c.name for c in configs)}", flush=True)
        procs.append(subprocess.Popen(worker_command(args, i, len(shares), configs, cpus[i], commit, date),
                                      env=worker_env(i, cpus[i]), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, bufsize=1))
        relays.append(threading.Thread(target=_relay, args=(procs[-1], i), daemon=True))
        relays[-1].start()
    return procs, relays


def run_workers(args, count):
    """Run the selected configurations on `count` GPUs at once, one worker each, merging as they go."""
    import models
    import report
    from result_files import RESULTS, git_commit, result_stem, utc_date

    commit, date, since = args.commit or git_commit(), utc_date(), time.time()
    out_dir = Path(args.out) if args.out else RESULTS / "zoo"
    shares = [part for part in models.parts(selected(args), count) if part]

    def merge():
        paths = worker_files(out_dir, date, commit, len(shares), since)
        return merge_workers(paths, args.part, len(shares),
                             lambda device: result_stem(out_dir, device, commit=commit, date=date))

    procs, relays = start_workers(args, shares, commit, date)
    while running := [p for p in procs if p.poll() is None]:   # a call cut off mid-run still leaves a merged file
        try:
            running[0].wait(timeout=MERGE_EVERY_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            merge()
        except (OSError, ValueError, KeyError) as e:
            print(f"[zoo] merge while running: {type(e).__name__}: {e}"[:300], flush=True)
    for relay in relays:   # their last lines before the merged table
        relay.join(timeout=10)
    done, failed = merge(), [i for i, p in enumerate(procs) if p.returncode != 0]
    if done is None:
        print("[zoo] no worker wrote a result", flush=True)
        return 1
    results, stem = done
    print(report.markdown(results), flush=True)
    print(f"[zoo] wrote {stem}.json and .md, merged from {len(shares)} GPUs"
          + (f"; workers {failed} exited with an error" if failed else ""), flush=True)
    return 1 if failed else 0


def pin_cpus(cpus):
    """Keep this worker, its threads and its children (compile workers, the warm-compile process) on `cpus`."""
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
        except (OSError, ValueError) as e:
            print(f"[zoo] CPUs {cpus} not pinned: {e}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    pin_cpus(args.cpus)
    if not args.keep_caches:
        fresh_caches()
    if not args.first_call_only and not args.worker:
        count = gpu_count(args.gpus, args.quick)
        if count > 1:
            return run_workers(args, count)
    import torch

    import report
    from result_files import RESULTS, git_commit, result_stem, utc_date

    quick = args.quick
    device = "cpu" if quick else "cuda"
    dtype = torch.bfloat16
    backends = (args.backends or ("eager,aot_eager,brrr" if quick else DEFAULT_BACKENDS)).split(",")
    configs = selected(args)
    if quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")

    if args.first_call_only:
        first_calls(configs, backends, device, dtype, quick, args.budget_s, args.out,
                    skip_logging=not args.keep_logging_breaks)
        return 0

    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out_dir = Path(args.out) if args.out else RESULTS / "zoo"
    date = args.date or utc_date()
    stem = result_stem(out_dir, device_name, commit=args.commit or git_commit(), date=date)
    results = {"environment": {"device": device_name, "date": date, "commit": args.commit or git_commit(),
                               "torch": torch.__version__, "triton": _triton_version(), "dtype": "bfloat16",
                               "backends": backends, "mode": "quick" if quick else "full",
                               "part": args.part, "dynamo_skips_logging": not args.keep_logging_breaks},
               "configs": {}}
    tag = {}
    if args.worker:
        index, count = (int(x) for x in args.worker.split("/"))
        stem = stem.with_name(f"{stem.name}-gpu{index}")
        tag = {"gpu_index": index, "concurrent_gpus": count}
        results["environment"]["worker"] = describe_worker(index, len(configs), sum(c.cost for c in configs))
    started = time.perf_counter()
    warm = [b for b in args.warm_compile.split(",") if b and b != "none" and b in backends]
    reserve = args.warm_reserve_s if warm else 0.0
    from models import estimated_cost

    for config in configs:
        elapsed = time.perf_counter() - started
        cost = estimated_cost(config, backends)
        if elapsed > args.budget_s - reserve or (elapsed > 0 and not quick and
                                                 elapsed + cost > args.budget_s - reserve):
            results["configs"][config.name] = {"name": config.name, "family": config.family, "train": config.train,
                                               "status": "skipped", **tag,
                                               "error": f"time budget of {args.budget_s:.0f} s: "
                                                        f"{elapsed:.0f} s spent, ~{cost:.0f} s needed"}
        else:
            print(f"[zoo] {config.name} ...", flush=True)
            results["configs"][config.name] = entry = run_config(config, backends, device, dtype, quick,
                                                                 args.rep_ms, not args.keep_logging_breaks)
            entry.update(tag)
            print(f"[zoo] {config.name}: {entry['status']} in {entry['elapsed_s']:.0f} s "
                  f"{report.one_line(entry)}", flush=True)
            for decision in entry["replay_decisions"]:
                print(f"[zoo]   brrr {decision}", flush=True)
            for line in entry["brrr_fallbacks"] + entry["loss_rewrites"] + entry["graph_breaks"]:
                print(f"[zoo]   brrr {line}", flush=True)
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


def describe_worker(index, configs, cost):
    """What the JSON says of a worker: its GPU, its CPUs and threads, and its share of the zoo."""
    import torch

    return {"gpu_index": index, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cpus": _ranges(host_cpus()), "torch_threads": torch.get_num_threads(),
            "inductor_compile_threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS"),
            "configs": configs, "estimated_cost_s": cost}


def _ranges(numbers):
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _triton_version():
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
