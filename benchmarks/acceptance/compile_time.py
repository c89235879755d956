"""GPU acceptance for compile time (issue 44): how long a model's first step (a training step, or an inference call
under no_grad) takes in a new process, with
every cache empty (cold) and then with the caches the cold process left (warm), for brrr and Inductor's default
mode, run on the device machine:

    PYTHONPATH=$PWD python3 benchmarks/acceptance/compile_time.py --configs bert-mlm-train,tv-resnet18-train-fp32 \
        [--backends brrr,inductor] [--gpus N] [--phases] [--out DIR]

A configuration is a zoo name (built in bf16) or a sweep name (built in its precision; amp's autocast is left out:
compile time is asked). Each configuration's cold and warm processes run on one GPU and one share of the CPUs
(`--gpus` splits the configurations between GPUs). Every brrr run prints the wall time spent in each of brrr's
phases (PHASE lines, outermost calls) and what its compile workers compiled. The table reports warm/cold per
configuration and its median, and brrr's cold over Inductor's: geometric mean and the largest. Everything goes to
<out>/<date>-<gpu>-<commit>.json/.md (default <out>: benchmarks/results/acceptance-compile-time/).
"""

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (label, module, attribute path): wall seconds spent in each (outermost calls), printed for every run
PHASES = [
    ("Dynamo, all (tracing and the backend)", "torch._dynamo.convert_frame", "_compile"),
    ("AOTAutograd, all (brrr's compiles inside)", "torch._dynamo.backends.common", "aot_module_simplified"),
    ("brrr: layouts pass", "brrr.compile.backend", "layouts.choose"),
    ("brrr: compile_graph (plan or cache, build)", "brrr.compile.backend", "compile_graph"),
    ("brrr: plan_graph", "brrr.compile.backend", "plan_graph"),
    ("brrr: assemble (kernels loaded, compiled)", "brrr.compile.runtime.compiled", "assemble"),
    ("brrr: graph cache load", "brrr.compile.runtime.graph_cache", "load"),
    ("brrr: AOT cache load (AOTAutograd's graphs)", "brrr.compile.runtime.aot_cache", "load"),
    ("brrr: first calls (check, floor, call)", "brrr.compile.runtime.compiled", "CompiledGraph._first_call"),
    ("brrr: floor settle", "brrr.compile.runtime.floor", "settle"),
    ("brrr: floor alternatives", "brrr.compile.runtime.floor", "_try_alternatives"),
    ("brrr: launch-or-replay trials", "brrr.compile.runtime.compiled", "CompiledGraph._run_trial"),
    ("brrr: graph or captured (the first calls)", "brrr.compile.runtime.captured_choice", "CompiledOrCaptured.__call__"),
    ("brrr: a backward's inputs kept on the host", "brrr.compile.runtime.handed_over", "HandedOver.__init__"),
    ("brrr: kernels loaded from their binaries", "brrr.compile.runtime.launch", "load_binary"),
]
SPENT = {}


def _install_phase_timers():
    import functools
    import importlib

    for label, module, path in PHASES:
        try:
            owner = importlib.import_module(module)
            *parents, name = path.split(".")
            for part in parents:
                owner = getattr(owner, part)
            fn = getattr(owner, name)
        except (ImportError, AttributeError):
            continue
        depth = [0]

        def timed(*args, _fn=fn, _label=label, _depth=depth, **kwargs):
            _depth[0] += 1
            t = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                _depth[0] -= 1
                if not _depth[0]:
                    SPENT[_label] = SPENT.get(_label, 0.0) + time.perf_counter() - t

        setattr(owner, name, functools.wraps(fn)(timed))
    from brrr.compile.runtime import graph_cache
    from brrr.compile.runtime import compiled as compiled_module

    graph_cache.assemble = compiled_module.assemble   # imported by name: the timed one


