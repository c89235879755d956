"""Does a lean ticketed tail hide batch-norm statistics' final kernel on an H100?

Channels_last `var_mean` over [64, 256, 56, 56] bf16 is two kernels in brrr: a partial (shifted sums per chunk
of rows and channel) and a final one combining the chunks, ~2.5 us of latency after a partial that reads at ~90%
of copy. A single kernel whose last program per channel group (by an atomic ticket) combines the partials ran
5.3 us slower than its partial alone in an earlier probe. Suspect: the tail's registers cut the programs resident
per SM, so the grid no longer fits one wave. Here the tail is lean (slabs of RB chunks) and each kernel's
registers and the programs an SM can hold are printed beside its time (CUDA graph of 20 calls, median of 7).
"""

import statistics
import sys

import torch
import triton
import triton.language as tl

N, C, H, W = 64, 256, 56, 56
ROWS = N * H * W


@triton.jit
def partial(in_ptr, sum_ptr, sq_ptr, RN: tl.constexpr, C_: tl.constexpr, XBLOCK: tl.constexpr,
            RBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    groups: tl.constexpr = C_ // XBLOCK
    chan = (pid % groups) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    chunk = pid // groups
    shift = tl.load(in_ptr + chan).to(tl.float32)
    acc1 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    acc2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for r in range(0, RN, RBLOCK):
        rindex = r + tl.arange(0, RBLOCK)[None, :]
        v = tl.load(in_ptr + (rindex + chunk * RN) * C_ + chan).to(tl.float32) - shift
        acc1 += v
        acc2 += v * v
    tl.store(sum_ptr + chunk * C_ + chan, tl.sum(acc1, 1)[:, None])
    tl.store(sq_ptr + chunk * C_ + chan, tl.sum(acc2, 1)[:, None])


@triton.jit
def final(sum_ptr, sq_ptr, in_ptr, var_ptr, mean_ptr, CHUNKS: tl.constexpr, C_: tl.constexpr, COUNT: tl.constexpr,
          XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rindex = tl.arange(0, RBLOCK)[None, :]
    m = rindex < CHUNKS
    s = tl.sum(tl.load(sum_ptr + rindex * C_ + xindex, mask=m, other=0.0), 1)[:, None]
    q = tl.sum(tl.load(sq_ptr + rindex * C_ + xindex, mask=m, other=0.0), 1)[:, None]
    var = tl.maximum(q - s * s / COUNT, 0.0) / COUNT
    tl.store(var_ptr + xindex, var.to(tl.bfloat16))
    shift = tl.load(in_ptr + xindex).to(tl.float32)
    tl.store(mean_ptr + xindex, ((s + shift * COUNT) / COUNT).to(tl.bfloat16))


@triton.jit
def ticketed(in_ptr, sum_ptr, sq_ptr, count_ptr, var_ptr, mean_ptr, RN: tl.constexpr, C_: tl.constexpr,
             CHUNKS: tl.constexpr, COUNT: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
             RB: tl.constexpr, FINAL_ALL: tl.constexpr):
    pid = tl.program_id(0)
    groups: tl.constexpr = C_ // XBLOCK
    group = pid % groups
    chan = group * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    chunk = pid // groups
    shift = tl.load(in_ptr + chan).to(tl.float32)
    acc1 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    acc2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for r in range(0, RN, RBLOCK):
        rindex = r + tl.arange(0, RBLOCK)[None, :]
        v = tl.load(in_ptr + (rindex + chunk * RN) * C_ + chan).to(tl.float32) - shift
        acc1 += v
        acc2 += v * v
    tl.store(sum_ptr + chunk * C_ + chan, tl.sum(acc1, 1)[:, None])
    tl.store(sq_ptr + chunk * C_ + chan, tl.sum(acc2, 1)[:, None])
    tl.debug_barrier()
    if FINAL_ALL:   # one counter: the last program of all combines every channel
        ticket = tl.atomic_add(count_ptr, 1, sem="acq_rel")
        last = ticket == CHUNKS * groups - 1
    else:
        ticket = tl.atomic_add(count_ptr + group, 1, sem="acq_rel")
        last = ticket == CHUNKS - 1
    if last:
        lo = 0 if FINAL_ALL else group * XBLOCK
        width: tl.constexpr = C_ if FINAL_ALL else XBLOCK
        cols = lo + tl.arange(0, width)[None, :]
        s = tl.zeros([RB, width], tl.float32)
        q = tl.zeros([RB, width], tl.float32)
        for k in tl.static_range(0, CHUNKS, RB):
            rows = k + tl.arange(0, RB)[:, None]
            m = rows < CHUNKS
            s += tl.load(sum_ptr + rows * C_ + cols, mask=m, other=0.0, cache_modifier=".cg")
            q += tl.load(sq_ptr + rows * C_ + cols, mask=m, other=0.0, cache_modifier=".cg")
        st = tl.sum(s, 0)[None, :]
        qt = tl.sum(q, 0)[None, :]
        tl.store(var_ptr + cols, (tl.maximum(qt - st * st / COUNT, 0.0) / COUNT).to(tl.bfloat16))
        sh = tl.load(in_ptr + cols).to(tl.float32)
        tl.store(mean_ptr + cols, ((st + sh * COUNT) / COUNT).to(tl.bfloat16))
        if FINAL_ALL:
            tl.atomic_xchg(count_ptr, 0)
        else:
            tl.atomic_xchg(count_ptr + group, 0)


def graph_time(fn, calls=20, reps=7):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def occupancy(kernel, warps):
    regs, shared = kernel.n_regs, kernel.metadata.shared
    by_regs = 65536 // max(1, regs * 32 * warps)
    by_threads = 2048 // (32 * warps)
    by_shared = (228 * 1024) // shared if shared else 99
    return f"{regs} regs, {kernel.n_spills} spills, {shared} B shared: {min(by_regs, by_threads, by_shared, 32)} a SM"


def main():
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", file=sys.stderr)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, C, H, W, device="cuda", generator=g).bfloat16().contiguous(memory_format=torch.channels_last)
    nbytes = x.numel() * 2
    y = torch.empty_like(x)
    copy = graph_time(lambda: y.copy_(x))
    bw = 2 * nbytes / copy * 1e6
    print(f"copy {copy:.1f} us, {bw / 1e9:.0f} GB/s; {sms} SMs; 85% of 3002 GB/s for the statistics: "
          f"{nbytes / (0.85 * 3002e9) * 1e6:.1f} us")
    want_var, want_mean = torch.var_mean(x.double(), dim=(0, 2, 3), correction=0)
    var = torch.empty(C, device="cuda", dtype=torch.bfloat16)
    mean = torch.empty_like(var)

    def report(label, run, kernel=None, warps=None, programs=None, check=True):
        var.fill_(float("nan"))
        mean.fill_(float("nan"))
        try:
            t = graph_time(run)
        except Exception as e:   # noqa: BLE001
            print(f"{label:52s} failed: {type(e).__name__}: {str(e)[:160]}")
            return
        ok = ""
        if check:
            err = max((var.double() - want_var).abs().max().item(), (mean.double() - want_mean).abs().max().item())
            ok = f"  max err {err:.1e}"
        occ = f"  [{occupancy(kernel, warps)}, {programs / sms:.1f} programs a SM]" if kernel is not None else ""
        print(f"{label:52s} {t:6.1f} us  {nbytes / t * 1e-6 / 3002e9 * 1e12:6.1%} of 3002 GB/s{ok}{occ}", flush=True)

    for chunks, xb, rb, warps in ((128, 64, 8, 8), (196, 64, 8, 8), (256, 64, 8, 4), (392, 64, 8, 2),
                                  (512, 64, 8, 2), (196, 32, 16, 4)):
        rn = ROWS // chunks
        programs = chunks * C // xb
        sums = torch.empty(chunks * C, device="cuda")
        sqs = torch.empty_like(sums)
        count = torch.zeros(C // xb, dtype=torch.int32, device="cuda")
        base = f"chunks {chunks:4d} [{xb:3d},{rb:2d}] w{warps}"
        holder = {}

        def alone():
            holder["k"] = partial[(programs,)](x, sums, sqs, RN=rn, C_=C, XBLOCK=xb, RBLOCK=rb, num_warps=warps)

        def pair():
            alone()
            final[(C // 8,)](sums, sqs, x, var, mean, CHUNKS=chunks, C_=C, COUNT=float(ROWS), XBLOCK=8,
                             RBLOCK=triton.next_power_of_2(chunks), num_warps=4)
        report(base + " partial alone", alone, check=False)
        report(base + " pair", pair, holder.get("k"), warps, programs)
        for final_all, tail_rb in ((False, 8), (False, 32), (True, 8)):
            def one(final_all=final_all, tail_rb=tail_rb):
                holder["t"] = ticketed[(programs,)](x, sums, sqs, count, var, mean, RN=rn, C_=C, CHUNKS=chunks,
                                                    COUNT=float(ROWS), XBLOCK=xb, RBLOCK=rb, RB=tail_rb,
                                                    FINAL_ALL=final_all, num_warps=warps)
            one()
            torch.cuda.synchronize()
            left = count.sum().item()
            report(f"{base} ticket, tail RB {tail_rb}{' one counter' if final_all else ''} (left {left})", one,
                   holder.get("t"), warps, programs)


if __name__ == "__main__":
    main()
