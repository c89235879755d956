"""Where does a compiled small train step lose to eager, once its graphs replay from CUDA graphs?

Answer: (not run yet)

The seed MLP (bf16, batch 16384, 1024 wide; Linear -> GELU -> Linear -> LayerNorm), forward and backward with
fixed cotangents, gradients set to None before each step. For each way of running it: the step back to back,
the host time of the forward call and of the backward call with the device idle before each step (a sync), and
the device's busy time per step from the profiler's kernel records.
"""

import copy
import statistics
import sys
import time

import torch

from brrr.bench.backends import resolve_backend
from brrr.examples import mlp


def step_fn(fn, model, x, cot):
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        out = fn(x)
        torch.autograd.backward([out], [cot])
    return step


def back_to_back_us(step, n=300):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def host_split_us(fn, model, x, cot, n=60):
    params = list(model.parameters())
    fwd, bwd, wait = [], [], []
    for _ in range(n):
        for p in params:
            p.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(x)
        t1 = time.perf_counter()
        torch.autograd.backward([out], [cot])
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        fwd.append(t1 - t0), bwd.append(t2 - t1), wait.append(t3 - t2)
    return [statistics.median(v) * 1e6 for v in (fwd, bwd, wait)]


def device_busy_us(step, n=20):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages())   # us, every kernel and copy
    return total / n


def build(base, backend):
    model = copy.deepcopy(base)
    if backend is None:
        return model, model
    return model, torch.compile(model, backend=backend if backend in ("eager", "aot_eager")
                                else resolve_backend(backend))


def inference_host_us(fn, x, n=200):
    """Host time of one no-grad call with the device idle (the device work is queued, not waited for)."""
    times = []
    with torch.no_grad():
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main():
    torch.manual_seed(0)
    base, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384, dim=1024)
    cot = torch.randn_like(x)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rows = [("eager", None), ("dynamo-eager", "eager"), ("aot_eager", "aot_eager"),
            ("brrr-launches", "brrr-launches"), ("brrr", "brrr"), ("brrr-cudagraphs", "brrr-cudagraphs")]
    built = {}
    for label, backend in rows:
        torch._dynamo.reset()
        model, fn = build(base, backend)
        step = step_fn(fn, model, x, cot)
        for _ in range(30):
            step()
        built[label] = (model, fn, step)
    from brrr.compile import replay_choice

    print("brrr's replay decisions:", *replay_choice.DECISIONS, sep="\n  ")
    # no profiler before every timing is done: CUPTI left attached slows a process's later launches
    import triton

    print("back to back, us per step (passes interleaved), then do_bench medians (as the zoo times):")
    for rnd in range(4):
        print("  " + "  ".join(f"{label} {back_to_back_us(step):.0f}" for label, (_, _, step) in built.items()),
              flush=True)
    for rnd in range(3):
        print("  do_bench: " + "  ".join(f"{label} {triton.testing.do_bench(step, warmup=25, rep=300) * 1e3:.0f}"
                                          for label, (_, _, step) in built.items()), flush=True)
    print(f"{'backend':18s} {'fwd host':>9s} {'bwd host':>9s} {'tail wait':>9s}  (device idle before each step)")
    for label, (model, fn, _) in built.items():
        fwd, bwd, wait = host_split_us(fn, model, x, cot)
        print(f"{label:18s} {fwd:9.0f} {bwd:9.0f} {wait:9.0f}", flush=True)
    print("no-grad call, host us (a graph compiled for inference):")
    for label, backend in rows[:2] + rows[4:5]:
        torch._dynamo.reset()
        _, fn = build(base, backend)
        with torch.no_grad():
            for _ in range(30):
                fn(x)
        print(f"  {label}: {inference_host_us(fn, x):.0f}", flush=True)
    with torch.autograd.set_multithreading_enabled(False):
        for label in ("eager", "brrr"):
            model, fn, step = built[label]
            print(f"{label}, backward on the calling thread: {back_to_back_us(step):.0f} us per step", flush=True)
    import cProfile
    import pstats

    model, fn, _ = built["brrr"]
    profiler = cProfile.Profile()
    for _ in range(300):
        for p in model.parameters():
            p.grad = None
        profiler.enable()
        out = fn(x)
        profiler.disable()
        torch.autograd.backward([out], [cot])
    torch.cuda.synchronize()
    print("brrr's forward call (main thread), 300 calls under cProfile, by cumulative time:")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    print("device busy per step (profiler, every kernel and copy):")
    for label, (_, _, step) in built.items():
        print(f"  {label}: {device_busy_us(step):.0f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