def child(backend, config, profile, device="cuda", quick=False):
    """One process: build `config`, compile it with `backend`, time its first training step and three more."""
    sys.path[:0] = [str(HERE.parent / "zoo"), str(HERE.parent / "sweep"), str(HERE.parent)]
    import torch

    import models as zoo

    t0 = time.perf_counter()
    import brrr  # noqa: F401  (its import is part of what a user waits for)
    t_import = time.perf_counter() - t0
    cfg = next((c for c in zoo.CONFIGS if c.name == config), None)
    if cfg is not None:
        work = cfg.build(device, torch.bfloat16, quick)
    else:
        import catalog

        work = next(c for c in catalog.all_configs() if c.name == config).build(device, quick)
    model, inputs = work.model, work.inputs
    _install_phase_timers()
    if backend == "brrr":   # PYTHONPATH, not an installed entry point
        from brrr.compile.backend import make_backend
        compiled = torch.compile(model, backend=make_backend())
    else:
        compiled = torch.compile(model, backend=backend)

    def step():
        if not work.train:   # inference, as the sweep runs it
            with torch.no_grad():
                compiled(*inputs)
        else:
            for p in model.parameters():
                p.grad = None
            out = compiled(*inputs)
            if isinstance(out, dict):
                out = next(iter(out.values()))
            loss = out if isinstance(out, torch.Tensor) else (out[0] if isinstance(out, (tuple, list)) else out.loss)
            loss.float().sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()

    prof = cProfile.Profile() if profile else None
    t = time.perf_counter()
    if prof:
        prof.enable()
    step()
    if prof:
        prof.disable()
    first = time.perf_counter() - t
    spent = dict(SPENT)   # the first step's: later steps go through some of the same functions
    t = time.perf_counter()
    for _ in range(3):
        step()
    steady = (time.perf_counter() - t) / 3
    print(f"RESULT backend={backend} first_call_s={first:.2f} steady_ms={steady * 1e3:.2f} "
          f"import_brrr_s={t_import:.2f}", flush=True)
    if backend == "brrr":
        from brrr.compile.runtime import aot_cache, compile_workers, graph_cache

        pool = compile_workers._POOL
        print("graph cache:", graph_cache.STATS, "AOT cache:", aot_cache.STATS)
        print("compile workers:", "none" if pool is None else
              f"{pool.size} started, {pool.compiled} kernels compiled, lost: {pool.lost}")
        for label, _, _ in PHASES:
            print(f"PHASE {label:48s} {spent.get(label, 0.0):7.2f} s")
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(
            r"brrr/|_functorch|_dynamo|triton/runtime|triton/compiler", 80)
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(40)
        Path(os.environ["COMPILE_TIME_PROFILE"]).write_text(s.getvalue())


def run_one(args, config, backend, label, env, cpus, profile=False):
    """One cold or warm process on `cpus`; its row (first step and steady step times), its output lines kept."""
    cmd = [sys.executable, __file__, "--configs", config, "--child", backend, "--device", args.device] + \
          (["--profile-child"] if profile else []) + (["--quick"] if args.quick else [])
    if profile:   # the child's cProfile report, beside the results
        env = dict(env, COMPILE_TIME_PROFILE=str(args.out_dir / f"profile-{config}-{backend}-{label}.txt"))
    t = time.perf_counter()
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s,
                             preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        rc, stdout, stderr = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired as e:
        partial = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc, stdout, stderr = "timeout", partial, ""
    row = {"config": config, "backend": backend, "run": label, "process_s": round(time.perf_counter() - t, 2),
           "rc": rc}
    lines = [ln for ln in stdout.splitlines() if ln.startswith(("RESULT", "PHASE", "graph cache", "compile workers"))]
    for ln in lines:
        if ln.startswith("RESULT"):
            row.update({k: float(v) for k, v in (kv.split("=") for kv in ln.split()[1:]) if k != "backend"})
    row["lines"] = lines if args.phases else [ln for ln in lines if not ln.startswith("PHASE")]
    if rc != 0:
        row["error"] = stderr[-2000:]
    return row


def run_share(args, configs, gpu, cpus, rows, started):
    """Every run of `configs` in turn on GPU `gpu` (its environment from the zoo's workers), into `rows`: per
    backend, a fresh cache, cold then warm. No configuration starts after --budget-s."""
    sys.path.insert(0, str(HERE.parent / "zoo"))
    from run_zoo import worker_env

    for config in configs:
        if time.perf_counter() - started > args.budget_s:
            print(f"[gpu {gpu}] {config}: not started, budget spent", flush=True)
            continue
        for backend in args.backends.split(","):
            with tempfile.TemporaryDirectory() as d:
                env = dict(worker_env(gpu, cpus) if args.device == "cuda" else os.environ, PYTHONFAULTHANDLER="1",
                           BRRR_CACHE_DIR=f"{d}/brrr",
                           TRITON_CACHE_DIR=f"{d}/triton", TORCHINDUCTOR_CACHE_DIR=f"{d}/inductor")
                labels = args.runs.split(",")
                if args.profile and backend == "brrr":   # its own run: cProfile's cost stays out of the timed ones
                    labels.append(f"{args.profile}-profiled")
                for label in labels:
                    row = run_one(args, config, backend, label, env, cpus, profile=label.endswith("-profiled"))
                    rows.append(row)
                    print(f"[gpu {gpu}] {config} {backend} {label}: first step {row.get('first_call_s', '-')} s, "
                          f"rc {row['rc']}", flush=True)
                    for ln in row["lines"]:
                        print(f"[gpu {gpu}]   {ln}", flush=True)
                    if row.get("error"):
                        print(f"[gpu {gpu}]   {row['error'][-800:]}", flush=True)
        args.save()


