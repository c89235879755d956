"""Where does mixer-b16 training lose to Inductor, kernel by kernel?

Not run yet. In the zoo, timm's mixer_b16_224 training step (batch 64, bf16) reads brrr 22.67 ms against
Inductor's 20.38 (0.90x): the one vision configuration still behind Inductor. This probe profiles a few steps
of each backend (brrr launching its kernels, so each is visible; Inductor's default mode) and sums device time
per step by kernel family (matmuls, brrr's or Inductor's Triton kernels, ATen's own kernels) and by kernel,
so the gap can be pinned on a family before anything is changed.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_mixer_training_lose_to_inductor.py [--config NAME]
"""

import argparse
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "zoo"), os.path.join(HERE, "..")]

STEPS = 5
TOP = int(os.environ.get("TOP_KERNELS", 25))


def family(name):
    low = name.lower()
    if any(k in low for k in ("gemm", "cutlass", "xmma", "nvjet", "sm90_", "cublas")):
        return "matmul"
    if "flash" in low or "fmha" in low or "attention" in low:
        return "attention"
    if low.startswith("brrr_") or low.startswith("triton_"):
        return "triton"
    return "aten"


def profile(step, label):
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    per_kernel = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.device_time > 0:
            k = per_kernel[e.name]
            k[0] += 1
            k[1] += e.device_time / STEPS
    families = defaultdict(float)
    for name, (_, us) in per_kernel.items():
        families[family(name)] += us
    total = sum(families.values())
    print(f"\n== {label}: {total / 1e3:.2f} ms of kernels per step")
    for fam, us in sorted(families.items(), key=lambda kv: -kv[1]):
        print(f"   {fam:10s} {us / 1e3:7.2f} ms  {100 * us / total:5.1f}%")
    for name, (count, us) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:TOP]:
        print(f"   {us:8.1f} us  x{count // STEPS:3d}  {family(name):8s} {name[:90]}")
    return families


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="mixer-b16-train")
    p.add_argument("--backends", default="eager,brrr,inductor")
    args = p.parse_args()
    import torch

    import brrr
    from brrr.bench.step import Step, make_cotangents
    from models import BY_NAME

    torch.manual_seed(0)
    work = BY_NAME[args.config].build("cuda", torch.bfloat16, False)
    cotangents = make_cotangents(work.model(*work.inputs)) if work.train else None
    results = {}
    makers = {"eager": lambda m: m, "brrr": lambda m: brrr.compile(m, cuda_graphs=False),
              "inductor": lambda m: torch.compile(m)}
    for label in args.backends.split(","):
        make = makers[label]
        fn = make(work.model)
        step = Step(fn, work.model, [work.inputs], work.train, cotangents)
        results[label] = profile(step, label)
    if "brrr" in results and "inductor" in results:
        print("\nper family, brrr minus inductor (ms per step):")
        for fam in sorted(set(results["brrr"]) | set(results["inductor"])):
            print(f"   {fam:10s} {(results['brrr'].get(fam, 0) - results['inductor'].get(fam, 0)) / 1e3:+7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
