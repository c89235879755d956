"""What brings brrr's column sums to the copy roof? Part 1: do chunks that tile the rows exactly?

A [8192, 3072] bf16 column sum (a bias gradient) compiled by brrr read at 47% of copy on an H200: the split cut
22 chunks of 373 rows, so every load carried a mask and ptxas kept one load in flight; the same tiles over 16
exact chunks of 512 rows read at over 100% (the 50 MB partly in L2 between calls). Prediction: with
`lower.column_chunks` choosing exact chunks, brrr's column sums over [tokens, features] bias gradients reach
>= 85% of copy for every shape whose rows have such a tiling, batch-norm statistics are unchanged (their 256
chunks were exact), and the step (8 or 32 rows) matters less than the mask.

Part 2: column sums over few columns ([8192, 768]: 9.0 us, Inductor 4.9) were split into 32 chunks of 256 rows,
384 [64, 32] programs, so they walked [16, 64] tiles (FEW_PROGRAMS_TILE), a 32-byte sector a load. Prediction:
shorter exact chunks giving >= 768 programs of [64, 32] tiles read 12.6 MB in ~5 us, at Inductor's time.

The first two calls varied the policy by hand (8- or 32-row steps, 64- to 256-row chunks, the few-programs
tile on or off; `results/probes/2026-11-26-h200-e37afd8-do-exact-chunks-bring-column-sums-to-the-roof.log`,
`...-what-brings-small-column-sums-to-the-copy-roof.log`). This version compares `before` (the old count,
chunks of >= 256 rows, masked where inexact) with `shipped` (`lower.column_chunks`), each a fresh brrr compile
in one process, with Inductor after.

Run on the GPU machine: PYTHONPATH=$PWD python3 benchmarks/probes/what_brings_column_sums_to_the_copy_roof.py
"""

import statistics
import sys

import torch


def per_call_us(fn, calls=20, replays=7):
    """Device time of one call: a CUDA graph of `calls` back-to-back calls, replayed, event-timed, median."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def cases(dev):
    bf16 = torch.bfloat16
    out = {}
    for rows, cols in ((8192, 3072), (8192, 2304), (8192, 768), (8192, 1024), (4096, 3072), (12608, 768),
                       (16384, 4096)):
        g = torch.randn(rows, cols, device=dev, dtype=bf16)
        out[f"sum(0) [{rows}, {cols}]"] = (lambda t: t.sum(0), (g,), g.numel() * 2)
    g = torch.randn(8192, 1024, device=dev, dtype=bf16)
    x = torch.randn(8192, 1024, device=dev, dtype=bf16)
    r = torch.rand(8192, 1, device=dev, dtype=torch.float32)
    out["(g * x * rstd).sum(0) [8192, 1024] (RMSNorm weight grad)"] = (
        lambda g, x, r: (g.float() * (x.float() * r)).sum(0), (g, x, r), 2 * g.numel() * 2)
    for shape in ((64, 256, 56, 56), (64, 64, 112, 112), (64, 2048, 7, 7)):
        t = torch.randn(*shape, device=dev).to(bf16).contiguous(memory_format=torch.channels_last)
        out[f"var_mean CL {list(shape)}"] = (lambda t: torch.var_mean(t, dim=(0, 2, 3), correction=0), (t,),
                                             t.numel() * 2)
    return out


def small_cases(dev):
    bf16 = torch.bfloat16
    out = {}
    for rows, cols in ((8192, 768), (8192, 1024), (4096, 768), (12608, 768), (8192, 512)):
        g = torch.randn(rows, cols, device=dev, dtype=bf16)
        out[f"sum(0) [{rows}, {cols}]"] = (lambda t: t.sum(0), (g,), g.numel() * 2)
    g = torch.randn(8192, 768, device=dev, dtype=bf16)
    x = torch.randn(8192, 768, device=dev, dtype=bf16)
    r = torch.rand(8192, 1, device=dev, dtype=torch.float32)
    out["layer norm's weight and bias grads [8192, 768]"] = (
        lambda g, x, r: ((g.float() * (x.float() * r)).sum(0), g.float().sum(0)), (g, x, r), 2 * g.numel() * 2)
    return out


def main():
    import brrr
    from brrr.compile import lower
    import triton
    dev = "cuda"
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    x = torch.empty(1 << 27, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    bw = 2 * x.numel() * 2 / per_call_us(lambda: y.copy_(x))
    print(f"copy {bw / 1e3:.0f} GB/s")
    shipped = lower.column_chunks
    policies = {"before": lambda r, xn, exact=True: shipped(r, xn, exact=False), "shipped": shipped}
    every = {**cases(dev), **small_cases(dev)}
    for name, (fn, args, nbytes) in every.items():
        ref = fn(*[a.double() if a.is_floating_point() else a for a in args])
        line = [f"{name:56s}"]
        for policy, chunks in policies.items():
            lower.column_chunks = chunks
            try:
                f = brrr.compile(fn, cuda_graphs=False)
                got = f(*args)
                err = max((a.double() - b).abs().max().item() for a, b in
                          zip(got if isinstance(got, tuple) else (got,), ref if isinstance(ref, tuple) else (ref,)))
                us = per_call_us(lambda: f(*args))
                line.append(f"{policy}: {us:6.1f} us {nbytes / us / bw * 100:5.1f}% (err {err:.1e})")
            finally:
                lower.column_chunks = shipped
            torch._dynamo.reset()
        print(" | ".join(line), flush=True)
    for name, (fn, args, nbytes) in every.items():
        f = torch.compile(fn, backend="inductor")
        f(*args)
        us = per_call_us(lambda: f(*args))
        print(f"inductor {name:56s} {us:6.1f} us {nbytes / us / bw * 100:5.1f}%", flush=True)


if __name__ == "__main__":
    sys.exit(main())
