"""Does an L2 prefetch bring channels_last batch-norm statistics to the read roof?

brrr's partial kernel for `var_mean` over [64, 256, 56, 56] bf16 channels_last ([64 channels, 8 rows] tiles,
4 warps) reads at 82-84% of copy while a flat Triton sum of the same bytes reads at 92-96%: ptxas keeps about 3
loads in flight per thread in the statistics loop against ~9 in the flat sum (NOTES, "What holds column
statistics under the read roof"). A prefetch into L2 needs no register, so a loop that prefetches D steps ahead
keeps D steps of DRAM reads in flight whatever ptxas schedules, and its own loads then hit L2.

Prediction: prefetching 4-8 steps (32-64 rows) ahead brings the partial kernel to >= 90% of copy and the pair
with brrr's final kernel to ~85%; 1-2 steps ahead are too few, 16 too many (L2 thrash, 50 MB L2).

Each kernel is timed by device time (ten calls replayed from a CUDA graph, `brrr.bench.timing.time_graph`).

    PYTHONPATH=$PWD python3 benchmarks/probes/does_an_l2_prefetch_bring_column_statistics_to_the_roof.py
"""

import sys

import torch
import triton
import triton.language as tl

from brrr.bench.timing import time_graph

N, C, H, W = 64, 256, 56, 56
ROWS = N * H * W


@triton.jit
def prefetch_l2(ptr):
    """Asks L2 for the line at each pointer; returns a dummy (the asm has side effects only)."""
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def partial(in_ptr0, out_ptr0, out_ptr1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, RNUMEL: tl.constexpr,
            AHEAD: tl.constexpr, EVERY: tl.constexpr):
    """brrr's generated partial kernel ([XBLOCK channels, RBLOCK rows], rows masked), prefetching the rows AHEAD
    steps on into L2 (AHEAD 0: none). EVERY: prefetch only lanes whose channel is a multiple of EVERY (one
    prefetch per 128-byte line at 64)."""
    rnumel = RNUMEL
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    acc1 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    acc2 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    shift = tl.load(in_ptr0 + (xindex % 256)).to(tl.float32)
    base = in_ptr0 + (xindex // 256) * rnumel * 256 + xindex % 256
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + tl.arange(0, RBLOCK)[None, :]
        rmask = rindex < rnumel
        if AHEAD > 0:
            ahead = tl.minimum(rindex + AHEAD * RBLOCK, rnumel - 1)
            lanes = (xindex % EVERY == 0) & (rindex >= 0)
            dummy = prefetch_l2(tl.where(lanes, base + ahead * 256, base))
        v = tl.load(base + rindex * 256, rmask, other=0).to(tl.float32)
        d = tl.where(rmask, v - shift, 0)
        acc1 = acc1 + d
        acc2 = acc2 + d * d
    tl.store(out_ptr0 + xindex, tl.sum(acc1, 1)[:, None])
    tl.store(out_ptr1 + xindex, tl.sum(acc2, 1)[:, None])


@triton.jit
def final(in_ptr0, in_ptr1, in_ptr2, out_ptr0, out_ptr1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
          CHUNKS: tl.constexpr):
    """brrr's generated final kernel."""
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rindex = tl.arange(0, RBLOCK)[None, :]
    rmask = rindex < CHUNKS
    s = tl.sum(tl.load(in_ptr0 + (rindex * 256 + xindex), rmask, other=0), 1)[:, None]
    q = tl.sum(tl.load(in_ptr1 + (rindex * 256 + xindex), rmask, other=0), 1)[:, None]
    tl.store(out_ptr0 + xindex, (tl.maximum(q - s * s / 200704.0, 0.0) / 200704.0).to(tl.bfloat16))
    shift = tl.load(in_ptr2 + xindex).to(tl.float32)
    tl.store(out_ptr1 + xindex, ((s + shift * 200704.0) / 200704.0).to(tl.bfloat16))


@triton.jit
def flat_sum(x_ptr, out_ptr, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS):
        acc += tl.load(x_ptr + base + i * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    from brrr.cost.device import get_ceilings
    copy_bw = get_ceilings(dev).bandwidth
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}; "
          f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    x4 = torch.randn(N, C, H, W, device=dev).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    x = x4.permute(0, 2, 3, 1).reshape(ROWS, C)
    nbytes = x.numel() * x.element_size()
    ref_var, ref_mean = torch.var_mean(x4.double(), dim=(0, 2, 3), correction=0)
    var = torch.empty(C, dtype=torch.bfloat16, device=dev)
    mean = torch.empty(C, dtype=torch.bfloat16, device=dev)

    def report(label, fn, extra=""):
        ms = time_graph(fn, dev).median_s * 1e3
        print(f"{label:60s} {ms * 1e3:7.1f} us  {100 * nbytes / (ms * 1e-3) / copy_bw:5.1f}% of copy  {extra}",
              flush=True)

    flat, out = x.reshape(-1), torch.empty(1024, device=dev)
    report("flat_sum (the read roof)", lambda: flat_sum[(1024,)](flat, out, BLOCK=1024, ITERS=49, num_warps=8))
    for chunks, xb, rb, warps in [(256, 64, 8, 4), (256, 64, 32, 4), (128, 64, 8, 4)]:
        rn = ROWS // chunks
        ps, pq = torch.empty(chunks * C, device=dev), torch.empty(chunks * C, device=dev)
        grid = (chunks * C // xb,)
        for ahead, every in [(0, 1), (1, 64), (2, 64), (4, 64), (8, 64), (16, 64), (4, 8), (8, 8), (4, 1)]:
            if ahead * rb > rn:
                continue
            part = lambda: partial[grid](x, ps, pq, XBLOCK=xb, RBLOCK=rb, RNUMEL=rn, AHEAD=ahead, EVERY=every,
                                         num_warps=warps)
            fin = lambda: final[(32,)](ps, pq, x, var, mean, XBLOCK=8, RBLOCK=triton.next_power_of_2(chunks),
                                       CHUNKS=chunks, num_warps=4)
            try:
                k = part()
            except Exception as e:
                print(f"chunks {chunks} [{xb}, {rb}] ahead {ahead}: {type(e).__name__}: {str(e)[:200]}")
                continue
            fin()
            torch.cuda.synchronize()
            err = max((var.double() - ref_var).abs().max().item(), (mean.double() - ref_mean).abs().max().item())
            label = f"{chunks} chunks [{xb} ch, {rb} rows] w{warps}, {ahead} steps ahead, every {every}"
            report(label, part, f"{k.n_regs} regs; err {err:.1e}")
            report("   with the final kernel", lambda: (part(), fin()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
