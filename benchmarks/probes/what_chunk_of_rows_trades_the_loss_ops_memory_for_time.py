"""What chunk of rows trades the fused linear cross-entropy's memory for its time?

The training op (`fused_linear_cross_entropy_with_grads`) holds one chunk of logits and the fp32 weight-gradient
sum at once; GPT-2's training step peaks inside it. Each chunk row count below is timed (CUDA events, median of
10 calls) with the op's peak over its inputs, at the zoo's LM heads, bf16.
"""

import statistics
import sys

import torch

import brrr.compile.linear_cross_entropy_op as op

HEADS = {   # name: (rows, hidden, vocab)
    "gpt2": (8184, 768, 50257),
    "opt": (8184, 768, 50272),
    "llama": (8184, 1024, 32000),
    "qwen2": (4092, 896, 151936),
    "bert-mlm": (8192, 768, 30522),
}
CANDIDATES = [None, 1024, 1376, 1408, 1536, 2048, 4096]


def run(rows, hidden, vocab, chunk):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
    w = (torch.randn(vocab, hidden, device="cuda", generator=g) * 0.02).bfloat16()
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    rule = op.chunk_rows
    if chunk is not None:
        op.chunk_rows = lambda *a: min(chunk, rows)
    try:
        call = lambda: torch.ops.brrr.fused_linear_cross_entropy_with_grads(  # noqa: E731
            x, w, None, t, -100, "mean", 0.0, True, True, False, torch.float32)
        for _ in range(2):
            out = call()
        del out
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = call()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        del out
        times = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = call()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
            del out
        used = op.chunk_rows(rows, vocab, hidden, 2)
    finally:
        op.chunk_rows = rule
    return used, statistics.median(times), peak


def main():
    print(torch.cuda.get_device_name(), torch.__version__, file=sys.stderr)
    for name, (rows, hidden, vocab) in HEADS.items():
        for chunk in CANDIDATES if "--rule-only" not in sys.argv else [None]:
            if chunk is not None and chunk >= rows:
                continue
            used, us, peak = run(rows, hidden, vocab, chunk)
            tag = "rule" if chunk is None else "    "
            print(f"{name:9s} {tag} chunk {used:5d}  {us:9.1f} us  peak {peak:7.1f} MiB over inputs", flush=True)


if __name__ == "__main__":
    main()
