"""Where does GPT-NeoX training trail Inductor?

The zoo's gpt-neox-160m training step (8 x 1024, bf16) read 0.93x Inductor's time in the whole zoo at c580743
(21.16 against 19.66 ms), the zoo's largest gap; `brrr explain` shows no fallback and no graph break, and a
replay read only 2.3% faster than launching.

Prediction: matmuls and attention tie; brrr's own kernels take ~1.5 ms more than Inductor's Triton kernels, in
the partial rotary embedding (a quarter of each head rotated, the rest concatenated) and its backward.

Profiles one step after warm-up for eager, brrr and Inductor (in that order, one process): device time per
kernel, summed by name, the top 15 of each, and Triton, cuBLAS and other kernels' totals.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_gpt_neox_training_trail_inductor.py
"""

import os
import sys
import time
from collections import Counter

import torch

from benchmarks.zoo.models import CONFIGS
from brrr.bench.backends import fresh_compile, skip_logging_in_graphs, stop_inductor_workers


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
    if "sdpa" in name or "flash" in name or "fmha" in name or "attention" in name:
        return "attention"
    if "gemm" in name or "cutlass" in name or "sm90" in name or "nvjet" in name:
        return "matmul"
    return "other"


def main():
    config = next(c for c in CONFIGS if c.name == "gpt-neox-160m-train")
    dev = torch.device("cuda")
    work = config.build(dev, torch.bfloat16, False)
    model, inputs = work.model, work.inputs
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    skip = skip_logging_in_graphs()
    skip.__enter__()
    for backend in os.environ.get("BACKENDS", "brrr,inductor").split(","):
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
        families = Counter()   # Triton kernels by name without the layer's number
        for name, us in kernels.items():
            if kind(name) == "triton":
                families[name.rstrip("0123456789").rstrip("_")] += us
        print("  Triton kernels by family:")
        for name, us in families.most_common(30):
            print(f"  {us:9.1f} us  {name[:110]}")
        del fn
    stop_inductor_workers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
