"""Which kernels make GPT-2's training step slower planned at symbolic sizes than planned per shape?

GPT2LMHeadModel training (batch 8, bf16) at lengths 256, 512, 1024 planned once at symbolic sizes ran 7.17 /
16.89 / 31.97 ms a step against Inductor's 11.46 / 10.36 / 20.91 (zoo a2cf6e3); planned per shape it had run
13.59 / 20.12 at 512 / 1024 (zoo 681c1f0). Prediction: device time in brrr's memory-bound kernels, whose size
arguments carry no divisibility (`do_not_specialize`), so Triton cannot vectorize their masked loads; and row
reductions looped where the per-shape plan keeps rows in registers.

Per mode (per shape; symbolic): steps at 256 then 1024, then the profiler's device time per kernel over 5 steps
at 1024, the 25 largest, and the totals by kind (brrr's kernels, matmuls, attention, other).
"""

import sys
import time

import torch

sys.path.insert(0, "benchmarks/zoo")
from models import gpt2_lengths   # noqa: E402

import brrr   # noqa: E402


def step(fn, ids, labels):
    loss = fn(ids, labels)
    loss.backward()
    return loss


def kind_of(name):
    n = name.lower()
    if n.startswith("brrr_"):
        return "brrr"
    if "gemm" in n or "nvjet" in n or "cutlass" in n or "sm90" in n or "xmma" in n:
        return "matmul"
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    return "other"


def main():
    work = gpt2_lengths("cuda", torch.bfloat16, quick=False)
    model = work.model
    short_ids, long_ids = work.shapes[0][1][0], work.shapes[2][1][0]
    for name, symbolic in (("per shape", False), ("symbolic", True)):
        torch._dynamo.reset()
        fn = brrr.compile(model, symbolic_sizes=symbolic)
        for ids in (short_ids, long_ids):
            for _ in range(3):
                step(fn, ids, ids)
                model.zero_grad(set_to_none=True)
        for _ in range(15):   # past the launch-or-replay trial
            step(fn, long_ids, long_ids)
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            step(fn, long_ids, long_ids)
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 5 * 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step(fn, long_ids, long_ids)
                model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
        rows = [(e.device_time_total / 5, e.count // 5, e.key) for e in prof.key_averages()
                if e.device_time_total and not e.key.startswith("ProfilerStep")]
        kernels = [r for r in rows if not r[2].startswith(("aten::", "cuda", "Memcpy", "Memset"))]
        by_kind = {}
        for us, _, key in kernels:
            by_kind[kind_of(key)] = by_kind.get(kind_of(key), 0.0) + us
        print(f"\n== {name}: step {wall:.2f} ms wall; device ms by kind: "
              + ", ".join(f"{k} {v / 1e3:.2f}" for k, v in sorted(by_kind.items())), flush=True)
        for us, count, key in sorted(kernels, reverse=True)[:25]:
            print(f"  {us / 1e3:7.3f} ms  x{count:<4d} {key[:110]}")
        del fn


if __name__ == "__main__":
    main()
