"""Does a matmul with its epilogue fused (brrr's template) beat cuBLAS followed by brrr's pointwise kernel?

Not yet run (written when no device time was left). The question decides whether `BRRR_MATMUL_TEMPLATES=1`
(matmul_fusion.py) may become the default, and which tiles need autotuning first. Prediction, from counted
bytes and FLOPs on an H100 (~650 TFLOP/s bf16 in cuBLAS, ~3 TB/s): BERT-base's FFN up-projection,
[4096 x 768] @ [768 x 3072] + bias, GELU, bf16, is 19.3 GFLOP (~30 us in cuBLAS) and its epilogue moves
25 MB each way unfused (~17 us for the write and the read back); fused, the template must reach ~75% of
cuBLAS's rate to win. With `default_config`'s untuned tiles I expect 60-80% of cuBLAS on the matmul alone,
so a tie or a small loss on that shape, and a win where the epilogue's bytes outweigh the matmul (small K).

Per shape, in one process, bf16: cuBLAS alone (`torch.mm`), the template alone (`template_mm`), and a compiled
`gelu(linear(x, w, b))` with BRRR_MATMUL_TEMPLATES 0 (cuBLAS + brrr's GELU kernel), 1 (fused, default tile)
and auto (timed per problem, matmul_choice.py). do_bench medians in microseconds.

    PYTHONPATH=$PWD python3 benchmarks/probes/does_a_fused_matmul_epilogue_pay.py --out DIR
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

SHAPES = {   # name: (M, K, N)
    "bert ffn up 8x512": (4096, 768, 3072),
    "bert ffn down 8x512": (4096, 3072, 768),
    "llama mlp up 8x1024": (8192, 1024, 2816),
    "small-K 16384x64x1024": (16384, 64, 1024),
    "square 4096": (4096, 4096, 4096),
}


def _gelu_linear(x, w, b):
    return F.gelu(F.linear(x, w, b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import triton
    from triton.testing import do_bench

    import brrr
    from brrr.compile.template_mm import template_mm
    from result_files import git_commit, gpu_slug, utc_date

    rows = []
    for name, (m, k, n) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        w = (torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).bfloat16()
        b = torch.randn(n, device="cuda", generator=g).bfloat16()
        wt = w.t()
        row = {"shape": name, "M": m, "K": k, "N": n,
               "cublas_mm_us": do_bench(lambda: torch.mm(x, wt)) * 1e3,
               "template_mm_us": do_bench(lambda: template_mm(x, wt)) * 1e3}
        for flag in ("0", "1", "auto"):
            os.environ["BRRR_MATMUL_TEMPLATES"] = flag
            torch._dynamo.reset()
            fn = brrr.compile(_gelu_linear, cuda_graphs=False)
            with torch.no_grad():
                got = fn(x, w, b)
                row[f"compiled_fusion_{flag}_us"] = do_bench(lambda: fn(x, w, b)) * 1e3
            want = _gelu_linear(x.double(), w.double(), b.double())
            row[f"compiled_fusion_{flag}_max_err"] = (got.double() - want).abs().max().item()
        rows.append(row)
        print(row, flush=True)
    device = torch.cuda.get_device_name()
    result = {"device": device, "torch": torch.__version__, "triton": triton.__version__, "commit": git_commit(),
              "date": utc_date(), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{utc_date()}-{gpu_slug(device)}-{git_commit()}-does-a-fused-matmul-epilogue-pay.json"
    path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
