"""Where does a warm start spend its time? BERT MLM training (the zoo's, bf16, 8x512), compiled in a new process
with every cache empty (cold), then again in another new process with the caches the first one left (warm), for
brrr and for Inductor; brrr's warm start once more under cProfile, its top functions by cumulative time.

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


def child(backend, config, profile, device="cuda", quick=False):
    sys.path[:0] = [str(HERE.parent / "zoo"), str(HERE.parent)]
    import torch

    import models as zoo

    t0 = time.perf_counter()
    import brrr  # noqa: F401  (its import is part of what a user waits for)
    t_import = time.perf_counter() - t0
    cfg = next(c for c in zoo.CONFIGS if c.name == config)
    work = cfg.build(device, torch.bfloat16, quick)
    model, inputs = work.model, work.inputs
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
    t = time.perf_counter()
    for _ in range(3):
        step()
    steady = (time.perf_counter() - t) / 3
    print(f"RESULT backend={backend} first_call_s={first:.2f} steady_ms={steady * 1e3:.2f} "
          f"import_brrr_s={t_import:.2f}", flush=True)
    if prof:
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        st.sort_stats("cumulative").print_stats(r"brrr/|_functorch|convert_frame|triton/runtime|triton/compiler", 90)
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
    p.add_argument("--quick", action="store_true", help="tiny models (a CPU check of the probe itself)")
    args = p.parse_args()
    if args.child:
        return child(args.child, args.config, args.profile, args.device, args.quick)
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, BRRR_CACHE_DIR=f"{d}/brrr", TRITON_CACHE_DIR=f"{d}/triton",
                       TORCHINDUCTOR_CACHE_DIR=f"{d}/inductor")
            runs = [("cold", False), ("warm", False)] + ([("warm, profiled", True)] if backend == "brrr" else [])
            for label, profile in runs:
                cmd = [sys.executable, __file__, "--config", args.config, "--child", backend, "--device", args.device] + \
                      (["--profile"] if profile else []) + (["--quick"] if args.quick else [])
                t = time.perf_counter()
                out = subprocess.run(cmd, env=env, capture_output=True, text=True)
                print(f"== {backend} {label}: process {time.perf_counter() - t:.1f} s, rc {out.returncode}", flush=True)
                print(out.stdout if profile else "\n".join(l for l in out.stdout.splitlines() if "RESULT" in l))
                if out.returncode:
                    print(out.stderr[-3000:])


if __name__ == "__main__":
    main()
