"""What partial kernel brings channels_last batch-norm statistics to 85% of copy bandwidth?

`var_mean(x, (0, 2, 3))` over [64, 256, 56, 56] bf16 channels_last reads 102.8 MB: a [200704, 256] row-major
matrix reduced over its rows. brrr's two kernels ran at ~71% of copy on an H200 (partial 31.1 us, final 2.4 us;
NOTES, "What runs when brrr's BN statistics replay?"). The issue asks 85%: 28.5 us at 4.25 TB/s.

Prediction: the partial kernel is short of bytes in flight and runs 1.3 waves: 1024 programs of [64 channels,
32 rows] with two [64, 32] fp32 accumulators, its register use allowing ~6 programs per SM, so a second, mostly
empty wave follows the first. Chunks chosen for whole waves, or tiles of all 256 channels and fewer, longer
programs, reach >= 90% of copy for the partial; a read-only flat sum in Triton reaches >= copy bandwidth (reads
alone turn the bus around less than a copy does), so the roof is not the limit.

Each candidate is timed by device time: ten calls captured in a CUDA graph, the replays timed by do_bench
(`brrr.bench.timing.time_graph`; no host work; the tensor is twice the L2). Printed beside: registers per thread
and spills, the grid, the share of copy bandwidth.

    PYTHONPATH=$PWD python3 benchmarks/probes/what_partial_kernel_reaches_the_read_roof.py
"""

import sys

import torch
import triton
import triton.language as tl

from brrr.bench.timing import time_graph

N, C, H, W = 64, 256, 56, 56
ROWS = N * H * W


