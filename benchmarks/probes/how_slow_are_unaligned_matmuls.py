"""How much slower is a cuBLAS matmul whose leading dimension is not a multiple of 16 bytes?

Not run on a GPU yet. brrr pads such matmuls when UNALIGNED_SLOWDOWN (brrr/compile/matmul_padding.py, 3x)
times the aligned matmul exceeds the padded one plus its copies. This times, in bf16, an LM head's three
matmuls (forward h @ W.T, backward grad @ W and grad.T @ h) at 8192 tokens, 768 wide, for vocabularies whose
row length in bytes is 2, 4 and 8 mod 16, against the next multiple of 8 (aligned), with do_bench medians.

    PYTHONPATH=$PWD python3 benchmarks/probes/how_slow_are_unaligned_matmuls.py
"""

import torch
from triton.testing import do_bench


def main():
    tokens, dim = 8192, 768
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, {tokens} tokens x {dim}")
    print(f"{'vocab':>7} {'matmul':22} {'ms':>8} {'aligned ms':>11} {'slowdown':>9}")
    for vocab in (50257, 30522, 50260, 50264):
        aligned = (vocab + 7) // 8 * 8
        times = {}
        for v in (vocab, aligned):
            h = torch.randn(tokens, dim, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(v, dim, device="cuda", dtype=torch.bfloat16)
            g = torch.randn(tokens, v, device="cuda", dtype=torch.bfloat16)
            cases = {"forward h @ W.T": lambda: h @ w.t(), "grad @ W": lambda: g @ w,
                     "grad.T @ h": lambda: g.t() @ h}
            for name, fn in cases.items():
                times[(v, name)] = do_bench(fn, warmup=25, rep=200)
        for name in ("forward h @ W.T", "grad @ W", "grad.T @ h"):
            slow, fast = times[(vocab, name)], times[(aligned, name)]
            print(f"{vocab:7d} {name:22} {slow:8.3f} {fast:11.3f} {slow / fast:8.2f}x", flush=True)


if __name__ == "__main__":
    main()
