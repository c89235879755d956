"""Session-3 probe 6: the seed MLP's inference (bf16, batch 16384) against Inductor, kernel launch configs swept
in context (brrr's GELU and layer-norm kernels now write over the matmul outputs). Each config: a fresh brrr
compile, device time per call from CUDA-graph replays of 10 calls. Inductor and eager timed the same way."""
import itertools

import torch

import brrr.compile.codegen.triton as cg
from brrr.bench.timing import time_graph
from brrr.compile.backend import brrr_backend
from brrr.examples import mlp

model, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
xs = [torch.randn_like(x) for _ in range(4)]
calls = [0]


def timed(fn):
    def call():
        calls[0] += 1
        with torch.no_grad():
            return fn(xs[calls[0] % len(xs)])
    t = time_graph(call, "cuda", calls=12, warmup=50, rep=300)
    return t.median_s * 1e6


print(f"eager    {timed(model):6.1f} us", flush=True)
torch._dynamo.reset()
print(f"inductor {timed(torch.compile(model, backend='inductor')):6.1f} us", flush=True)
torch._dynamo.reset()
print(f"brrr     {timed(torch.compile(model, backend=brrr_backend)):6.1f} us (defaults)", flush=True)

real_pointwise, real_reduction = cg.Codegen.gen_pointwise, cg.Codegen.gen_reduction
for xblock, warps in itertools.product((512, 1024, 2048, 4096), (4, 8, 16)):
    def gen_pointwise(self, roots, xblock=xblock, warps=warps):
        body, meta = real_pointwise(self, roots)
        n = self.k.xnumel()
        return body, dict(XBLOCK=xblock, num_warps=warps, grid=(-(-n // xblock),))
    cg.Codegen.gen_pointwise = gen_pointwise
    torch._dynamo.reset()
    print(f"brrr pointwise XBLOCK={xblock:4d} warps={warps:2d}: {timed(torch.compile(model, backend=brrr_backend)):6.1f} us",
          flush=True)
cg.Codegen.gen_pointwise = real_pointwise
for rows, warps in itertools.product((1, 2, 4, 8), (2, 4, 8, 16)):
    def gen_reduction(self, roots, reds, rows=rows, warps=warps):
        body, meta = real_reduction(self, roots, reds)
        if meta.get("RBLOCK") == 1024:
            meta = dict(meta, XBLOCK=rows, num_warps=warps, grid=(-(-self.k.xnumel() // rows),))
        return body, meta
    cg.Codegen.gen_reduction = gen_reduction
    torch._dynamo.reset()
    print(f"brrr layer norm rows={rows} warps={warps:2d}: {timed(torch.compile(model, backend=brrr_backend)):6.1f} us",
          flush=True)
