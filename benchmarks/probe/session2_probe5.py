"""Session-2 probe 5: does the launch configuration of brrr's layer-norm and GELU kernels matter? The seed
MLP's LN kernel took 24 us where Inductor's took 19 (bf16 [16384, 1024]). Times brrr's generated kernels
(from brrr.explain) over XBLOCK x num_warps, inputs rotated past L2, with triton.testing.do_bench."""
import importlib.util
import itertools
import math
import os
import tempfile

import torch
import triton

from brrr.compile.explain import explain
from brrr.examples import mlp

model, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
e = explain(model, x)
for k in e.kernels:
    name = k.name.split(".")[-1]
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(k.source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = getattr(mod, name)
    reduction = "RBLOCK" in k.source
    sets = [(torch.randn(16384, 1024, device="cuda", dtype=torch.bfloat16),) for _ in range(6)]
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16384, 1024, device="cuda", dtype=torch.bfloat16)
    print(k.name, k.ops, "reduction" if reduction else "pointwise", flush=True)
    xblocks = (1, 2, 4, 8, 16) if reduction else (512, 1024, 2048, 4096)
    for xb, nw in itertools.product(xblocks, (2, 4, 8, 16)):
        if reduction:
            grid = (math.ceil(16384 / xb),)
            calls = [lambda s=s: fn[grid](s[0], w, w, out, XBLOCK=xb, RBLOCK=1024, num_warps=nw) for s in sets]
        else:
            grid = (math.ceil(16384 * 1024 / xb),)
            calls = [lambda s=s: fn[grid](s[0], out, XBLOCK=xb, num_warps=nw) for s in sets]
        try:
            for c in calls:
                c()
            i = [0]

            def one():
                calls[i[0] % len(calls)]()
                i[0] += 1
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(12):
                    one()
            ms = triton.testing.do_bench(g.replay, warmup=20, rep=100) / 12
            print(f"  XBLOCK={xb:5d} num_warps={nw:2d}: {ms*1e3:6.1f} us  {2**26 / ms / 1e9:6.2f} TB/s",
                  flush=True)
        except Exception as ex:
            print(f"  XBLOCK={xb} num_warps={nw}: {type(ex).__name__}")
