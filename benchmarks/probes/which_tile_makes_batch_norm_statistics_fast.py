"""Which tile makes channels_last batch-norm statistics reach the copy roof?

Not run on a GPU yet. brrr's split column reduction for torch.var_mean over (N, H, W) of a [64, 256, 56, 56]
bf16 channels_last tensor reads it once (102.8 MB: 34 us at 3.0 TB/s) in 72 us (47.5% of copy; Inductor 49.8 us),
with 1024 programs of an [XBLOCK=64, RBLOCK=32] tile, 4 warps, each over 784 rows of its 64 channels. This
compiles that graph with brrr, takes the partial kernel's Triton function, and times it (do_bench median) over
XBLOCK (channels per program), RBLOCK (rows per step) and warps; the grid follows XBLOCK.

    PYTHONPATH=$PWD python3 benchmarks/probes/which_tile_makes_batch_norm_statistics_fast.py
"""

import itertools

import torch
from triton.testing import do_bench


def main():
    import brrr
    x = torch.randn(64, 256, 56, 56, device="cuda").to(torch.bfloat16).to(memory_format=torch.channels_last)
    fn = brrr.compile(lambda x: torch.var_mean(x, dim=(0, 2, 3), correction=0))
    fn(x)
    from brrr.compile.runtime import CompiledGraph
    graphs = []
    orig = CompiledGraph.__call__

    def keep(graph, *args):
        graphs.append(graph)
        return orig(graph, *args)
    CompiledGraph.__call__ = keep
    fn(x)
    CompiledGraph.__call__ = orig
    launchers = [v for v in graphs[0].call.__globals__.values() if type(v).__name__ == "Launcher"]
    partial = next(la for la in launchers if la.grid[0] >= 256)
    xnumel = 65536
    outs = [torch.empty(xnumel, device="cuda", dtype=torch.float32) for _ in range(3)]
    ideal = x.numel() * 2
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; brrr's choice: {partial.meta}")
    rows = []
    for xb, rb, warps in itertools.product((32, 64, 128, 256), (8, 16, 32, 64), (2, 4, 8)):
        if xb * rb > 16384 or xb * rb < 256:
            continue
        grid = (xnumel // xb,)
        try:
            ms = do_bench(lambda: partial.jit_fn[grid](x, *outs, XBLOCK=xb, RBLOCK=rb, num_warps=warps),
                          warmup=10, rep=50)
        except Exception as e:   # too many registers, shared memory
            print(f"XBLOCK {xb:3d} RBLOCK {rb:2d} warps {warps}: {type(e).__name__}")
            continue
        rows.append((ms, xb, rb, warps))
        print(f"XBLOCK {xb:3d} RBLOCK {rb:2d} warps {warps}: {ms * 1e3:7.1f} us  "
              f"{ideal / (ms * 1e-3) / 1e12:.2f} TB/s", flush=True)
    rows.sort()
    print("fastest:", [(f"{ms * 1e3:.1f} us", xb, rb, w) for ms, xb, rb, w in rows[:5]])


if __name__ == "__main__":
    main()