def summary(rows, configs):
    """Per configuration: cold, warm, warm/cold for each backend, brrr's cold over Inductor's; then the medians and
    geometric mean the issue asks for."""
    import math
    import statistics

    got = {(r["config"], r["backend"], r["run"]): r.get("first_call_s") for r in rows}
    table, shares, ratios = [], [], []
    for c in configs:
        bc, bw, ic, iw = (got.get((c, b, r)) for b in ("brrr", "inductor") for r in ("cold", "warm"))
        share = bw / bc if bc and bw else None
        ratio = bc / ic if bc and ic else None
        shares += [share] if share else []
        ratios += [ratio] if ratio else []
        table.append({"config": c, "brrr_cold_s": bc, "brrr_warm_s": bw, "warm_over_cold": share,
                      "inductor_cold_s": ic, "inductor_warm_s": iw, "brrr_over_inductor_cold": ratio})
    return {"configs": table,
            "median_warm_over_cold": statistics.median(shares) if shares else None,
            "geomean_brrr_over_inductor_cold": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
            "max_brrr_over_inductor_cold": max(ratios) if ratios else None}


def markdown(result):
    env, s = result["environment"], result["summary"]
    f = (lambda v, d=2: "-" if v is None else f"{v:.{d}f}")
    lines = [f"# Compile time: first step (training or inference) in a new process, cold and warm ({env['device']}, "
             f"torch "
             f"{env['torch']}, triton {env['triton']}, commit {env['commit']}, {env['date']})", "",
             "| configuration | brrr cold s | brrr warm s | warm/cold | Inductor cold s | Inductor warm s | "
             "brrr/Inductor cold |", "|---|---|---|---|---|---|---|"]
    for r in s["configs"]:
        lines.append(f"| {r['config']} | {f(r['brrr_cold_s'])} | {f(r['brrr_warm_s'])} | {f(r['warm_over_cold'])} | "
                     f"{f(r['inductor_cold_s'])} | {f(r['inductor_warm_s'])} | {f(r['brrr_over_inductor_cold'])} |")
    lines += ["", f"- median warm/cold (brrr): {f(s['median_warm_over_cold'], 3)}",
              f"- brrr/Inductor cold: geometric mean {f(s['geomean_brrr_over_inductor_cold'], 3)}, "
              f"largest {f(s['max_brrr_over_inductor_cold'], 3)}"]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="bert-mlm-train", help="comma-separated zoo or sweep configuration names")
    p.add_argument("--backends", default="brrr,inductor")
    p.add_argument("--gpus", type=int, default=1, help="configurations spread over this many GPUs")
    p.add_argument("--runs", default="cold,warm", help="cold, warm or both (warm follows a cold run)")
    p.add_argument("--phases", action="store_true", help="keep brrr's PHASE lines in the output and the JSON")
    p.add_argument("--profile", choices=("warm",), help="one more warm brrr run under cProfile, its report written "
                   "beside the results (not counted in the table)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per process")
    p.add_argument("--budget-s", type=float, default=480.0, help="no configuration starts after this many seconds")
    p.add_argument("--out", help="directory for the results (default benchmarks/results/acceptance-compile-time)")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse --short HEAD)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny models (a CPU check of this script)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--profile-child", dest="profile_child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.configs, args.profile_child, args.device, args.quick)
    import concurrent.futures
    import json

    sys.path[:0] = [str(HERE.parent), str(HERE.parent / "zoo")]
    from result_files import RESULTS, result_stem, run_environment
    from run_zoo import cpu_shares

    import threading

    configs = [c for c in args.configs.split(",") if c]
    gpus = max(1, min(args.gpus, len(configs)))
    shares = [configs[i::gpus] for i in range(gpus)]
    cpus = cpu_shares(gpus)
    environment = run_environment(args.device, gpus, args.commit)
    device = environment["device"]
    out = Path(args.out or RESULTS / "acceptance-compile-time")
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(out, device, commit=environment["commit"])
    args.out_dir = out
    rows, lock = [], threading.Lock()

    def save():   # after every configuration: a run cut short keeps what it measured
        with lock:
            result = {"environment": environment, "runs": list(rows), "summary": summary(rows, configs)}
            stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
            stem.with_suffix(".md").write_text(markdown(result))
        return result
    args.save = save
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(gpus) as pool:
        for fut in [pool.submit(run_share, args, share, i, cpus[i], rows, started) for i, share in enumerate(shares)]:
            fut.result()
    print(markdown(save()))
    print(f"wrote {stem}.json and .md")


if __name__ == "__main__":
    main()
