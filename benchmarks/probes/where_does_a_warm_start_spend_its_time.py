"""Where does a warm start spend its time? BERT MLM training (the zoo's, bf16, 8x512), compiled in a new process
with every cache empty (cold), then again in another new process with the caches the first one left (warm), for
brrr and for Inductor; brrr's warm start again with its graph cache off, and once more under cProfile (its top
functions). Every run prints the wall time spent in each phase (PHASES, outermost calls).

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_a_warm_start_spend_its_time.py [--config bert-mlm-train]
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
    sys.path[:0] = [str(HERE.parent / "zoo"), str(HERE.parent / "sweep"), str(HERE.parent)]
    import torch

    import models as zoo

    t0 = time.perf_counter()
    import brrr  # noqa: F401  (its import is part of what a user waits for)
    t_import = time.perf_counter() - t0
    cfg = next((c for c in zoo.CONFIGS if c.name == config), None)
    if cfg is not None:
        work = cfg.build(device, torch.bfloat16, quick)
    else:   # a sweep configuration, built in its precision (amp's autocast left out: compile time is asked)
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
        for p in model.parameters():
            p.grad = None
        out = compiled(*inputs)
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
    from brrr.compile.runtime import graph_cache

    print("graph cache:", graph_cache.STATS)
    for label, _, _ in PHASES:
        print(f"PHASE {label:48s} {spent.get(label, 0.0):7.2f} s")
    if prof:
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        st.sort_stats("cumulative").print_stats(r"brrr/|_functorch|convert_frame|triton/runtime|triton/compiler", 60)
        print(s.getvalue())
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        st.sort_stats("tottime").print_stats(40)
        print(s.getvalue())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="bert-mlm-train")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backends", default="brrr,inductor")
    p.add_argument("--cold-profile", action="store_true", help="profile the cold compile instead")
    p.add_argument("--runs", help="comma-separated labels of the runs to make (default: all)")
    p.add_argument("--quick", action="store_true", help="tiny models (a CPU check of the probe itself)")
    args = p.parse_args()
    if args.child:
        return child(args.child, args.config, args.profile, args.device, args.quick)
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, BRRR_CACHE_DIR=f"{d}/brrr", TRITON_CACHE_DIR=f"{d}/triton",
                       TORCHINDUCTOR_CACHE_DIR=f"{d}/inductor")
            runs = [("cold", args.cold_profile, {}), ("warm", False, {})]
            if backend == "brrr" and not args.cold_profile:
                runs += [("warm-no-graph-cache", False, {"BRRR_GRAPH_CACHE": "0"}), ("warm-profiled", True, {})]
            for label, profile, extra in [r for r in runs if args.runs is None or r[0] in args.runs.split(",")]:
                cmd = [sys.executable, __file__, "--config", args.config, "--child", backend, "--device", args.device] + \
                      (["--profile"] if profile else []) + (["--quick"] if args.quick else [])
                t = time.perf_counter()
                out = subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True)
                print(f"== {backend} {label}: process {time.perf_counter() - t:.1f} s, rc {out.returncode}", flush=True)
                print(out.stdout if profile else "\n".join(l for l in out.stdout.splitlines() if l.startswith(("RESULT", "PHASE", "graph cache"))))
                if out.returncode:
                    print(out.stderr[-3000:])


if __name__ == "__main__":
    main()
