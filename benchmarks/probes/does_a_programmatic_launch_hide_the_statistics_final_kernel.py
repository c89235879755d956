"""Does a programmatic dependent launch hide batch-norm statistics' final kernel, and which partial tile is
fastest on an H100?

Channels_last `var_mean` over [64, 256, 56, 56] bf16 is two kernels in brrr: a partial (shifted sum and sum of
squares per chunk of rows and channel) and a final one combining the chunks. Mirrors of both are timed here from a
CUDA graph of 20 calls (median of 7 replays), the final kernel launched plainly or with `launch_pdl` (it waits in
`gdc_wait`; the partial lets dependents launch from its start), over chunk counts and partial tiles.
"""

import statistics
import sys

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:   # an older Triton
    gdc_launch_dependents = gdc_wait = None

N, C, H, W = 64, 256, 56, 56
ROWS = N * H * W


@triton.jit
def partial(in_ptr, sum_ptr, sq_ptr, RN: tl.constexpr, C_: tl.constexpr, XBLOCK: tl.constexpr,
            RBLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    chan = xindex % C_
    chunk = xindex // C_
    shift = tl.load(in_ptr + chan).to(tl.float32)
    acc1 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    acc2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for r in range(0, RN, RBLOCK):
        rindex = r + tl.arange(0, RBLOCK)[None, :]
        v = tl.load(in_ptr + (rindex + chunk * RN) * C_ + chan).to(tl.float32) - shift
        acc1 += v
        acc2 += v * v
    tl.store(sum_ptr + xindex, tl.sum(acc1, 1)[:, None])
    tl.store(sq_ptr + xindex, tl.sum(acc2, 1)[:, None])


@triton.jit
def final(sum_ptr, sq_ptr, in_ptr, var_ptr, mean_ptr, CHUNKS: tl.constexpr, C_: tl.constexpr, COUNT: tl.constexpr,
          XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
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
             RB: tl.constexpr):
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    chan = xindex % C_
    chunk = xindex // C_
    shift = tl.load(in_ptr + chan).to(tl.float32)
    acc1 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    acc2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for r in range(0, RN, RBLOCK):
        rindex = r + tl.arange(0, RBLOCK)[None, :]
        v = tl.load(in_ptr + (rindex + chunk * RN) * C_ + chan).to(tl.float32) - shift
        acc1 += v
        acc2 += v * v
    tl.store(sum_ptr + xindex, tl.sum(acc1, 1)[:, None])
    tl.store(sq_ptr + xindex, tl.sum(acc2, 1)[:, None])
    group = pid % (C_ // XBLOCK)
    tl.debug_barrier()
    ticket = tl.atomic_add(count_ptr + group, 1, sem="acq_rel")
    if ticket == CHUNKS - 1:
        cols = group * XBLOCK + tl.arange(0, XBLOCK)[None, :]
        s = tl.zeros([RB, XBLOCK], tl.float32)
        q = tl.zeros([RB, XBLOCK], tl.float32)
        for r in range(0, CHUNKS, RB):
            rows = r + tl.arange(0, RB)[:, None]
            m = rows < CHUNKS
            s += tl.load(sum_ptr + rows * C_ + cols, mask=m, other=0.0, cache_modifier=".cg")
            q += tl.load(sq_ptr + rows * C_ + cols, mask=m, other=0.0, cache_modifier=".cg")
        st = tl.sum(s, 0)[None, :]
        qt = tl.sum(q, 0)[None, :]
        var = tl.maximum(qt - st * st / COUNT, 0.0) / COUNT
        tl.store(var_ptr + cols, var.to(tl.bfloat16))
        sh = tl.load(in_ptr + cols).to(tl.float32)
        tl.store(mean_ptr + cols, ((st + sh * COUNT) / COUNT).to(tl.bfloat16))
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


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, file=sys.stderr)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, C, H, W, device="cuda", generator=g).bfloat16().contiguous(memory_format=torch.channels_last)
    nbytes = x.numel() * 2
    y = torch.empty_like(x)
    copy = graph_time(lambda: y.copy_(x))
    bw = 2 * nbytes / copy * 1e6
    print(f"copy {copy:.1f} us, {bw / 1e9:.0f} GB/s; 85% of copy for the statistics: {nbytes / (0.85 * bw) * 1e6:.1f} us")
    flat = x.permute(0, 2, 3, 1).reshape(-1)
    fsum = graph_time(lambda: flat.sum(dtype=torch.float32))
    print(f"torch flat sum {fsum:.1f} us ({nbytes / fsum * 1e-6 / bw * 1e12:.1%} of copy)")
    want_var, want_mean = torch.var_mean(x.double(), dim=(0, 2, 3), correction=0)
    var = torch.empty(C, device="cuda", dtype=torch.bfloat16)
    mean = torch.empty_like(var)

    def pair(chunks, xb, rb, warps, pdl, fin=(8, 4), alone=False):
        rn = ROWS // chunks
        sums = torch.empty(chunks * C, device="cuda")
        sqs = torch.empty_like(sums)
        fx, fw = fin

        def run():
            partial[(chunks * C // xb,)](x, sums, sqs, RN=rn, C_=C, XBLOCK=xb, RBLOCK=rb, PDL=pdl, num_warps=warps)
            if not alone:
                final[(C // fx,)](sums, sqs, x, var, mean, CHUNKS=chunks, C_=C, COUNT=float(ROWS), XBLOCK=fx,
                                  RBLOCK=triton.next_power_of_2(chunks), PDL=pdl, num_warps=fw,
                                  **({"launch_pdl": True} if pdl else {}))
        return run

    def report(label, run, check=True):
        try:
            t = graph_time(run)
        except Exception as e:   # noqa: BLE001
            print(f"{label:48s} failed: {type(e).__name__}: {str(e)[:120]}")
            return
        ok = ""
        if check:
            err = max((var.double() - want_var).abs().max().item(), (mean.double() - want_mean).abs().max().item())
            ok = f"  max err {err:.1e}"
        print(f"{label:48s} {t:6.1f} us  {nbytes / t * 1e-6 / bw * 1e12:6.1%} of copy{ok}", flush=True)

    tiles = [(64, 8, 4), (64, 8, 2), (32, 16, 4), (64, 16, 4), (128, 8, 4), (64, 4, 2), (32, 8, 2), (128, 4, 4),
             (256, 4, 4), (64, 8, 8)]
    for chunks in (256, 128, 392, 512, 196, 784):
        if ROWS % chunks:
            continue
        for xb, rb, warps in tiles:
            if (ROWS // chunks) % rb:
                continue
            base = f"chunks {chunks:4d} [{xb:3d},{rb:2d}] w{warps}"
            report(base + " partial alone", pair(chunks, xb, rb, warps, False, alone=True), check=False)
            if (xb, rb, warps) in ((64, 8, 4), (64, 8, 2), (128, 8, 4)):
                report(base + " pair", pair(chunks, xb, rb, warps, False))
                if gdc_wait is not None:
                    report(base + " pair, PDL", pair(chunks, xb, rb, warps, True))
    for chunks, xb, rb, warps in ((256, 64, 8, 4), (256, 64, 8, 2), (392, 64, 8, 2), (392, 64, 8, 4),
                                  (128, 64, 8, 8), (196, 32, 16, 4), (196, 64, 8, 8), (512, 64, 8, 2),
                                  (256, 32, 16, 4), (196, 64, 16, 4)):
        rn = ROWS // chunks
        sums = torch.empty(chunks * C, device="cuda")
        sqs = torch.empty_like(sums)
        count = torch.zeros(C // xb, dtype=torch.int32, device="cuda")
        for RB in (16, 32, 64):
            def one(chunks=chunks, xb=xb, rb=rb, warps=warps, rn=rn, sums=sums, sqs=sqs, count=count, RB=RB):
                ticketed[(chunks * C // xb,)](x, sums, sqs, count, var, mean, RN=rn, C_=C, CHUNKS=chunks,
                                              COUNT=float(ROWS), XBLOCK=xb, RBLOCK=rb, RB=RB, num_warps=warps)
            var.zero_()
            one()
            torch.cuda.synchronize()
            left = count.sum().item()
            report(f"ticket chunks {chunks:4d} [{xb:3d},{rb:2d}] w{warps} RB {RB} (count left {left})", one)
    for fin in ((8, 4), (4, 2), (16, 4), (2, 1), (32, 8)):
        report(f"chunks 256 [64,8] w4, final {fin} pair, PDL", pair(256, 64, 8, 4, True, fin=fin))
        report(f"chunks 256 [64,8] w4, final {fin} pair", pair(256, 64, 8, 4, False, fin=fin))


if __name__ == "__main__":
    main()
