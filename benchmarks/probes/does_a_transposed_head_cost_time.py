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


def main():
    dev = torch.device("cuda")
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
