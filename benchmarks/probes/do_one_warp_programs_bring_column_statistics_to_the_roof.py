"""Do one-warp programs bring channels_last batch-norm statistics to the copy roof? The linear + cross-entropy
column statistics went from 51% to 75% of copy with one warp a program and many programs (NOTES); brrr's column
reductions run four warps over [64 channels, 32 rows] tiles, and their BN statistics stay at ~71%. The partial
kernel here is brrr's form (shifted sum and sum of squares, lane accumulators over [channels, rows] tiles), then
the final kernel over the partials; warps, tile and chunk count varied.

    PYTHONPATH=$PWD python3 benchmarks/probes/do_one_warp_programs_bring_column_statistics_to_the_roof.py
"""

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def partial(x_ptr, shift_ptr, rows, chunk_rows, sum_ptr, sq_ptr, C: tl.constexpr, XB: tl.constexpr,
            RB: tl.constexpr):
    c = tl.program_id(0) * XB + tl.arange(0, XB)
    chunk = tl.program_id(1)
    shift = tl.load(shift_ptr + c).to(tl.float32)
    acc = tl.zeros([XB, RB], tl.float32)
    acc2 = tl.zeros([XB, RB], tl.float32)
    r0 = chunk * chunk_rows
    for start in range(0, chunk_rows, RB):
        r = r0 + start + tl.arange(0, RB)
        mask = (r < rows)[None, :] & (start + tl.arange(0, RB) < chunk_rows)[None, :]
        v = tl.load(x_ptr + r.to(tl.int64)[None, :] * C + c[:, None], mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, v - shift[:, None], 0.0)
        acc += d
        acc2 += d * d
    tl.store(sum_ptr + chunk * C + c, tl.sum(acc, 1))
    tl.store(sq_ptr + chunk * C + c, tl.sum(acc2, 1))


@triton.jit
def final(sum_ptr, sq_ptr, chunks, shift_ptr, count, mean_ptr, var_ptr, C: tl.constexpr, XB: tl.constexpr,
          SB: tl.constexpr):
    c = tl.program_id(0) * XB + tl.arange(0, XB)
    s = tl.zeros([SB, XB], tl.float32)
    q = tl.zeros([SB, XB], tl.float32)
    for start in range(0, chunks, SB):
        k = start + tl.arange(0, SB)
        m = (k < chunks)[:, None]
        s += tl.load(sum_ptr + k[:, None] * C + c[None, :], mask=m, other=0.0)
        q += tl.load(sq_ptr + k[:, None] * C + c[None, :], mask=m, other=0.0)
    s1 = tl.sum(s, 0)
    q1 = tl.sum(q, 0)
    mean_shifted = s1 / count
    tl.store(mean_ptr + c, mean_shifted + tl.load(shift_ptr + c).to(tl.float32))
    tl.store(var_ptr + c, q1 / count - mean_shifted * mean_shifted)


def main():
    dev = torch.device("cuda")
    n, C, h, w = 64, 256, 56, 56
    x = torch.randn(n, C, h, w, device=dev).bfloat16().contiguous(memory_format=torch.channels_last) + 1.0
    rows = n * h * w
    shift = x[0, :, 0, 0].float().contiguous()
    ref_var, ref_mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
    src = torch.empty(x.numel(), dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    copy = 2 * x.numel() * 2 / (copy_ms * 1e6)
    read_ms = x.numel() * 2 / (copy * 1e6)
    print(f"# {torch.cuda.get_device_name()}, triton {triton.__version__}; [64, 256, 56, 56] bf16 channels_last; "
          f"copy {copy:.0f} GB/s, so the read at copy's rate {read_ms * 1e3:.1f} us", flush=True)
    mean = torch.empty(C, device=dev)
    var = torch.empty(C, device=dev)
    for xb, rb, warps in [(64, 32, 4), (64, 32, 2), (64, 32, 1), (64, 16, 1), (32, 32, 1), (64, 64, 1), (64, 8, 1),
                          (128, 16, 2), (64, 64, 2), (32, 64, 1)]:
        for chunks in (196, 392, 784, 1568, 3136):
            chunk_rows = triton.cdiv(rows, chunks)
            chunk_rows = triton.cdiv(chunk_rows, rb) * rb
            chunks_used = triton.cdiv(rows, chunk_rows)
            s = torch.empty(chunks_used, C, device=dev)
            q = torch.empty(chunks_used, C, device=dev)

            def part():
                partial[(C // xb, chunks_used)](x, shift, rows, chunk_rows, s, q, C=C, XB=xb, RB=rb, num_warps=warps)

            def both():
                part()
                final[(C // 32,)](s, q, chunks_used, shift, rows, mean, var, C=C, XB=32, SB=32, num_warps=4)

            ms_p = do_bench(part, warmup=25, rep=200, return_mode="median")
            ms_b = do_bench(both, warmup=25, rep=200, return_mode="median")
            err = max((mean - ref_mean).abs().max().item(), (var - ref_var).abs().max().item())
            print(f"[{xb} ch, {rb} rows] w{warps} {chunks_used:5d} chunks ({C // xb * chunks_used:6d} programs): "
                  f"partial {ms_p * 1e3:6.1f} us {100 * read_ms / ms_p:5.1f}% of copy; with final {ms_b * 1e3:6.1f} "
                  f"us {100 * read_ms / ms_b:5.1f}%; err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
