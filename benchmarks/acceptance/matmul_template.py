"""GPU acceptance for brrr's matmul template (issue 16): does it reach 90% of cuBLAS?

The acceptance asks the bf16 template for at least 90% of cuBLAS's speed on 4096 x 4096 x 4096 and on the zoo's
transformer shapes. Each shape (B a Linear weight [N, K], as in the models) is timed as cuBLAS (`torch.mm`),
as `template_mm` as it runs by default (the TMA persistent template on Hopper, codegen/matmul_template_tma.py),
and as the pointer template (`tma=False`), each checked against cuBLAS's product first. Times are do_bench
medians; the fraction is cuBLAS's time over the template's.

Not yet run as generated: a probe of the same kernel shape reached 94% at 4096^3 and 94-105% on the LM shapes,
79% on BERT's FFN down (benchmarks/NOTES.md, "What brings the matmul template to cuBLAS?").

    PYTHONPATH=$PWD python3 benchmarks/acceptance/matmul_template.py --json $OUT/matmul-template.json
    PYTHONPATH=$PWD TRITON_INTERPRET=1 python3 benchmarks/acceptance/matmul_template.py --quick   # CPU smoke run

Save the output as benchmarks/results/acceptance-compile/<date>-<gpu>-<commit>-matmul-template.log.
"""

import argparse
import json
import time

TARGET = 0.90
SHAPES = {   # name: (M, N, K): out [M, N] = x [M, K] @ W[N, K].t()
    "square-4096": (4096, 4096, 4096),
    "bert-ffn-up": (4096, 3072, 768),
    "bert-ffn-down": (4096, 768, 3072),
    "gpt2-qkv": (8192, 2304, 768),
    "gpt2-lm-head-padded": (8192, 50264, 768),
    "llama-mlp-up": (8192, 2816, 1024),
    "llama-mlp-down": (8192, 1024, 2816),
    "llama-qkv": (8192, 2048, 1024),
}
QUICK_SHAPES = {"tiny": (48, 32, 24)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke run (TRITON_INTERPRET=1): one tiny shape")
    p.add_argument("--shapes", help="comma-separated subset of the shapes (default: all)")
    p.add_argument("--json", help="write the rows to this JSON file")
    return p.parse_args(argv)


def _timer(quick):
    if quick:
        def run_once(fn):
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return run_once
    from triton.testing import do_bench
    return lambda fn: do_bench(fn, warmup=25, rep=200)


def measure(name, m, n, k, quick):
    import torch

    from brrr.compile import template_mm as templates
    from brrr.compile.matmul_configs import TileConfig
    from brrr.compile.template_mm import template_mm

    device, dtype = ("cpu", torch.float16) if quick else ("cuda", torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device=device, dtype=dtype)
    ref = x @ w.t()
    timer = _timer(quick)
    cublas_ms = timer(lambda: torch.mm(x, w.t()))
    row = {"shape": name, "mnk": [m, n, k], "cublas_ms": cublas_ms, "ways": []}
    out = torch.empty(m, n, device=device, dtype=dtype)
    # the default way: TMA on Hopper (forced under the interpreter, with a tile the tiny shape fills, to
    # smoke-test it); then the pointer template
    tile = TileConfig(16, 16, 16, 2, 4, 2) if quick else None
    for way, tma in (("template", True if quick else None), ("pointer template", False)):
        try:
            template_mm(x, w.t(), out, tma=tma, config=tile)
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()
            if not err < 2e-2:
                raise AssertionError(f"differs from cuBLAS's product by {err:.3g}")
            ms = timer(lambda: template_mm(x, w.t(), out, tma=tma, config=tile))
            ran_tma = templates._tma_plan(x.unsqueeze(0), w.t().unsqueeze(0), tile, tma) is not None
            row["ways"].append({"way": way, "status": "ok", "ms": ms, "of_cublas": cublas_ms / ms, "tma": ran_tma})
        except Exception as e:   # a way that fails is recorded; the others are still timed
            row["ways"].append({"way": way, "status": f"{type(e).__name__}: {str(e)[:200]}"})
    return row


def main(argv=None):
    args = parse_args(argv)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    names = args.shapes.split(",") if args.shapes else list(shapes)
    rows = []
    for name in names:
        row = measure(name, *shapes[name], args.quick)
        rows.append(row)
        print(f"{name} {'x'.join(map(str, row['mnk']))}: cuBLAS {row['cublas_ms'] * 1e3:.1f} us", flush=True)
        for way in row["ways"]:
            if way["status"] == "ok":
                verdict = "meets" if way["of_cublas"] >= TARGET else "below"
                print(f"  {way['way'] + (' (TMA)' if way['tma'] else ''):<23} {way['ms'] * 1e3:9.1f} us  "
                      f"{way['of_cublas']:6.1%} of cuBLAS ({verdict} {TARGET:.0%})", flush=True)
            else:
                print(f"  {way['way']:<23} {way['status']}", flush=True)
    if args.json:
        import torch
        import triton
        env = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}
        with open(args.json, "w") as f:
            json.dump({"environment": env, "target": TARGET, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
