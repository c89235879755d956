"""Probe: where does a sweep configuration that trails Inductor's reduce-overhead mode lose its time?

For each named sweep configuration, brrr and Inductor (reduce-overhead) in one process: a call's wall time
(`do_bench` median, the sweep's measure), its device time profiled (every kernel, summed by name, per call),
and brrr's generated calls and kernels (BRRR_DUMP_DIR and the kernel cache, copied under --out).

Prediction (DenseNet121 bf16 inference, 2.27 ms against 2.00 in the sweep, whose reduce-overhead row is a cached
one scaled by eager's ratio): the difference sits in a few kernels, the largest a copy the sweep's floor verdicts
read at 3-6% of its roofline (63 us against 2). Found: 2.278 ms against reduce-overhead's 2.839 in one process;
the copy is the 58 3x3 weights converted to channels_last in one kernel of 10 programs (60.9 us). With each
weight's blocks programs of their own (codegen SPREAD_BELOW), predicted ~5 us, the call ~2.22 ms.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_a_convnet_step_trail_reduce_overhead.py \
        --only tv-densenet121-infer-bf16 --out $OUT/probe
"""

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sweep"))


def profile_kernels(call, calls=5):
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    totals = {}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
        if us and us > 0:
            totals[event.key] = (totals.get(event.key, (0.0, 0))[0] + us / calls,
                                 totals.get(event.key, (0.0, 0))[1] + event.count // calls)
    return sorted(([k, us, n] for k, (us, n) in totals.items()), key=lambda r: -r[1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--backends", default="brrr,inductor-reduce-overhead")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("BRRR_DUMP_DIR", os.path.join(args.out, "dump"))
    import torch
    from triton.testing import do_bench

    from brrr.compile.backend import brrr_backend
    from catalog import all_configs

    configs = {c.name: c for c in all_configs()}
    report = {}
    for name in args.only.split(","):
        cfg = configs[name]
        rows = {}
        for backend in args.backends.split(","):
            torch.manual_seed(0)
            work = cfg.build("cuda", False)
            if backend == "brrr":
                fn = torch.compile(work.model, backend=brrr_backend)
            elif backend == "inductor-reduce-overhead":
                fn = torch.compile(work.model, mode="reduce-overhead")
            else:
                fn = torch.compile(work.model)

            amp = cfg.precision == "amp"

            def call():
                if work.train:
                    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                        loss = fn(*work.inputs)
                    loss.backward()
                    for prm in work.model.parameters():
                        prm.grad = None
                    return loss
                with torch.no_grad():
                    return fn(*work.inputs)
            for _ in range(5):
                call()
            torch.cuda.synchronize()
            wall = do_bench(call, warmup=50, rep=300, return_mode="median") * 1e-3
            kernels = profile_kernels(call)
            busy = sum(r[1] for r in kernels) * 1e-6
            rows[backend] = {"wall_s": wall, "busy_s": busy, "kernels": kernels}
            if backend == "brrr":
                from brrr.compile.runtime import floor
                rows[backend]["floor"] = [str(v) for v in floor.DECISIONS if v.tried]
                for line in rows[backend]["floor"]:
                    print("    floor:", line[:300])
                floor.DECISIONS.clear()
            print(f"{name} {backend}: {wall * 1e3:.3f} ms a call, {busy * 1e3:.3f} ms of kernels", flush=True)
            for k, us, n in kernels[:25]:
                print(f"    {us:8.1f} us  x{n:<4d} {k[:110]}")
            torch._dynamo.reset()
        report[name] = rows
        with open(os.path.join(args.out, "kernels.json"), "w") as f:
            json.dump(report, f, indent=1)
    cache = os.path.join(os.path.expanduser("~"), ".cache", "brrr", "kernels")
    if os.path.isdir(cache):
        shutil.copytree(cache, os.path.join(args.out, "kernel-sources"), dirs_exist_ok=True)


if __name__ == "__main__":
    main()
