"""What brings the linear + cross-entropy statistics kernels (online max and sum-exp per row of logits) to the copy
roof? They sit at 51% (transposed [vocab, cols] tiles) and 65% (rows) of copy on an H200 while the gradient
kernels reach 92-98%. Variants: the running state per lane (one exp an element, ~13 operations) or reduced per
tile (one max and one sum per tile and column, ~6 operations an element); software pipelining (tl.range
num_stages); warps per program.

    PYTHONPATH=$PWD python3 benchmarks/probes/what_brings_the_softmax_statistics_to_the_roof.py
"""

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def online_softmax_step(run_max, run_sum, v):   # as linear_cross_entropy_op's
    up = v > run_max
    d = tl.where(up, run_max - v, v - run_max)
    e = tl.exp(tl.where(v == float("-inf"), float("-inf"), d))
    return tl.where(up, v, run_max), tl.where(up, run_sum * e + 1.0, run_sum + e)


@triton.jit
def cols_lane(logits_ptr, vocab_stride, cols, vocab, seg_len, max_ptr, sum_ptr, BV: tl.constexpr, BT: tl.constexpr,
              STAGES: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    seg = tl.program_id(1)
    tmask = t < cols
    rows = tl.arange(0, BV)
    run_max = tl.full([BV, BT], float("-inf"), tl.float32)
    run_sum = tl.zeros([BV, BT], tl.float32)
    for start in tl.range(0, seg_len, BV, num_stages=STAGES):
        v = seg * seg_len + start + rows
        mask = (v < vocab)[:, None] & tmask[None, :]
        x = tl.load(logits_ptr + v.to(tl.int64)[:, None] * vocab_stride + t[None, :], mask=mask,
                    other=float("-inf")).to(tl.float32)
        run_max, run_sum = online_softmax_step(run_max, run_sum, x)
    col_max = tl.max(run_max, 0)
    shift = tl.where(col_max == float("-inf"), 0.0, col_max)
    col_sum = tl.sum(run_sum * tl.exp(run_max - shift[None, :]), 0)
    tl.store(max_ptr + seg * cols + t, col_max, mask=tmask)
    tl.store(sum_ptr + seg * cols + t, col_sum, mask=tmask)


@triton.jit
def cols_tile(logits_ptr, vocab_stride, cols, vocab, seg_len, max_ptr, sum_ptr, BV: tl.constexpr, BT: tl.constexpr,
              STAGES: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    seg = tl.program_id(1)
    tmask = t < cols
    rows = tl.arange(0, BV)
    run_max = tl.full([BT], float("-inf"), tl.float32)
    run_sum = tl.zeros([BT], tl.float32)
    for start in tl.range(0, seg_len, BV, num_stages=STAGES):
        v = seg * seg_len + start + rows
        mask = (v < vocab)[:, None] & tmask[None, :]
        x = tl.load(logits_ptr + v.to(tl.int64)[:, None] * vocab_stride + t[None, :], mask=mask,
                    other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(run_max, tl.max(x, 0))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(x - shift[None, :]), 0)
        run_max = new_max
    tl.store(max_ptr + seg * cols + t, run_max, mask=tmask)
    tl.store(sum_ptr + seg * cols + t, run_sum, mask=tmask)


@triton.jit
def rows_lane(logits_ptr, row_stride, lse_ptr, vocab, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + tl.multiple_of(row * row_stride, 16)
    cols = tl.arange(0, BLOCK)
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, vocab, BLOCK, num_stages=STAGES):
        v = tl.load(base + start + cols, mask=start + cols < vocab, other=float("-inf")).to(tl.float32)
        run_max, run_sum = online_softmax_step(run_max, run_sum, v)
    row_max = tl.max(run_max, 0)
    tl.store(lse_ptr + row, row_max + tl.log(tl.sum(run_sum * tl.exp(run_max - row_max), 0)))


@triton.jit
def rows_tile(logits_ptr, row_stride, lse_ptr, vocab, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    # the block as [BLOCK / 8, 8]: each thread's 8 contiguous values reduced in registers, one exp each
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + tl.multiple_of(row * row_stride, 16)
    offs = tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
    run_max = tl.full([BLOCK // 8], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK // 8], tl.float32)
    for start in tl.range(0, vocab, BLOCK, num_stages=STAGES):
        v = tl.load(base + start + offs, mask=start + offs < vocab, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(run_max, tl.max(v, 1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(v - shift[:, None]), 1)
        run_max = new_max
    row_max = tl.max(run_max, 0)
    tl.store(lse_ptr + row, row_max + tl.log(tl.sum(run_sum * tl.exp(run_max - row_max), 0)))


def main():
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)

    def roof(n_bytes):
        src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=dev)
        dst = torch.empty_like(src)
        return 2 * n_bytes / (do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") * 1e6)

    def report(name, fn, n_bytes, copy, check=None):
        ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
        gbs = n_bytes / (ms * 1e6)
        print(f"{name:44s} {ms * 1e3:7.1f} us {gbs:6.0f} GB/s {100 * gbs / copy:5.1f}% of copy"
              + (f"  err {check():.1e}" if check else ""), flush=True)

    cols, vocab = 2048, 50257
    lt = torch.randn(vocab, cols, device=dev).bfloat16() * 4
    ref = torch.logsumexp(lt.float(), 0)
    copy = roof(lt.numel() * 2)
    print(f"# copy {copy:.0f} GB/s; transposed chunk [{vocab}, {cols}]")
    import sys
    second = sys.argv[1:] == ["--more-programs"]
    for kernel in (cols_lane, cols_tile) if not second else (cols_tile,):
        for bv, bt, warps in ([(32, 64, 4), (32, 64, 2), (64, 64, 4), (64, 64, 2), (32, 128, 4), (128, 64, 4),
                               (64, 32, 1), (128, 32, 2), (16, 64, 1)] if not second else
                              [(64, 32, 1), (128, 32, 1), (32, 32, 1), (64, 64, 1), (128, 64, 2), (256, 32, 2),
                               (32, 64, 1)]):
            for programs in (1024, 2048) if not second else (2048, 4096, 8192, 16384):
                for stages in (1, 3) if not second else (1,):
                    col_blocks = triton.cdiv(cols, bt)
                    segments = max(1, min(triton.cdiv(programs, col_blocks), triton.cdiv(vocab, 4 * bv)))
                    seg_len = triton.cdiv(triton.cdiv(vocab, segments), bv) * bv
                    segments = triton.cdiv(vocab, seg_len)
                    mx = torch.empty(segments, cols, device=dev)
                    sm = torch.empty(segments, cols, device=dev)

                    def run():
                        kernel[(col_blocks, segments)](lt, cols, cols, vocab, seg_len, mx, sm, BV=bv, BT=bt,
                                                       STAGES=stages, num_warps=warps)

                    def err():
                        m = mx.max(0).values
                        return ((m + torch.log((sm * torch.exp(mx - m)).sum(0))) - ref).abs().max().item()
                    try:
                        report(f"{kernel.__name__} {bv}x{bt} w{warps} p{programs} s{stages}", run, lt.numel() * 2,
                               copy, err)
                    except Exception as e:   # a tile that does not compile
                        print(f"{kernel.__name__} {bv}x{bt} w{warps} s{stages}: {type(e).__name__}", flush=True)

    if second:
        return
    rows, vocab = 4096, 32000
    logits = torch.randn(rows, vocab, device=dev).bfloat16() * 4
    ref = torch.logsumexp(logits.float(), 1)
    lse = torch.empty(rows, device=dev)
    copy = roof(logits.numel() * 2)
    print(f"# copy {copy:.0f} GB/s; rows [{rows}, {vocab}]")
    for kernel in (rows_lane, rows_tile):
        for block, warps in [(2048, 8), (1024, 4), (4096, 8), (2048, 4)]:
            for stages in (1, 3):
                def run():
                    kernel[(rows,)](logits, vocab, lse, vocab, BLOCK=block, STAGES=stages, num_warps=warps)
                try:
                    report(f"{kernel.__name__} {block} w{warps} s{stages}", run, logits.numel() * 2, copy,
                           lambda: (lse - ref).abs().max().item())
                except Exception as e:
                    print(f"{kernel.__name__} {block} w{warps} s{stages}: {type(e).__name__}", flush=True)


if __name__ == "__main__":
    main()
