"""Where does brrr trail eager in the zoo: on the device (kernels), or on the host (launches, fallbacks)?

The zoo (`results/zoo/2026-11-24-h100-0e01b6a.*`) has brrr more than 3% slower than eager on three
configurations: deit-small-infer (7.06 vs 6.36 ms, brrr with CUDA graphs 7.02: so not the host),
opt-125m-train (35.4 vs 29.7 median, but back to back 27.0 vs 36.5: noise or host?) and bert-lengths-infer
(after the second length brrr runs Dynamo's graph, 7.7-11.1 ms at lengths 384-512 where eager takes 4.3).
For each, per backend: do_bench's median, the back-to-back time per call, the device time per step (the sum
of the profiled kernels) and the kernels that take it, so the gap lands on kernels or on the host. Beside
them (`wide-rows`): softmax and layer norm over 65536-wide bf16 rows, after the layer-norm order fix.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_brrr_trails_eager.py [--only NAME,...]
"""

import argparse
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "zoo"))


def step_of(work, fn, inputs):
    from brrr.bench.step import Step, make_cotangents
    cot = make_cotangents(work.model(*inputs)) if work.train else None
    return Step(fn, work.model, [inputs], work.train, cot)


def measure(label, step, top=12):
    import torch
    from triton.testing import do_bench
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    median = do_bench(step, rep=300, return_mode="median")
    t0 = time.perf_counter()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    b2b = (time.perf_counter() - t0) / 20 * 1e3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += e.device_time_total / 3
            per[e.name][1] += 1
    device_ms = sum(v[0] for v in per.values()) / 1e3
    launches = sum(v[1] for v in per.values()) / 3
    print(f"{label:34s} median {median:7.2f} ms  back-to-back {b2b:7.2f} ms  device {device_ms:7.2f} ms"
          f"  kernels/step {launches:5.0f}", flush=True)
    for name, (us, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"    {us / 1e3:7.3f} ms  x{n / 3:4.0f}  {name[:110]}", flush=True)


def fixed(name):
    import torch
    import models
    from brrr.bench.backends import fresh_compile
    work = models.BY_NAME[name].build("cuda", torch.bfloat16, False)
    for backend in ("eager", "brrr"):
        fn = work.model if backend == "eager" else fresh_compile(work.model, backend)
        measure(f"{name} {backend}", step_of(work, fn, work.inputs))


def lengths(name, backends=("eager", "dynamo-eager", "brrr", "brrr-static")):
    import torch
    import models
    from brrr.bench.backends import fresh_compile
    work = models.BY_NAME[name].build("cuda", torch.bfloat16, False)
    for backend in backends:
        if backend == "eager":
            fn = work.model
        elif backend == "dynamo-eager":     # Dynamo's graph run as it is: what brrr's graph fallback runs
            torch._dynamo.reset()
            fn = torch.compile(work.model, backend="eager")
        elif backend == "brrr":
            fn = fresh_compile(work.model, "brrr")
        else:
            fn = fresh_compile(work.model, "brrr", dynamic=False)
        for label, inputs in work.shapes:
            measure(f"{name} {backend} {label}", step_of(work, fn, inputs), top=8 if label in ("len 512", "len 200") else 0)


def wide_rows(name):
    """Softmax and layer norm over rows of 65536 bf16 (a row loops: read twice, written once), as fractions
    of the copy roof on the bytes read once and written once."""
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench
    from brrr.bench.backends import fresh_compile
    x = torch.randn(2048, 65536, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(65536, device="cuda", dtype=torch.bfloat16)
    copy_ms = do_bench(lambda: x.clone(), rep=200, return_mode="median")
    print(f"copy {2 * x.nbytes / copy_ms / 1e9:.2f} TB/s", flush=True)
    for op, fn in (("softmax", lambda a: torch.softmax(a, -1)), ("layer_norm", lambda a: F.layer_norm(a, (65536,), w, w))):
        for backend in ("eager", "brrr"):
            f = fresh_compile(fn, backend, dynamic=False)
            f(x)
            ms = do_bench(lambda: f(x), rep=200, return_mode="median")
            print(f"{op:10s} {backend:6s} {ms * 1e3:8.1f} us  {copy_ms / ms:5.0%} of copy", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="wide-rows,deit-small-infer,opt-125m-train,bert-lengths-infer")
    p.add_argument("--length-backends", default="eager,dynamo-eager,brrr,brrr-static")
    args = p.parse_args()
    for name in args.only.split(","):
        try:
            if "lengths" in name:
                lengths(name, args.length_backends.split(","))
            else:
                (wide_rows if name == "wide-rows" else fixed)(name)
        except Exception as e:     # one configuration's failure is a finding, not the end of the probe
            print(f"{name}: {type(e).__name__}: {e}"[:400], flush=True)


if __name__ == "__main__":
    main()
