"""What runs, and for how long, when brrr's BN statistics are replayed from a CUDA graph?

The layout acceptance times `torch.var_mean(x, dim=(0, 2, 3))` on a [64, 256, 56, 56] bf16 channels_last tensor at
55% of copy (CUDA graph of 10 calls, do_bench with its L2 flush per replay) while torch.profiler's device time of
brrr's two kernels says 81%. Prediction: the graph holds more device work than those two kernels (a fill or a
copy), or the replays of a read-only kernel pay for the flush's dirty lines; the profile of one replay says which.
Control: the same for a plain copy (`x.clone()`) and for eager's and Inductor's var_mean.

    PYTHONPATH=$PWD python3 benchmarks/probes/what_runs_in_column_statistics.py
"""

import torch
import triton

import brrr

N, C, H, W = 64, 256, 56, 56
CALLS = 10


def graph_of(fn, x):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn(x)
    return g


def back_to_back_us(g, reps=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps / CALLS)
    return sorted(times)[len(times) // 2]


def profiled_kernels(g):
    from torch.profiler import ProfilerActivity, profile
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    sums = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name[:70]
            count, us = sums.get(name, (0, 0.0))
            sums[name] = (count + 1, us + e.device_time)
    return sums


def main():
    x = torch.randn(N, C, H, W, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    nbytes = x.numel() * x.element_size()
    from brrr.cost.device import get_ceilings
    bw = get_ceilings(torch.device("cuda")).bandwidth
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; "
          f"copy {bw / 1e9:.0f} GB/s; x {nbytes / 1e6:.1f} MB; floor {nbytes / bw * 1e6:.1f} us")

    def stats(t):
        return torch.var_mean(t, dim=(0, 2, 3), correction=0)

    def copy(t):
        return t.clone()

    fns = {"eager var_mean": stats, "brrr var_mean": brrr.compile(stats),
           "eager clone (reads and writes 2x)": copy, "inductor var_mean": torch.compile(stats)}
    for name, fn in fns.items():
        with torch.no_grad():
            g = graph_of(fn, x)
        flushed = triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median") * 1e3 / CALLS
        plain = back_to_back_us(g)
        kernels = profiled_kernels(g)
        device_us = sum(us for _, us in kernels.values()) / CALLS
        read = nbytes * (2 if "clone" in name else 1)
        print(f"\n{name}: do_bench flushed {flushed:.1f} us ({read / flushed / 1e-6 / bw:.0%} of copy), "
              f"replays back to back {plain:.1f} us ({read / plain / 1e-6 / bw:.0%}), "
              f"profiler device sum {device_us:.1f} us ({read / device_us / 1e-6 / bw:.0%})")
        for k, (count, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
            print(f"    {count:3d} x {us / count:8.1f} us  {k}")


if __name__ == "__main__":
    main()
