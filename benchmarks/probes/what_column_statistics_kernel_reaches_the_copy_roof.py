"""What partial kernel makes channels_last batch-norm statistics reach 85% of copy bandwidth?

Not run yet. brrr's split column reduction of `var_mean(x, (0, 2, 3))` over a [64, 256, 56, 56] channels_last
bf16 tensor takes ~72 us (47.5% of copy; Inductor 69%), and a sweep of its tile sizes peaked at 63% with no
pattern. This probe times hand-written variants of the partial kernel (the one that reads the 103 MB) side by
side, each with the same second stage, to find the structure that reaches the roof before codegen changes:

- `brrr`: brrr's own compiled var_mean (both kernels), for reference; eager beside it;
- `tile3`: brrr's partial kernel as generated: [XBLOCK channels, RBLOCK rows] tiles of one partition, three
  fp32 accumulators (sum of x - K, of (x - K)^2, and of x), the shift K loaded every iteration;
- `tile2`: the same with two accumulators (the mean is K + sum(x - K) / n) and K loaded once;
- `tile2x2`: `tile2` loading two row blocks per iteration before adding (twice the bytes in flight);
- `rows`: each program reads a contiguous chunk of whole rows ([RBLOCK rows, all C channels]), adds each
  block's column sums into [C] accumulators every iteration;
- `read`: a plain sum of the tensor as one flat row per program (the read roof this machine reaches).

Prediction: the limit is bytes in flight per SM (three [64, 32] fp32 accumulators leave few programs per SM,
and Triton does not pipeline loads that feed no dot); `tile2x2` or `rows` reach >= 80% of copy.

    PYTHONPATH=$PWD python3 benchmarks/probes/what_column_statistics_kernel_reaches_the_copy_roof.py
"""

import sys

import torch
import triton
import triton.language as tl


