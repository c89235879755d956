"""Where does brrr's cold compile of a large training graph go, and do its Triton compiles run in parallel?

Question: the zoo's first GPU run measured brrr's cold compile at 38 s for BertForMaskedLM training and 104 s
for densenet121 training. Which stage holds it: Dynamo's trace, AOTAutograd, brrr's planning, code generation,
or compiling the kernels (8 threads; Triton's compile may hold the GIL)? And why did do_bench report 52.8 ms for
brrr's BERT step when calls back to back took 16.2 ms?

Answer (H100 host, `results/probes/2026-11-23-h100-4c1d6e3-compile-time.log`; NOTES.md, "The zoo's first run"):
Dynamo and AOTAutograd take ~40% of it, brrr's planning 6-7 s, and the kernels' compiles run in parallel in the
threads (125 s of per-kernel compile in 16 s on 8 threads). The 52.8 ms was do_bench timing two calls of a step
with rare 50 ms outliers; over 62 calls the median is 15.2 ms.

    PYTHONPATH=$PWD python3 benchmarks/probes/compile_time.py [--configs bert-mlm-train,densenet121-train]
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "zoo")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="bert-mlm-train,densenet121-train")
    p.add_argument("--inductor", action="store_true")
    args = p.parse_args()
    root = tempfile.mkdtemp()
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "i"), ("TRITON_CACHE_DIR", "t"), ("BRRR_CACHE_DIR", "b")):
        os.environ[var] = os.path.join(root, sub)
    import torch
    import triton.testing

    import models
    from brrr.bench.backends import fresh_compile
    from brrr.bench.step import Step, make_cotangents
    from brrr.compile import backend, runtime

    stages = {}

    def timed(module, name, label):
        real = getattr(module, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                stages[label] = stages.get(label, 0.0) + time.perf_counter() - t
        setattr(module, name, wrapper)

    timed(backend, "plan_graph", "plan (lower+schedule)")
    timed(runtime, "generate_all", "generate (codegen)")
    timed(runtime, "reused_memory", "inplace analysis")
    per_kernel = []
    real_load = runtime._load_and_warm

    def load(ks, device):
        t = time.perf_counter()
        try:
            return real_load(ks, device)
        finally:
            per_kernel.append(time.perf_counter() - t)
    runtime._load_and_warm = load
    timed(runtime, "build", "build (generate + load/compile kernels + exec)")
    timed(backend, "brrr_backend", "brrr_backend (AOTAutograd + all brrr)")

    for name in args.configs.split(","):
        work = models.BY_NAME[name].build("cuda", torch.bfloat16, False)
        cot = make_cotangents(work.model(*work.inputs)) if work.train else None
        for b in ["brrr"] + (["inductor"] if args.inductor else []):
            stages.clear()
            per_kernel.clear()
            step = Step(fresh_compile(work.model, b), work.model, [work.inputs], work.train, cot)
            torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            print(f"\n{name} / {b}: first call {time.perf_counter() - t:.1f} s")
            for k, v in stages.items():
                print(f"  {k:50s} {v:7.2f} s")
            if per_kernel:
                print(f"  kernels compiled {len(per_kernel)}, sum of per-kernel times {sum(per_kernel):.1f} s, "
                      f"max {max(per_kernel):.2f} s")
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            print(f"  back-to-back {1e3 * (time.perf_counter() - t) / 10:.2f} ms/call")
            for rep in (100, 1000):
                r = sorted(triton.testing.do_bench(step, warmup=25, rep=rep, return_mode="all"))
                print(f"  do_bench rep={rep}: n={len(r)} min {r[0]:.2f} median {r[len(r) // 2]:.2f} "
                      f"max {r[-1]:.2f} ms")
        work = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
