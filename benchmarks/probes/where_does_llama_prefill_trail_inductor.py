"""Probe: where does the zoo's LLaMA prefill (brrr 5.61 ms against Inductor's 5.57) lose its time?

Each backend's call is profiled (torch.profiler, 10 calls after warm-up); kernel time is summed by kernel name,
matmuls and attention apart from brrr's / Inductor's Triton kernels, and do_bench's median is printed beside."""

import os
import sys
from collections import defaultdict

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", "zoo"), os.path.join(os.path.dirname(__file__), "..", "..")]

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import models  # noqa: E402


def family(name):
    low = name.lower()
    if any(s in low for s in ("gemm", "sm90_xmma", "cutlass", "nvjet", "ampere", "sm80")):
        return "matmul"
    if "flash" in low or "fmha" in low or "attention" in low:
        return "attention"
    if low.startswith(("triton", "brrr")):
        return "triton"
    return "other"


def profile(label, fn, inputs, calls=10):
    with torch.no_grad():
        for _ in range(20):
            fn(*inputs)
        torch.cuda.synchronize()
        ms = do_bench(lambda: fn(*inputs), warmup=50, rep=300)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*inputs)
            torch.cuda.synchronize()
    by_name, by_family = defaultdict(lambda: [0.0, 0]), defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            by_name[e.name][0] += t / calls
            by_name[e.name][1] += 1
            by_family[family(e.name)] += t / calls
    busy = sum(by_family.values())
    print(f"\n== {label}: do_bench median {ms:.3f} ms; GPU busy {busy / 1e3:.3f} ms a call; "
          + ", ".join(f"{k} {v / 1e3:.3f}" for k, v in sorted(by_family.items(), key=lambda kv: -kv[1])))
    for name, (us, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:18]:
        print(f"  {us:8.1f} us  x{n // calls:<3d} {name[:120]}")


def main():
    import brrr
    device = torch.device("cuda")
    print(f"probe where_does_llama_prefill_trail_inductor; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    cfg = next(c for c in models.CONFIGS if c.name == "llama-prefill")
    work = cfg.build(device, torch.bfloat16, False)
    inputs = work.inputs if work.inputs else work.shapes[0][1]
    print("inputs:", [tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor)])
    profile("eager", work.model, inputs)
    torch._dynamo.reset()
    profile("brrr", brrr.compile(work.model), inputs)
    torch._dynamo.reset()
    profile("inductor", torch.compile(work.model), inputs)


if __name__ == "__main__":
    main()