@triton.jit
def tile3(x_ptr, s_ptr, q_ptr, m_ptr, C: tl.constexpr, ROWS_PER: tl.constexpr, XBLOCK: tl.constexpr,
          RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    part = xindex // C
    c = xindex % C
    a1 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    a2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    a3 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for r0 in range(0, ROWS_PER, RBLOCK):
        r = r0 + tl.arange(0, RBLOCK)[None, :]
        rmask = r < ROWS_PER
        v = tl.load(x_ptr + (r + part * ROWS_PER) * C + c, rmask, other=0).to(tl.float32)
        k = tl.load(x_ptr + c).to(tl.float32)
        d = tl.where(rmask, v - k, 0.0)
        a1 += d
        a2 += d * d
        a3 += v
    tl.store(s_ptr + xindex, tl.sum(a1, 1)[:, None])
    tl.store(q_ptr + xindex, tl.sum(a2, 1)[:, None])
    tl.store(m_ptr + xindex, tl.sum(a3, 1)[:, None])


@triton.jit
def tile2(x_ptr, s_ptr, q_ptr, C: tl.constexpr, ROWS_PER: tl.constexpr, XBLOCK: tl.constexpr,
          RBLOCK: tl.constexpr, UNROLL: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    part = xindex // C
    c = xindex % C
    k = tl.load(x_ptr + c).to(tl.float32)
    base = x_ptr + part * ROWS_PER * C + c
    a1 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    a2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for r0 in range(0, ROWS_PER, RBLOCK * UNROLL):
        r = r0 + tl.arange(0, RBLOCK)[None, :]
        v = tl.load(base + r * C, r < ROWS_PER, other=0).to(tl.float32)
        if UNROLL == 2:
            v2 = tl.load(base + (r + RBLOCK) * C, r + RBLOCK < ROWS_PER, other=0).to(tl.float32)
        d = tl.where(r < ROWS_PER, v - k, 0.0)
        a1 += d
        a2 += d * d
        if UNROLL == 2:
            d2 = tl.where(r + RBLOCK < ROWS_PER, v2 - k, 0.0)
            a1 += d2
            a2 += d2 * d2
    tl.store(s_ptr + xindex, tl.sum(a1, 1)[:, None])
    tl.store(q_ptr + xindex, tl.sum(a2, 1)[:, None])


@triton.jit
def rows(x_ptr, s_ptr, q_ptr, C: tl.constexpr, ROWS_PER: tl.constexpr, RBLOCK: tl.constexpr):
    part = tl.program_id(0)
    c = tl.arange(0, C)[None, :]
    k = tl.load(x_ptr + c).to(tl.float32)
    base = x_ptr + part * ROWS_PER * C + c
    a1 = tl.zeros([C], tl.float32)
    a2 = tl.zeros([C], tl.float32)
    for r0 in range(0, ROWS_PER, RBLOCK):
        r = r0 + tl.arange(0, RBLOCK)[:, None]
        v = tl.load(base + r * C, r < ROWS_PER, other=0).to(tl.float32)
        d = tl.where(r < ROWS_PER, v - k, 0.0)
        a1 += tl.sum(d, 0)
        a2 += tl.sum(d * d, 0)
    cc = tl.arange(0, C)
    tl.store(s_ptr + part * C + cc, a1)
    tl.store(q_ptr + part * C + cc, a2)


@triton.jit
def tile2_staged(x_ptr, s_ptr, q_ptr, C: tl.constexpr, ROWS_PER: tl.constexpr, XBLOCK: tl.constexpr,
                 RBLOCK: tl.constexpr, STAGES: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    part = xindex // C
    c = xindex % C
    k = tl.load(x_ptr + c).to(tl.float32)
    base = x_ptr + part * ROWS_PER * C + c
    a1 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    a2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for r0 in tl.range(0, ROWS_PER, RBLOCK, num_stages=STAGES):
        r = r0 + tl.arange(0, RBLOCK)[None, :]
        v = tl.load(base + r * C, r < ROWS_PER, other=0).to(tl.float32)
        d = tl.where(r < ROWS_PER, v - k, 0.0)
        a1 += d
        a2 += d * d
    tl.store(s_ptr + xindex, tl.sum(a1, 1)[:, None])
    tl.store(q_ptr + xindex, tl.sum(a2, 1)[:, None])


@triton.jit
def oneshot(x_ptr, s_ptr, q_ptr, C: tl.constexpr, ROWS: tl.constexpr, XBLOCK: tl.constexpr,
            RBLOCK: tl.constexpr):
    # program (row block, channel block): one [XBLOCK, RBLOCK] tile, no loop; partials [row blocks, C]
    pr = tl.program_id(0)
    c = tl.program_id(1) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    r = pr * RBLOCK + tl.arange(0, RBLOCK)[None, :]
    k = tl.load(x_ptr + c).to(tl.float32)
    v = tl.load(x_ptr + r * C + c, r < ROWS, other=0).to(tl.float32)
    d = tl.where(r < ROWS, v - k, 0.0)
    tl.store(s_ptr + pr * C + c, tl.sum(d, 1)[:, None])
    tl.store(q_ptr + pr * C + c, tl.sum(d * d, 1)[:, None])


@triton.jit
def read_staged(x_ptr, out_ptr, N: tl.constexpr, PER: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    p = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.range(0, PER, BLOCK, num_stages=STAGES):
        idx = p * PER + i + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + idx, idx < N, other=0).to(tl.float32)
    tl.store(out_ptr + p, tl.sum(acc, 0))


@triton.jit
def read(x_ptr, out_ptr, N: tl.constexpr, PER: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, PER, BLOCK):
        idx = p * PER + i + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + idx, idx < N, other=0).to(tl.float32)
    tl.store(out_ptr + p, tl.sum(acc, 0))


def main():
    from triton.testing import do_bench

    from brrr.cost.device import get_ceilings

    n, c, h, w = 64, 256, 56, 56
    x = torch.randn(n, c, h, w, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    rows_total = n * h * w
    nbytes = x.numel() * 2
    bandwidth = get_ceilings(torch.device("cuda")).bandwidth
    ref_var, ref_mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"{nbytes / 1e6:.1f} MB read; copy {bandwidth / 1e12:.2f} TB/s; fraction = bytes / time / copy")

    def report(name, seconds_ms, check=None):
        frac = nbytes / (seconds_ms * 1e-3) / bandwidth
        print(f"{name:40s} {seconds_ms * 1e3:8.1f} us  {100 * frac:5.1f}% of copy  {check or ''}", flush=True)

    def stats(s, q, parts):
        s = s.view(parts, c).sum(0)
        q = q.view(parts, c).sum(0)
        k = x[0, :, 0, 0].float()
        mean = k + s / rows_total
        var = q / rows_total - (s / rows_total) ** 2
        err = max((mean - ref_mean).abs().max().item(), (var - ref_var).abs().max().item())
        return f"max err {err:.2e}"

    fn = lambda t: torch.var_mean(t, dim=(0, 2, 3), correction=0)
    report("eager var_mean", do_bench(lambda: fn(x), warmup=50, rep=300))
    import brrr
    compiled = brrr.compile(fn)
    compiled(x)
    report("brrr var_mean (both kernels)", do_bench(lambda: compiled(x), warmup=50, rep=300))

    for parts in (256, 512):
        per = rows_total // parts
        s = torch.empty(parts * c, device="cuda")
        q = torch.empty_like(s)
        for xb, rb, warps in ((64, 32, 4), (64, 16, 4), (32, 32, 4), (128, 16, 8)):
            grid = (parts * c // xb,)
            for stages in (1, 2, 3, 4):
                report(f"tile2 staged{stages} P{parts} [{xb},{rb}] w{warps}", do_bench(
                    lambda: tile2_staged[grid](x, s, q, c, per, xb, rb, stages, num_warps=warps), warmup=50,
                    rep=300), stats(s, q, parts))
    for xb, rb, warps in ((64, 64, 4), (64, 128, 4), (64, 128, 8), (128, 64, 8), (256, 32, 8), (256, 64, 8),
                          (32, 256, 8), (64, 256, 8)):
        row_blocks = triton.cdiv(rows_total, rb)
        s = torch.empty(row_blocks * c, device="cuda")
        q = torch.empty_like(s)
        grid = (row_blocks, c // xb)
        report(f"oneshot [{xb},{rb}] w{warps} ({row_blocks} row blocks)", do_bench(
            lambda: oneshot[grid](x, s, q, c, rows_total, xb, rb, num_warps=warps), warmup=50, rep=300),
            stats(s, q, row_blocks))
    flat = x.permute(0, 2, 3, 1).reshape(-1)
    for parts, block, warps in ((1024, 4096, 8), (4096, 2048, 8)):
        out = torch.empty(parts, device="cuda")
        per = triton.cdiv(flat.numel(), parts)
        per = triton.cdiv(per, block) * block
        for stages in (1, 3, 4):
            report(f"read staged{stages} P{parts} B{block} w{warps}", do_bench(
                lambda: read_staged[(parts,)](flat, out, flat.numel(), per, block, stages, num_warps=warps),
                warmup=50, rep=300))
    report("eager sum of the flat tensor (read roof)", do_bench(lambda: flat.sum(), warmup=50, rep=300))
    report("eager sum, fp32 accumulate", do_bench(lambda: flat.sum(dtype=torch.float32), warmup=50, rep=300))
    copy_dst = torch.empty_like(flat)
    report("copy (bytes read only, for scale)", do_bench(lambda: copy_dst.copy_(flat), warmup=50, rep=300))
    return 0


if __name__ == "__main__":
    sys.exit(main())