@triton.jit
def flat_sum(x_ptr, out_ptr, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS):
        acc += tl.load(x_ptr + base + i * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


@triton.jit
def brrr_partial(in_ptr0, out_ptr0, out_ptr1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, RNUMEL: tl.constexpr):
    """brrr's generated partial kernel (channels on axis 0, rows on axis 1; at 3a9c5c3 RNUMEL 784, [64, 32])."""
    xnumel = 256 * (200704 // RNUMEL)
    rnumel = RNUMEL
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    acc1 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    acc2 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    tmp4 = tl.load(in_ptr0 + (xindex % 256)).to(tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + tl.arange(0, RBLOCK)[None, :]
        rmask = rindex < rnumel
        tmp3 = tl.load(in_ptr0 + ((rindex + (xindex // 256) * rnumel) * 256 + xindex % 256), rmask,
                       other=0).to(tl.float32)
        tmp5 = tmp3 - tmp4
        tmp6 = tl.where(rmask, tmp5, 0)
        acc1 = acc1 + tmp6
        acc2 = acc2 + tmp6 * tmp6
    tl.store(out_ptr0 + (xindex), tl.sum(acc1, 1)[:, None])
    tl.store(out_ptr1 + (xindex), tl.sum(acc2, 1)[:, None])


@triton.jit
def brrr_final(in_ptr0, in_ptr1, in_ptr2, out_ptr0, out_ptr1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
               CHUNKS: tl.constexpr):
    """brrr's generated final kernel (256 chunks at 3a9c5c3), the chunk count a constexpr."""
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    rindex = tl.arange(0, RBLOCK)[None, :]
    rmask = rindex < CHUNKS
    tmp3 = tl.sum(tl.load(in_ptr0 + (rindex * 256 + xindex), rmask, other=0), 1)[:, None]
    tmp6 = tl.sum(tl.load(in_ptr1 + (rindex * 256 + xindex), rmask, other=0), 1)[:, None]
    tmp10 = tl.maximum(tmp6 - tmp3 * tmp3 / 200704.0, 0.0)
    tl.store(out_ptr0 + (xindex), (tmp10 / 200704.0).to(tl.bfloat16))
    tmp13 = tl.load(in_ptr2 + (xindex)).to(tl.float32)
    tl.store(out_ptr1 + (xindex), ((tmp3 + tmp13 * 200704.0) / 200704.0).to(tl.bfloat16))


@triton.jit
def flat_unrolled(x_ptr, shift_ptr, psum_ptr, psq_ptr, C: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                  U: tl.constexpr):
    """partial_flat issuing U independent loads per step before using any (U in 1, 2, 4)."""
    chunk = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    shift = tl.load(shift_ptr + offs % C).to(tl.float32)
    base = x_ptr + chunk.to(tl.int64) * (BLOCK * ITERS) + offs
    acc = tl.zeros([BLOCK], tl.float32)
    acc2 = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS // U):
        p = base + i * (U * BLOCK)
        v0 = tl.load(p)
        if U > 1:
            v1 = tl.load(p + BLOCK)
        if U > 2:
            v2 = tl.load(p + 2 * BLOCK)
            v3 = tl.load(p + 3 * BLOCK)
        if U > 4:
            v4 = tl.load(p + 4 * BLOCK)
            v5 = tl.load(p + 5 * BLOCK)
            v6 = tl.load(p + 6 * BLOCK)
            v7 = tl.load(p + 7 * BLOCK)
        d = v0.to(tl.float32) - shift
        acc += d
        acc2 += d * d
        if U > 1:
            d = v1.to(tl.float32) - shift
            acc += d
            acc2 += d * d
        if U > 2:
            d = v2.to(tl.float32) - shift
            acc += d
            acc2 += d * d
            d = v3.to(tl.float32) - shift
            acc += d
            acc2 += d * d
        if U > 4:
            d = v4.to(tl.float32) - shift
            acc += d
            acc2 += d * d
            d = v5.to(tl.float32) - shift
            acc += d
            acc2 += d * d
            d = v6.to(tl.float32) - shift
            acc += d
            acc2 += d * d
            d = v7.to(tl.float32) - shift
            acc += d
            acc2 += d * d
    cols = tl.arange(0, C)
    tl.store(psum_ptr + chunk * C + cols, tl.sum(tl.reshape(acc, (BLOCK // C, C)), 0))
    tl.store(psq_ptr + chunk * C + cols, tl.sum(tl.reshape(acc2, (BLOCK // C, C)), 0))


@triton.jit
def flat_tma(x_desc, shift_ptr, psum_ptr, psq_ptr, C: tl.constexpr, RB: tl.constexpr, ITERS: tl.constexpr,
             STAGES: tl.constexpr):
    """A chunk of ITERS * RB whole rows read through a TMA descriptor in [RB, C] tiles, the loop pipelined
    STAGES deep (the copy engine keeps tiles in flight in shared memory, not in registers)."""
    chunk = tl.program_id(0)
    cols = tl.arange(0, C)
    shift = tl.load(shift_ptr + cols).to(tl.float32)[None, :]
    acc = tl.zeros([RB, C], tl.float32)
    acc2 = tl.zeros([RB, C], tl.float32)
    first = chunk * (ITERS * RB)
    for i in tl.range(ITERS, num_stages=STAGES):
        d = x_desc.load([first + i * RB, 0]).to(tl.float32) - shift
        acc += d
        acc2 += d * d
    tl.store(psum_ptr + chunk * C + cols, tl.sum(acc, 0))
    tl.store(psq_ptr + chunk * C + cols, tl.sum(acc2, 0))


@triton.jit
def tile_unrolled(in_ptr0, out_ptr0, out_ptr1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, RNUMEL: tl.constexpr,
                  U: tl.constexpr):
    """brrr_partial issuing U independent [XBLOCK, RBLOCK] loads per step (rows masked, as brrr generates)."""
    rnumel = RNUMEL
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    acc1 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    acc2 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    tmp4 = tl.load(in_ptr0 + (xindex % 256)).to(tl.float32)
    base = in_ptr0 + (xindex // 256) * rnumel * 256 + xindex % 256
    for roffset in range(0, rnumel, U * RBLOCK):
        r0 = roffset + tl.arange(0, RBLOCK)[None, :]
        v0 = tl.load(base + r0 * 256, r0 < rnumel, other=0)
        if U > 1:
            v1 = tl.load(base + (r0 + RBLOCK) * 256, r0 + RBLOCK < rnumel, other=0)
        if U > 2:
            v2 = tl.load(base + (r0 + 2 * RBLOCK) * 256, r0 + 2 * RBLOCK < rnumel, other=0)
            v3 = tl.load(base + (r0 + 3 * RBLOCK) * 256, r0 + 3 * RBLOCK < rnumel, other=0)
        d = tl.where(r0 < rnumel, v0.to(tl.float32) - tmp4, 0)
        acc1 += d
        acc2 += d * d
        if U > 1:
            d = tl.where(r0 + RBLOCK < rnumel, v1.to(tl.float32) - tmp4, 0)
            acc1 += d
            acc2 += d * d
        if U > 2:
            d = tl.where(r0 + 2 * RBLOCK < rnumel, v2.to(tl.float32) - tmp4, 0)
            acc1 += d
            acc2 += d * d
            d = tl.where(r0 + 3 * RBLOCK < rnumel, v3.to(tl.float32) - tmp4, 0)
            acc1 += d
            acc2 += d * d
    tl.store(out_ptr0 + (xindex), tl.sum(acc1, 1)[:, None])
    tl.store(out_ptr1 + (xindex), tl.sum(acc2, 1)[:, None])


@triton.jit
def flat_ticket_partials(x_ptr, shift_ptr, psum_ptr, psq_ptr, count_ptr, var_ptr, mean_ptr, chunks, n,
                         C: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr, U: tl.constexpr,
                         RB: tl.constexpr):
    """flat_unrolled's partials stored plainly; the last program to take a ticket reduces them (RB chunks a
    step) and computes var and mean, then zeroes the counter."""
    chunk = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    shift = tl.load(shift_ptr + offs % C).to(tl.float32)
    base = x_ptr + chunk.to(tl.int64) * (BLOCK * ITERS) + offs
    acc = tl.zeros([BLOCK], tl.float32)
    acc2 = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS // U):
        p = base + i * (U * BLOCK)
        v0 = tl.load(p)
        v1 = tl.load(p + BLOCK)
        d = v0.to(tl.float32) - shift
        acc += d
        acc2 += d * d
        d = v1.to(tl.float32) - shift
        acc += d
        acc2 += d * d
    cols = tl.arange(0, C)
    tl.store(psum_ptr + chunk * C + cols, tl.sum(tl.reshape(acc, (BLOCK // C, C)), 0))
    tl.store(psq_ptr + chunk * C + cols, tl.sum(tl.reshape(acc2, (BLOCK // C, C)), 0))
    tl.debug_barrier()
    ticket = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    if ticket == chunks - 1:
        s = tl.zeros([RB, C], tl.float32)
        q = tl.zeros([RB, C], tl.float32)
        for r in range(0, chunks, RB):
            rows = r + tl.arange(0, RB)[:, None]
            s += tl.load(psum_ptr + rows * C + cols[None, :], rows < chunks, other=0, cache_modifier=".cg")
            q += tl.load(psq_ptr + rows * C + cols[None, :], rows < chunks, other=0, cache_modifier=".cg")
        total = tl.sum(s, 0)
        mean = total / n
        tl.store(var_ptr + cols, tl.maximum(tl.sum(q, 0) / n - mean * mean, 0.0).to(tl.bfloat16))
        tl.store(mean_ptr + cols, (mean + tl.load(shift_ptr + cols).to(tl.float32)).to(tl.bfloat16))
        tl.atomic_xchg(count_ptr, 0)


def device_time(fn):
    """ms per call: ten calls replayed from a CUDA graph (brrr.bench.timing.time_graph's median)."""
    return time_graph(fn, "cuda").median_s * 1e3


def regs(compiled):
    try:
        return f"{compiled.n_regs:3d} regs, {compiled.n_spills} spills"
    except Exception:
        return "regs ?"


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    from brrr.cost.device import get_ceilings
    copy_bw = get_ceilings(dev).bandwidth
    props = torch.cuda.get_device_properties(dev)
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}; "
          f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    x4 = torch.randn(N, C, H, W, device=dev).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    x = x4.permute(0, 2, 3, 1).reshape(ROWS, C)        # the same memory, rows x channels
    nbytes = x.numel() * x.element_size()
    shift = x[0].contiguous()
    ref_var, ref_mean = torch.var_mean(x4.double(), dim=(0, 2, 3), correction=0)
    var = torch.empty(C, dtype=torch.bfloat16, device=dev)
    mean = torch.empty(C, dtype=torch.bfloat16, device=dev)

    def report(label, ms, extra=""):
        share = nbytes / (ms * 1e-3) / copy_bw
        print(f"{label:66s} {ms * 1e3:7.1f} us  {100 * share:5.1f}% of copy  {extra}", flush=True)
        return share

    def err():
        torch.cuda.synchronize()
        return max((var.double() - ref_var).abs().max().item(), (mean.double() - ref_mean).abs().max().item())

    flat = x.reshape(-1)
    out = torch.empty(1024, device=dev)
    report("flat_sum BLOCK 1024 ITERS 49 warps 8 (the read roof, last run 92.7%)",
           device_time(lambda: flat_sum[(1024,)](flat, out, BLOCK=1024, ITERS=49, num_warps=8)))
    print("-- brrr's kernels as generated (256 chunks, [64, 32]), and with U loads a step")
    for chunks, xb, rb, warps, u in [(256, 64, 32, 4, 1), (256, 64, 8, 4, 1), (256, 64, 8, 4, 2), (256, 32, 8, 2, 1),
                                     (256, 32, 16, 4, 1), (256, 32, 16, 2, 1), (256, 64, 8, 2, 1), (256, 64, 4, 2, 1),
                                     (128, 64, 8, 4, 1), (1024, 64, 8, 4, 1)]:
        rn = ROWS // chunks
        ps = torch.empty(chunks * C, device=dev)
        pq = torch.empty(chunks * C, device=dev)
        grid = (chunks * C // xb,)
        part = lambda: tile_unrolled[grid](x, ps, pq, XBLOCK=xb, RBLOCK=rb, RNUMEL=rn, U=u, num_warps=warps)
        rblock = triton.next_power_of_2(chunks)
        fin = lambda: brrr_final[(32,)](ps, pq, shift, var, mean, XBLOCK=8, RBLOCK=rblock, CHUNKS=chunks,
                                        num_warps=4 if 8 * rblock <= 2048 else 8)
        k = part()
        fin()
        e = err()
        report(f"tile, {chunks} chunks of {rn} rows, [{xb} ch, {rb} rows] x U {u}, w{warps}", device_time(part),
               f"{regs(k)}; err {e:.1e}")
        report("   the pair", device_time(lambda: (part(), fin())))
    print("-- flat partials, U loads a step")
    for block, iters, warps, u in [(1024, 98, 8, 2), (1024, 196, 8, 4), (1024, 392, 8, 8), (1024, 196, 8, 8),
                                   (1024, 392, 4, 8), (2048, 196, 8, 4), (2048, 392, 16, 8), (2048, 196, 16, 4),
                                   (2048, 196, 8, 8), (512, 392, 4, 8), (512, 784, 4, 8), (4096, 196, 16, 4)]:
        chunks = flat.numel() // (block * iters)
        ps = torch.empty(chunks * C, device=dev)
        pq = torch.empty(chunks * C, device=dev)
        part = lambda: flat_unrolled[(chunks,)](flat, shift, ps, pq, C=C, BLOCK=block, ITERS=iters, U=u,
                                                num_warps=warps)
        rblock = triton.next_power_of_2(chunks)
        fin = lambda: brrr_final[(32,)](ps, pq, shift, var, mean, XBLOCK=8, RBLOCK=rblock, CHUNKS=chunks,
                                        num_warps=4 if 8 * rblock <= 2048 else 8)
        k = part()
        fin()
        e = err()
        report(f"flat BLOCK {block} ITERS {iters} U {u} w{warps} ({chunks} chunks)", device_time(part),
               f"{regs(k)}; err {e:.1e}")
        report("   with brrr's final", device_time(lambda: (part(), fin())))
        fin64 = lambda: brrr_final[(64,)](ps, pq, shift, var, mean, XBLOCK=4, RBLOCK=rblock, CHUNKS=chunks,
                                          num_warps=4 if 4 * rblock <= 2048 else 8)
        report("   with a final of 64 programs", device_time(lambda: (part(), fin64())))
    print("-- TMA-pipelined partials")
    from triton.tools.tensor_descriptor import TensorDescriptor
    for rb, iters, warps, stages in [(8, 98, 4, 3), (8, 98, 4, 4), (16, 49, 4, 3), (16, 49, 8, 4), (8, 196, 4, 4),
                                     (16, 98, 8, 4), (4, 196, 4, 6), (32, 49, 8, 3)]:
        chunks = ROWS // (rb * iters)
        ps = torch.empty(chunks * C, device=dev)
        pq = torch.empty(chunks * C, device=dev)
        desc = TensorDescriptor.from_tensor(x, [rb, C])
        part = lambda: flat_tma[(chunks,)](desc, shift, ps, pq, C=C, RB=rb, ITERS=iters, STAGES=stages,
                                           num_warps=warps)
        rblock = triton.next_power_of_2(chunks)
        fin = lambda: brrr_final[(32,)](ps, pq, shift, var, mean, XBLOCK=8, RBLOCK=rblock, CHUNKS=chunks,
                                        num_warps=4 if 8 * rblock <= 2048 else 8)
        try:
            k = part()
        except Exception as ex:
            print(f"tma RB {rb} ITERS {iters} w{warps} s{stages}: {type(ex).__name__}: {str(ex)[:150]}")
            continue
        fin()
        e = err()
        report(f"tma [{rb}, {C}] ITERS {iters} w{warps} s{stages} ({chunks} chunks)", device_time(part),
               f"{regs(k)}; err {e:.1e}")
        report("   with brrr's final", device_time(lambda: (part(), fin())))
    print("-- one kernel: partials stored, the last program's ticket reduces them")
    count = torch.zeros(1, dtype=torch.int32, device=dev)
    for block, iters, warps, rb in [(2048, 196, 16, 64), (1024, 196, 8, 32)]:
        chunks = flat.numel() // (block * iters)
        ps = torch.empty(chunks * C, device=dev)
        pq = torch.empty(chunks * C, device=dev)
        one = lambda: flat_ticket_partials[(chunks,)](flat, shift, ps, pq, count, var, mean, chunks, ROWS, C=C,
                                                      BLOCK=block, ITERS=iters, U=2, RB=rb, num_warps=warps)
        var.zero_()
        k = one()
        e = err()
        one()
        e2 = err()
        report(f"ticket BLOCK {block} ITERS {iters} U 2 w{warps} RB {rb} ({chunks} chunks)", device_time(one),
               f"{regs(k)}; err {e:.1e}, again {e2:.1e}; count left {count.item()}")
    print("-- eager's var_mean")
    report("torch.var_mean(x4, (0, 2, 3))", device_time(lambda: torch.var_mean(x4, dim=(0, 2, 3), correction=0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
