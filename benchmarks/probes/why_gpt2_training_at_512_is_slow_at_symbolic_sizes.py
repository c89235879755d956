"""Why is GPT-2's training step at length 512 slower planned at symbolic sizes than Inductor's?

Zoo 0812873 (H200): brrr 15.74 ms (steady 18.63) against Inductor 12.76 (13.86) at 512, where the same symbolic
plan ran 1024 at 20.75. Prediction: the launch-or-replay trial at 512 chose launching (or a replay was refused),
and the launched symbolic step is host-bound.

Per mode (per shape; symbolic) at lengths 256 then 512: 40 steps at 512, then the median step (synchronized),
host time per step, GPU busy time per step, and the replay decisions brrr logged.
"""

import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, "benchmarks/zoo")
from models import gpt2_lengths   # noqa: E402

import brrr   # noqa: E402
from brrr.compile import replay_choice   # noqa: E402


def step(fn, ids):
    fn(ids, ids).backward()


def main():
    work = gpt2_lengths("cuda", torch.bfloat16, quick=False)
    model = work.model
    short, mid = work.shapes[0][1][0], work.shapes[1][1][0]
    modes = (("per shape", False), ("symbolic", True))
    if os.environ.get("PROBE_MODES") == "symbolic":
        modes = modes[1:]
    for name, symbolic in modes:
        torch._dynamo.reset()
        del replay_choice.DECISIONS[:]
        fn = brrr.compile(model, symbolic_sizes=symbolic)
        for ids, n in ((short, 5), (mid, 40)):
            for _ in range(n):
                step(fn, ids)
                model.zero_grad(set_to_none=True)
        walls, hosts = [], []
        for _ in range(15):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(fn, mid)
            model.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
            hosts.append(t1 - t0)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step(fn, mid)
                model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
        busy = sum(e.device_time_total for e in prof.key_averages()
                   if e.device_time_total and not e.key.startswith(("ProfilerStep", "aten::"))) / 5 / 1e3
        walls.sort(), hosts.sort()
        print(f"\n== {name}: step {walls[7] * 1e3:.2f} ms, host {hosts[7] * 1e3:.2f} ms, GPU busy {busy:.2f} ms, "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
        for d in replay_choice.DECISIONS:
            print("  ", d)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            step(fn, mid)
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        prof.disable()
        for key, n in (("tottime", 30), ("cumtime", 45)):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(n)
            print("\n".join(line[:200] for line in out.getvalue().splitlines()[:n + 12]))
        del fn
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
