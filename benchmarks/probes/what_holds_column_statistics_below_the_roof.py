"""What holds a column reduction (channels_last batch-norm statistics) below the copy roof?

Not yet run. brrr's split column reduction of [64, 256, 56, 56] bf16 channels_last (200704 rows of 256
channels, 102.8 MB) takes 60-77 us whatever its split or tile (results/probes/...-3a65eef-column-tiles.log),
and reading a second input of the same size costs only ~20 us more: so it is not bandwidth that binds it but
latency (too few loads in flight) or a fixed cost (the second kernel, launches). Prediction: the partial
kernel alone runs at ~60% of the roof; a tile with the channels along the fast axis of a [RBLOCK, 256] block
(512 contiguous bytes per row, 16-byte vectors per thread) and two or more row blocks loaded per step reaches
85-90%; the second kernel costs 3-5 us.

Hand-written Triton kernels of the same sums (sum of x - K and of its square, K each channel's first element),
each timed alone by do_bench (median, L2 flushed), and brrr's own two kernels through torch.profiler:
- "brrr-like": [XBLOCK channels, RBLOCK rows] tiles, channels on axis 0 (brrr's shape), per-chunk partials;
- "rows-major": [RBLOCK rows, XBLOCK channels] tiles, channels on axis 1, UNROLL row blocks per step.

    PYTHONPATH=$PWD python3 benchmarks/probes/what_holds_column_statistics_below_the_roof.py
"""

import sys

import torch
import triton
import triton.language as tl

ROWS, COLS = 64 * 56 * 56, 256


@triton.jit
def brrr_like(x_ptr, s_ptr, q_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, CHUNK: tl.constexpr,
              XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cblocks: tl.constexpr = COLS // XBLOCK
    chunk, cb = pid // cblocks, pid % cblocks
    cols = cb * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    k = tl.load(x_ptr + cols).to(tl.float32)
    acc1 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    acc2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for r0 in range(0, CHUNK, RBLOCK):
        rows = chunk * CHUNK + r0 + tl.arange(0, RBLOCK)[None, :]
        m = (r0 + tl.arange(0, RBLOCK)[None, :] < CHUNK) & (rows < ROWS)
        d = tl.where(m, tl.load(x_ptr + rows * COLS + cols, mask=m, other=0).to(tl.float32) - k, 0.0)
        acc1 += d
        acc2 += d * d
    tl.store(s_ptr + chunk * COLS + cols, tl.sum(acc1, 1)[:, None])
    tl.store(q_ptr + chunk * COLS + cols, tl.sum(acc2, 1)[:, None])


@triton.jit
def rows_major(x_ptr, s_ptr, q_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, CHUNK: tl.constexpr,
               XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    cblocks: tl.constexpr = COLS // XBLOCK
    chunk, cb = pid // cblocks, pid % cblocks
    cols = cb * XBLOCK + tl.arange(0, XBLOCK)[None, :]
    k = tl.load(x_ptr + cols).to(tl.float32)
    acc1 = tl.zeros([RBLOCK, XBLOCK], tl.float32)
    acc2 = tl.zeros([RBLOCK, XBLOCK], tl.float32)
    for r0 in range(0, CHUNK, RBLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            rel = r0 + u * RBLOCK + tl.arange(0, RBLOCK)[:, None]
            rows = chunk * CHUNK + rel
            m = (rel < CHUNK) & (rows < ROWS)
            d = tl.where(m, tl.load(x_ptr + rows * COLS + cols, mask=m, other=0).to(tl.float32) - k, 0.0)
            acc1 += d
            acc2 += d * d
    tl.store(s_ptr + chunk * COLS + cols, tl.sum(acc1, 0)[None, :])
    tl.store(q_ptr + chunk * COLS + cols, tl.sum(acc2, 0)[None, :])


def main():
    from triton.testing import do_bench

    from brrr.cost.device import get_ceilings

    dev = torch.device("cuda")
    bandwidth = get_ceilings(dev).bandwidth
    x = torch.randn(ROWS, COLS, device=dev).bfloat16()
    nbytes = x.numel() * 2
    ref = x.float() - x[:1].float()
    ref_s = ref.sum(0)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s; roof for {nbytes / 1e6:.1f} MB: {nbytes / bandwidth * 1e6:.1f} us")

    def report(name, fn, s):
        ms = do_bench(fn, warmup=25, rep=200)
        err = ((s.sum(0) - ref_s).abs().max() / ref_s.abs().max()).item()
        print(f"{name:58s} {ms * 1e3:7.1f} us  {100 * nbytes / (ms * 1e-3) / bandwidth:5.1f}% of copy  "
              f"rel err {err:.1e}", flush=True)

    for chunks in (256, 512, 1024):
        chunk = -(-ROWS // chunks)
        s = torch.empty(chunks, COLS, device=dev)
        q = torch.empty_like(s)
        for xb, rb, warps in ((64, 32, 4), (64, 64, 8)):
            grid = (chunks * COLS // xb,)
            report(f"brrr-like chunks {chunks} [{xb} ch, {rb} rows] w{warps}",
                   lambda: brrr_like[grid](x, s, q, ROWS, COLS, chunk, xb, rb, num_warps=warps), s)
        for xb, rb, unroll, warps in ((256, 8, 1, 4), (256, 16, 1, 4), (256, 16, 2, 4), (256, 32, 1, 8),
                                      (256, 16, 4, 8), (128, 32, 1, 4), (128, 32, 2, 4), (64, 64, 2, 4)):
            grid = (chunks * COLS // xb,)
            report(f"rows-major chunks {chunks} [{rb} rows x{unroll}, {xb} ch] w{warps}",
                   lambda: rows_major[grid](x, s, q, ROWS, COLS, chunk, xb, rb, unroll, num_warps=warps), s)

    # brrr's own kernels, by name, through the profiler
    import brrr
    xc = x.view(64, 56, 56, 256).permute(0, 3, 1, 2)   # [64, 256, 56, 56] channels_last
    f = brrr.compile(lambda t: torch.var_mean(t, dim=(0, 2, 3), correction=0), cuda_graphs=False)
    for _ in range(3):
        f(xc)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            f(xc)
        torch.cuda.synchronize()
    for evt in prof.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CUDA or "brrr" in evt.key:
            print(f"brrr kernel {evt.key[:50]:50s} {evt.device_time_total / max(evt.count, 1):7.1f} us x{evt.count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
