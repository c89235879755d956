"""How fast and how lean is linear + cross-entropy in chunks, and how big should a chunk be?

Not yet run (no device time left when it was written). Prediction, from counted bytes and FLOPs at Qwen2-0.5B's
head (4096 x 896 -> 151936, bf16; H100 ~650 TFLOP/s bf16 matmul, ~3 TB/s): three matmuls 3.35 TFLOP ~ 5.2 ms;
eager's chain moves ~30 GB around them (upcast, log_softmax, its backward, the cast back) ~ 15 ms and peaks
~7 GB above its inputs; chunked with gradients in the forward (2048-row chunks) runs eager's three matmuls and moves
~3.7 GB in its row kernels (read, then read and written) plus 1.1 GB accumulating the weight gradient: ~6.8 ms,
peak ~1 GB (a chunk of logits, the weight gradient, the input gradient); recomputed in the backward, a fourth
matmul, ~8.5 ms. 512-row chunks should lose ~1 ms to accumulation: each adds into the whole 272 MB weight
gradient.

Forward + backward of `cross_entropy(linear(x, W).float(), target)` at LM-head shapes (bf16, 10% of targets
ignored), each way in one process:
- eager: the unfused chain, logits materialized, upcast to fp32 (as Hugging Face's ForCausalLMLoss does);
- chunked, CHUNK_BYTES 128 MiB .. 1 GiB and ROWS_PER_HIDDEN 0, 2, 4: brrr::fused_linear_cross_entropy_with_grads
  (what the pass inserts for training), and the plain op whose backward recomputes the logits;
- brrr-unfused / brrr-fused (first shape only): the chain compiled by brrr with the pass off / on.
Times are do_bench medians of one forward + backward; peak is torch.cuda.max_memory_allocated above what was
allocated before the step (inputs and weights excluded).

    PYTHONPATH=$PWD python3 benchmarks/probes/how_big_a_loss_chunk.py --out DIR
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

SHAPES = {   # rows (batch x length), hidden, vocab
    "qwen2-0.5b 4x1024": (4096, 896, 151936),
    "gpt2 8x1024": (8192, 768, 50257),
    "llama-1024 8x1024": (8192, 1024, 32000),
}
CHUNKINGS = ((128, 0), (256, 0), (1024, 0), (256, 2), (256, 4))   # (CHUNK_BYTES in MiB, ROWS_PER_HIDDEN)


def _inputs(rows, hidden, vocab, device):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, hidden, device=device, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device=device, generator=g) * hidden ** -0.5).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (rows,), device=device, generator=g)
    t[torch.rand(rows, device=device, generator=g) < 0.1] = -100
    return x, w, t


def _eager(x, w, t):
    return F.cross_entropy(F.linear(x, w).float(), t)


def _chunked(x, w, t):   # the training op the pass inserts: gradients computed in the forward
    return torch.ops.brrr.fused_linear_cross_entropy_with_grads(x, w, None, t, -100, "mean", 0.0, True, True, False,
                                                                torch.float32)[0]


def _recomputed(x, w, t):   # the plain op under autograd: its backward recomputes the logits
    return torch.ops.brrr.fused_linear_cross_entropy(x, w, None, t, -100, "mean", 0.0, torch.float32)[0]


def _measure(fn, x, w, t):
    from triton.testing import do_bench

    def step():
        x.grad = w.grad = None
        fn(x, w, t).backward()

    step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    loss = fn(x, w, t).item()
    return {"ms": do_bench(step, warmup=50, rep=300), "peak_mib": peak / 2**20, "loss": loss}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=150)
    args = ap.parse_args()
    import brrr
    from brrr.compile import linear_cross_entropy_op as op
    from brrr.compile import linear_cross_entropy_pass as fuse
    from result_files import git_commit, gpu_slug, utc_date
    import triton

    start = time.time()
    rows = []
    for i, (name, (n, h, v)) in enumerate(SHAPES.items()):
        x, w, t = _inputs(n, h, v, "cuda")
        rows.append({"shape": name, "way": "eager", **_measure(_eager, x, w, t)})
        for mib, per_hidden in CHUNKINGS:
            op.CHUNK_BYTES, op.ROWS_PER_HIDDEN = mib << 20, per_hidden
            rows.append({"shape": name, "way": f"chunked {mib} MiB, {per_hidden}/hidden "
                                               f"({op.chunk_rows(n, v, h, 2)} rows)", **_measure(_chunked, x, w, t)})
            print(rows[-1], flush=True)
        op.CHUNK_BYTES, op.ROWS_PER_HIDDEN = 256 << 20, 2
        rows.append({"shape": name, "way": "recomputed in the backward", **_measure(_recomputed, x, w, t)})
        if i == 0:
            for way, floor in (("brrr-unfused", 1 << 62), ("brrr-fused", 64 << 20)):
                if time.time() - start > args.budget_s:
                    break
                fuse.MIN_LOGITS_BYTES = floor
                torch._dynamo.reset()
                compiled = brrr.compile(_eager, cuda_graphs=False)
                rows.append({"shape": name, "way": way, **_measure(compiled, x, w, t)})
            fuse.MIN_LOGITS_BYTES = 64 << 20
        del x, w, t
        torch.cuda.empty_cache()
    device = torch.cuda.get_device_name()
    result = {"device": device, "torch": torch.__version__, "triton": triton.__version__,
              "commit": git_commit(), "date": utc_date(), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{utc_date()}-{gpu_slug(device)}-{git_commit()}-how-big-a-loss-chunk.json"
    path.write_text(json.dumps(result, indent=1))
    for r in rows:
        print(f"{r['shape']:20s} {r['way']:32s} {r['ms']:8.2f} ms  peak {r['peak_mib']:8.0f} MiB  loss {r['loss']:.4f}")


if __name__ == "__main__":
    main()
