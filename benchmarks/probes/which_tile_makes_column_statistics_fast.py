"""Which split and tile make a column reduction (channels_last batch-norm statistics) run at the copy roof?

Not yet run. At 3a65eef brrr's `var_mean(x, (0, 2, 3))` on [64, 256, 56, 56] bf16 channels_last takes 61.7 us,
55% of copy bandwidth (Inductor 49.5 us, 69%; results/probes/...-3a65eef-layout-kernels.log). The tensor is
102.8 MB, read once (one pass of shifted sums): 34 us at 3.0 TB/s. The split is 256 chunks of 784 rows, each
program walking [64 channels, 32 rows] tiles, 1024 programs of 4 warps: ~8 per SM, each with one 4 KB load in
flight. Prediction: too few bytes in flight per SM (Little's law wants ~25 KB per SM at ~1 us latency), so
more programs (512-1024 chunks) or taller tiles ([64, 64], 8 KB) should reach 80-90%; wider tiles ([128, 32])
help less, the rows being already 128 bytes.

Per variant (chunks, XBLOCK, RBLOCK), patched into lower.py / codegen/triton.py, in one process: brrr's
compiled var_mean and, for batch norm's backward, `(g.sum(dims), (g * x).sum(dims))`, timed as one CUDA graph
replay (brrr.bench graph timing), with the fraction of copy bandwidth from ideal bytes.

    PYTHONPATH=$PWD python3 benchmarks/probes/which_tile_makes_column_statistics_fast.py
"""

import sys

import torch

VARIANTS = [   # (chunks, XBLOCK, RBLOCK)
    (256, 64, 32), (512, 64, 32), (1024, 64, 32),
    (256, 64, 64), (512, 64, 64),
    (256, 128, 32), (512, 128, 32), (256, 128, 64),
    (512, 32, 64), (1024, 32, 64),
]


def main():
    from brrr.bench import bench
    from brrr.bench.micro import ideal_bytes
    from brrr.compile import lower
    from brrr.compile.codegen import triton as codegen
    from brrr.cost.device import get_ceilings

    dev = torch.device("cuda")
    bandwidth = get_ceilings(dev).bandwidth
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(64, 256, 56, 56, device=dev, generator=g).bfloat16().to(memory_format=torch.channels_last)
    dy = torch.randn(64, 256, 56, 56, device=dev, generator=g).bfloat16().to(memory_format=torch.channels_last)
    dims = (0, 2, 3)

    def statistics(x):
        return torch.var_mean(x, dim=dims, correction=0)

    def backward_sums(dy, x):
        return dy.float().sum(dims), (dy.float() * x.float()).sum(dims)

    cases = [("var_mean", statistics, (x,)), ("bn backward sums", backward_sums, (dy, x))]
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    for chunks, xblock, rblock in VARIANTS:
        lower.COLUMN_XBLOCK = codegen.COLUMN_XBLOCK = xblock
        codegen.COLUMN_RBLOCK = rblock
        codegen.FEW_PROGRAMS = 0
        lower.SPLIT_COLUMN_PROGRAMS = chunks * 256 // xblock
        for name, fn, inputs in cases:
            torch._dynamo.reset()
            with torch.no_grad():
                nbytes = ideal_bytes(inputs, fn(*inputs))
            result = bench(fn, *inputs, backends=("brrr",), label=name, compile_warm=False, graph_timing=True)
            row = next(r for r in result.rows if r.backend == "brrr")   # eager is always run first
            seconds = row.graph_s or row.median_s
            err = f"{row.error_vs_eager.norm_rel:.1e}" if row.error_vs_eager is not None else None
            frac = nbytes / seconds / bandwidth if seconds else float("nan")
            print(f"chunks {chunks:5d}  tile [{xblock:3d}, {rblock:3d}]  {name:18s} "
                  f"{(seconds or 0) * 1e6:7.1f} us  {100 * frac:5.1f}% of copy  err {err}  {row.status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
