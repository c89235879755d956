"""Where does LLaMA-style training trail Inductor?

The zoo's LLaMA training step (8 x 1024, bf16) read 0.99-1.02x Inductor's time in the last whole-zoo runs (17.51
against 17.33 ms at 17e2749), and under DDP on two H200s 21.04 against 20.71 ms (c864cdf). Its matmuls are cuBLAS
in both.

Prediction: the matmuls tie; brrr's own kernels are within 0.2 ms of Inductor's Triton kernels; the gap is in a
few kernels (the RMSNorm backward, the rotary embedding's backward) rather than spread out.

Profiles one step after warm-up for eager, brrr and Inductor (in that order, one process): device time per
kernel, summed by name, the top 15 of each, and Triton, cuBLAS and other kernels' totals.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_llama_training_trail_inductor.py
    BACKENDS=brrr PYTHONPATH=$PWD python3 benchmarks/probes/where_does_llama_training_trail_inductor.py
"""

import os
import sys
import time
from collections import Counter

import torch

from benchmarks.zoo.models import CONFIGS
from brrr.bench.backends import fresh_compile, stop_inductor_workers


def profile(step, n=3):
    from torch.profiler import ProfilerActivity, profile as torch_profile
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / n
    kernels = Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += (getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)) / n
    return wall, kernels


def kind(name):
    if name.startswith(("brrr_", "triton_")):
        return "triton"
    if "gemm" in name or "cutlass" in name or "sm90" in name or "nvjet" in name:
        return "matmul"
    return "other"


def main():
    config = next(c for c in CONFIGS if c.name == "llama-train")
    dev = torch.device("cuda")
    work = config.build(dev, torch.bfloat16, False)
    model, inputs = work.model, work.inputs
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    for backend in os.environ.get("BACKENDS", "eager,brrr,inductor").split(","):
        fn = model if backend == "eager" else fresh_compile(model, backend)

        def step():
            loss = fn(*inputs)
            loss.backward()
            for p in model.parameters():
                p.grad = None
        step()
        wall, kernels = profile(step)
        totals = Counter()
        for name, us in kernels.items():
            totals[kind(name)] += us
        busy = sum(kernels.values())
        print(f"\n== {backend}: wall {wall * 1e3:.2f} ms a step, GPU busy {busy / 1e3:.2f} ms; "
              + ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in totals.most_common()) + f"; {len(kernels)} kernel names")
        for name, us in kernels.most_common(25):
            print(f"  {us:9.1f} us  {name[:110]}")
        if backend == "brrr":   # brrr's own kernels, all of them: each layer's is named apart
            for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                if name.startswith("brrr_") and us >= 20:
                    print(f"  brrr {us:9.1f} us  {name}")
        del fn
    stop_inductor_workers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
