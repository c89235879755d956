"""Does making an unaligned LM head's logits transposed ([vocab, rows], the weight read in place) cost time against
padding the weight to an aligned vocabulary (the op before)? bf16, the training op (loss and gradients in one
call), at GPT-2's head (50257), BERT's MLM decoder (30522, with bias) and, as a control where both take the same
path, LLaMA's (32000).

    PYTHONPATH=$PWD python3 benchmarks/probes/does_a_transposed_head_cost_time.py
"""

import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
import padded_linear_cross_entropy_op  # noqa: E402,F401  (registers brrr_padded::...)

from brrr.compile import linear_cross_entropy_op  # noqa: E402,F401

HEADS = [("gpt2", 8192, 768, 50257, False), ("bert-mlm", 4096, 768, 30522, True), ("llama", 8192, 1024, 32000, False)]


def call(ns, x, w, b, t):
    return getattr(torch.ops, ns).fused_linear_cross_entropy_with_grads(x, w, b, t, -100, "mean", 0.0, True, True,
                                                                         b is not None, x.dtype)


def peak_over(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20, out


def kernels(fn):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            n, us = rows.get(e.name, (0, 0.0))
            rows[e.name] = (n + 1, us + e.device_time_total)
    return sorted(rows.items(), key=lambda kv: -kv[1][1])


def sweep(dev):
    """The row kernels (old: two exps an element; new: one) on an aligned chunk, and the column kernels' tiles on
    a transposed GPT-2 chunk, each against a copy of the bytes it moves."""
    from brrr.compile import linear_cross_entropy_op as op
    import padded_linear_cross_entropy_op as old

    def copy_gbs(n_bytes):
        src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=dev)
        dst = torch.empty_like(src)
        return 2 * n_bytes / (do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") * 1e6)

    rows, vocab = 4096, 32000
    logits = torch.randn(rows, vocab, device=dev).bfloat16()
    t = torch.randint(0, vocab, (rows,), device=dev)
    loss = torch.empty(rows, device=dev)
    lse = torch.empty(rows, device=dev)
    scale = torch.ones(1, device=dev)
    roof = copy_gbs(logits.numel() * 2)
    print(f"# copy {roof:.0f} GB/s at {logits.numel() * 2 / 2**20:.0f} MiB", flush=True)
    for name, mod in (("old", old), ("new", op)):
        ms = do_bench(lambda: mod._rows_forward(logits, t, loss, lse, -100, 0.0), warmup=25, rep=200,
                      return_mode="median")
        gbs = logits.numel() * 2 / (ms * 1e6)
        print(f"rows stats {name}: {ms * 1e3:7.1f} us {gbs:6.0f} GB/s {100 * gbs / roof:5.1f}% of copy", flush=True)
    ref = lse.clone()
    old._rows_forward(logits, t, loss, ref, -100, 0.0)
    op._rows_forward(logits, t, loss, lse, -100, 0.0)
    print(f"rows stats new vs old lse: {(lse - ref).abs().max().item():.2e}")
    work = logits.clone()
    ms = do_bench(lambda: op._rows_backward(work.copy_(logits), t, lse, scale, -100, 0.0), warmup=25, rep=200,
                  return_mode="median") - do_bench(lambda: work.copy_(logits), warmup=25, rep=200, return_mode="median")
    gbs = 2 * logits.numel() * 2 / (ms * 1e6)
    print(f"rows gradient: {ms * 1e3:7.1f} us {gbs:6.0f} GB/s {100 * gbs / roof:5.1f}% of copy", flush=True)

    cols, vocab = 2048, 50257
    lt = torch.randn(vocab, cols, device=dev).bfloat16()
    view = lt.t()
    t = torch.randint(0, vocab, (cols,), device=dev)
    loss = torch.empty(cols, device=dev)
    lse = torch.empty(cols, device=dev)
    roof = copy_gbs(lt.numel() * 2)
    print(f"# copy {roof:.0f} GB/s at {lt.numel() * 2 / 2**20:.0f} MiB", flush=True)
    for tile in [(32, 64, 4), (64, 64, 4), (16, 128, 4), (32, 128, 4), (32, 128, 8), (64, 128, 8), (16, 256, 8)]:
        for programs in (1024, 2048):
            op.COL_STATS, op.COL_PROGRAMS = tile, programs
            ms = do_bench(lambda: op._rows_forward(view, t, loss, lse, -100, 0.0), warmup=25, rep=200,
                          return_mode="median")
            gbs = lt.numel() * 2 / (ms * 1e6)
            print(f"cols stats {tile} {programs}: {ms * 1e3:7.1f} us {gbs:6.0f} GB/s {100 * gbs / roof:5.1f}%",
                  flush=True)
    work = lt.clone()
    base = do_bench(lambda: work.copy_(lt), warmup=25, rep=200, return_mode="median")
    for tile in [(64, 64, 4), (32, 128, 4), (64, 128, 4), (128, 64, 8), (64, 256, 8), (128, 128, 8), (32, 256, 4)]:
        op.COL_GRADIENT = tile
        ms = do_bench(lambda: op._rows_backward(work.copy_(lt).t(), t, lse, scale, -100, 0.0), warmup=25,
                      rep=200, return_mode="median") - base
        gbs = 2 * lt.numel() * 2 / (ms * 1e6)
        print(f"cols gradient {tile}: {ms * 1e3:7.1f} us {gbs:6.0f} GB/s {100 * gbs / roof:5.1f}%", flush=True)


def main():
    dev = torch.device("cuda")
    if sys.argv[1:] == ["--sweep"]:
        return sweep(dev)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for name, rows, hidden, vocab, bias in HEADS:
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(rows, hidden, device=dev, generator=g).bfloat16()
        w = (torch.randn(vocab, hidden, device=dev, generator=g) * 0.02).bfloat16()
        b = (torch.randn(vocab, device=dev, generator=g) * 0.02).bfloat16() if bias else None
        t = torch.randint(0, vocab, (rows,), device=dev, generator=g)
        t[::7] = -100
        got = {}
        for ns in ("brrr_padded", "brrr"):
            fn = lambda: call(ns, x, w, b, t)  # noqa: E731
            fn()
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            peak, out = peak_over(fn)
            got[ns] = out
            print(f"{name} {ns:12s} {ms * 1e3:8.1f} us  peak over inputs {peak:7.1f} MiB", flush=True)
        diffs = [((a.float() - c.float()).abs().max() / c.float().abs().max()).item()
                 for a, c in zip(got["brrr"], got["brrr_padded"]) if a.numel()]
        print(f"{name} largest difference transposed vs padded, relative to the largest value: "
              f"{', '.join(f'{d:.1e}' for d in diffs)}")
        for ns in ("brrr_padded", "brrr"):
            print(f"{name} {ns} kernels (name, calls, us):")
            for k, (n, us) in kernels(lambda: call(ns, x, w, b, t))[:8]:
                print(f"    {us:8.1f} {n:3d}  {k[:110]}")


if __name__ == "__main__":
    main()
