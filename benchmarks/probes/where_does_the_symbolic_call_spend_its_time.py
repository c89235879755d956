"""Where does a call of a graph planned at symbolic sizes spend its time?

BertModel inference (batch 8, bf16) at changing lengths ran 6.66-6.99 ms a call planned at symbolic sizes,
against eager's 4.29-4.61 (NOTES, "Changing shapes planned once"). Prediction: host time, not device time;
within it, launches through Triton's Python launcher (kernels with size arguments are refused by torch's static
launcher) and Dynamo's shape guards.

Per mode (eager; brrr per shape, launched; brrr at symbolic sizes, launched) at lengths 128 and 256: wall time
per synchronized call, host time per call (no sync), GPU busy time from the profiler, which launch path each
kernel took, and cProfile's top functions.
"""

import cProfile
import gc
import io
import pstats
import sys
import time

import torch

sys.path.insert(0, "benchmarks/zoo")
from models import bert_lengths   # noqa: E402

import brrr   # noqa: E402
from brrr.compile.launch import Launcher   # noqa: E402
from brrr.compile.runtime import CompiledGraph   # noqa: E402

DEV, DT = "cuda", torch.bfloat16


def busy_ms(fn, x, n=10):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn(x)
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total and
                e.key and not e.key.startswith("ProfilerStep"))
    return total / 1e3 / n


def timed(fn, x, n=30):
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    walls, hosts = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(x)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hosts.append(t1 - t0)
        walls.append(t2 - t0)
    walls.sort(), hosts.sort()
    return walls[n // 2] * 1e3, hosts[n // 2] * 1e3


def launch_paths():
    counts = {"static": 0, "triton launcher": 0, "jit": 0}
    for o in gc.get_objects():
        if isinstance(o, CompiledGraph):
            for v in o.call.__globals__.values() if hasattr(o.call, "__globals__") else ():
                if isinstance(v, Launcher):
                    key = "static" if v.static is not None else ("triton launcher" if v.fast else "jit")
                    counts[key] += 1
    return counts


def main():
    work = bert_lengths(DEV, DT, quick=False)
    model = work.model
    lengths = [x for _, (x,) in work.shapes][:2]
    modes = {
        "eager": lambda: model,
        "brrr per shape": lambda: brrr.compile(model, cuda_graphs=False),
        "brrr symbolic": lambda: brrr.compile(model, cuda_graphs=False, symbolic_sizes=True),
    }
    with torch.no_grad():
        for name, make in modes.items():
            torch._dynamo.reset()
            gc.collect()
            fn = make()
            t0 = time.perf_counter()
            for x in lengths:
                fn(x)
            torch.cuda.synchronize()
            print(f"\n== {name}: first calls {time.perf_counter() - t0:.1f} s", flush=True)
            for x in lengths:
                wall, host = timed(fn, x)
                print(f"  len {x.shape[1]}: wall {wall:.2f} ms, host {host:.2f} ms, GPU busy {busy_ms(fn, x):.2f} ms")
            if name != "eager":
                print("  launch paths:", launch_paths())
            x = lengths[1]
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                fn(x)
            torch.cuda.synchronize()
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
            print("\n".join(s.getvalue().splitlines()[:45]))
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumtime").print_stats(18)
            print("\n".join(s.getvalue().splitlines()[:40]))
            del fn


if __name__ == "__main__":
    main()
