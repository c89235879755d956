"""Where does a zoo configuration's step go under each backend: which kernels take the device time, how much
host time is left over, what falls back, and where Dynamo breaks the graph?

Answer: not yet run.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_the_step_go.py inception-v3-infer opt-125m-train \
        --backends eager,brrr

For each configuration and backend: the wall time of one step (median of 20, synchronised), the device time
of its kernels (torch.profiler over 5 steps), the 15 kernels with the most device time, the host ops with the
most self CPU time, Dynamo's graph and graph-break counts, and brrr's kernel- and graph-scope fallbacks.
"""

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "zoo")]


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(step, count=20):
    times = []
    for _ in range(count):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def profile(step, steps=5):
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync()
    kernels, counts, host = Counter(), Counter(), Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += e.device_time / steps / 1e3
            counts[e.name] += 1 / steps
    for avg in prof.key_averages():
        if avg.self_cpu_time_total > 0:
            host[avg.key] += avg.self_cpu_time_total / steps / 1e3
    return kernels, counts, host


def python_profile(step, steps=50):
    """The Python functions taking the most of the host's time over `steps` steps (tottime, us per step)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    sync()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:25]
    print(f"python profile (us per step over {steps}; tottime, cumtime, calls per step):")
    for (file, line, fn), (_, calls, tottime, cumtime, _) in rows:
        print(f"  {tottime / steps * 1e6:8.1f} {cumtime / steps * 1e6:8.1f} {calls / steps:5.1f}  "
              f"{Path(file).name}:{line} {fn}")


def make_step(work, fn):
    if work.shapes:
        steps = [make_one(work, fn, inputs) for _, inputs in work.shapes]
        return lambda: [s() for s in steps]
    return make_one(work, fn, work.inputs)


def make_one(work, fn, inputs):
    from brrr.bench.step import Step, make_cotangents

    cot = make_cotangents(work.model(*inputs)) if work.train else None
    return Step(fn, work.model, [inputs], work.train, cot)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("configs", nargs="+")
    p.add_argument("--backends", default="eager,brrr")
    p.add_argument("--cprofile", action="store_true", help="also Python's own profile of 50 compiled steps")
    p.add_argument("--quick", action="store_true", help="tiny models on the CPU (checks the probe runs)")
    args = p.parse_args()

    import torch._dynamo
    from torch._dynamo.utils import counters

    from brrr.bench.backends import fresh_compile
    from brrr.compile import fallbacks
    from models import CONFIGS

    by_name = {c.name: c for c in CONFIGS}
    for name in args.configs:
        work = by_name[name].build(*(("cpu", torch.float32, True) if args.quick else
                                                     ("cuda", torch.bfloat16, False)))
        for backend in args.backends.split(","):
            counters.clear()
            del fallbacks.LOG[:]
            fn = fresh_compile(work.model, backend)
            step = make_step(work, fn)
            start = time.perf_counter()
            step()
            sync()
            first = time.perf_counter() - start
            for _ in range(3):
                step()
            wall = wall_ms(step)
            kernels, counts, host = profile(step)
            device = sum(kernels.values())
            print(f"\n=== {name} / {backend}: wall {wall:.2f} ms/step, kernels {device:.2f} ms/step "
                  f"({sum(counts.values()):.0f} launches), first call {first:.1f} s")
            stats = dict(counters.get("stats", {}))
            breaks = dict(counters.get("graph_break", {}))
            print(f"dynamo: {stats}; graph breaks {sum(breaks.values())}")
            for reason, n in sorted(breaks.items(), key=lambda kv: -kv[1])[:8]:
                print(f"  break x{n}: {reason[:200]}")
            for record in fallbacks.LOG[:12]:
                print(f"  fallback {record.scope} {record.graph} {record.what}: {record.reason[:160]}")
            print("top kernels (ms/step, launches/step):")
            for k, ms in kernels.most_common(15):
                print(f"  {ms:7.3f} {counts[k]:5.0f}  {k[:110]}")
            print("top host ops (self CPU ms/step):")
            for k, ms in host.most_common(12):
                print(f"  {ms:7.3f}  {k[:110]}")
            if args.cprofile and backend != "eager":
                python_profile(step)
        del work
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
