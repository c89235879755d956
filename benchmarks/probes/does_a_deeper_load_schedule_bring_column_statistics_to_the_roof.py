"""Does a deeper load schedule bring column statistics to the copy roof?

Compiled for sm_90 on the CPU (nvdisasm), brrr's batch-norm statistics partial ([64 channels, 8 rows] tiles,
4 warps) keeps ~24 bytes of loads in flight per thread; a flat sum of the same bytes, measured at 92-96% of
copy, keeps ~64. A [16 rows, 64 channels] tile written rows-first (one 16-byte load a thread a step, the
pointer advanced rather than recomputed) keeps ~64 as well. Prediction: that tile brings the partial from ~82%
to >= 90% of copy, and the same tile lifts a plain column sum (a bias gradient, [8192, 3072]) likewise.

Run on the GPU machine: PYTHONPATH=$PWD python3 benchmarks/probes/does_a_deeper_load_schedule_bring_column_statistics_to_the_roof.py
"""

import statistics
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _bf16_to_fp32(x):
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def brrr_form(x_ptr, s_ptr, q_ptr, C: tl.constexpr, RN: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    """brrr's generated partial: [channels, rows] tiles over the flattened (chunk, channel) space."""
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    acc1 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    acc2 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    shift = _bf16_to_fp32(tl.load(x_ptr + (xindex % C)))
    for roffset in range(0, RN, RBLOCK):
        rindex = roffset + tl.arange(0, RBLOCK)[None, :]
        d = _bf16_to_fp32(tl.load(x_ptr + ((rindex + (xindex // C) * RN) * C + xindex % C))) - shift
        acc1 = acc1 + d
        acc2 = acc2 + d * d
    tl.store(s_ptr + xindex, tl.sum(acc1, 1)[:, None])
    tl.store(q_ptr + xindex, tl.sum(acc2, 1)[:, None])


@triton.jit
def rows_first(x_ptr, s_ptr, q_ptr, C: tl.constexpr, RN: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
               SQUARES: tl.constexpr):
    """[rows, channels] tiles, channels fastest; the pointer advances a tile a step."""
    pid = tl.program_id(0)
    chunk = pid // (C // XBLOCK)
    ch = (pid % (C // XBLOCK)) * XBLOCK + tl.arange(0, XBLOCK)[None, :]
    rows = tl.arange(0, RBLOCK)[:, None]
    shift = _bf16_to_fp32(tl.load(x_ptr + ch)) if SQUARES else 0.0
    acc1 = tl.zeros([RBLOCK, XBLOCK], tl.float32)
    acc2 = tl.zeros([RBLOCK, XBLOCK], tl.float32)
    ptrs = x_ptr + chunk * RN * C + rows * C + ch
    for r in range(0, RN, RBLOCK):
        d = _bf16_to_fp32(tl.load(ptrs)) - shift
        acc1 += d
        if SQUARES:
            acc2 += d * d
        ptrs += RBLOCK * C
    tl.store(s_ptr + chunk * C + ch, tl.sum(acc1, 0)[None, :])
    if SQUARES:
        tl.store(q_ptr + chunk * C + ch, tl.sum(acc2, 0)[None, :])


@triton.jit
def flat_sum(x_ptr, s_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    base = tl.program_id(0) * N
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, N, BLOCK):
        acc += tl.load(x_ptr + base + i + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(s_ptr + tl.program_id(0), tl.sum(acc, 0))


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


def main():
    import brrr  # noqa: F401  (registers the backend)
    dev = "cuda"
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    x = torch.randn(64, 256, 56, 56, device=dev).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    flat = x.permute(0, 2, 3, 1)   # [64, 56, 56, 256] contiguous memory
    nbytes = x.numel() * 2
    y = torch.empty_like(x)
    copy_us = per_call_us(lambda: y.copy_(x))
    bw = 2 * nbytes / copy_us
    print(f"copy {copy_us:.1f} us, {bw / 1e3:.0f} GB/s; 85% of copy for the read = {nbytes / (0.85 * bw):.1f} us")

    def report(name, us, moved=nbytes):
        print(f"{name:58s} {us:7.1f} us  {moved / us / bw * 100:5.1f}% of copy", flush=True)

    rows, C = 64 * 56 * 56, 256
    stats = brrr.compile(lambda t: torch.var_mean(t, dim=(0, 2, 3), correction=0), cuda_graphs=False)
    stats(x)
    report("brrr var_mean (partial + final)", per_call_us(lambda: stats(x)))
    ind = torch.compile(lambda t: torch.var_mean(t, dim=(0, 2, 3), correction=0), backend="inductor")

    for chunks in (256, 512):
        rn = rows // chunks
        s = torch.empty(chunks * C, device=dev)
        q = torch.empty(chunks * C, device=dev)
        for xb, rb, nw in ((64, 8, 4), (64, 16, 4), (64, 32, 4)):
            grid = (chunks * C // xb,)
            report(f"brrr form [{xb} ch, {rb} rows] {nw}w, {chunks} chunks",
                   per_call_us(lambda: brrr_form[grid](flat, s, q, C, rn, xb, rb, num_warps=nw)))
        for xb, rb, nw in ((64, 8, 4), (64, 16, 4), (64, 16, 2), (32, 16, 2), (64, 32, 4), (64, 32, 8), (128, 16, 4),
                           (128, 16, 8), (256, 16, 8)):
            if rn % rb:
                continue
            grid = (chunks * C // xb,)
            fn = lambda: rows_first[grid](flat, s, q, C, rn, xb, rb, True, num_warps=nw)
            report(f"rows first [{rb} rows, {xb} ch] {nw}w, {chunks} chunks", per_call_us(fn))
        ref_s = (flat.float() - flat[0, 0, 0].float()).reshape(chunks, rn, C).sum(1).flatten()
        torch.cuda.synchronize()
        rows_first[(chunks * C // 64,)](flat, s, q, C, rn, 64, 16, True, num_warps=4)
        print(f"  check [16, 64] sums vs torch: max abs err {(s - ref_s).abs().max().item():.3e}")
    for progs, block, nw in ((512, 4096, 8), (1024, 2048, 4)):
        s = torch.empty(progs, device=dev)
        report(f"flat sum {progs} programs, BLOCK {block}, {nw}w",
               per_call_us(lambda: flat_sum[(progs,)](flat, s, x.numel() // progs, block, num_warps=nw)))

    # a bias gradient's column sum
    g = torch.randn(8192, 3072, device=dev, dtype=torch.bfloat16)
    gbytes = g.numel() * 2
    colsum = brrr.compile(lambda t: t.sum(0), cuda_graphs=False)
    colsum(g)
    report("brrr g.sum(0) [8192, 3072] (partial + final)", per_call_us(lambda: colsum(g)), gbytes)
    for chunks in (16, 32, 64):
        rn = 8192 // chunks
        s = torch.empty(chunks * 3072, device=dev)
        for xb, rb, nw in ((64, 8, 4), (64, 16, 4), (128, 16, 8)):
            grid = (chunks * 3072 // xb,)
            report(f"column sum rows first [{rb}, {xb}] {nw}w, {chunks} chunks",
                   per_call_us(lambda: rows_first[grid](g, s, s, 3072, rn, xb, rb, False, num_warps=nw)), gbytes)
    colsum_ind = torch.compile(lambda t: t.sum(0), backend="inductor")
    ind(x)
    report("inductor var_mean", per_call_us(lambda: ind(x)))
    colsum_ind(g)
    report("inductor g.sum(0)", per_call_us(lambda: colsum_ind(g)), gbytes)


if __name__ == "__main__":
    sys.exit(main())
