"""Session-3 probe 9: the seed MLP's layer norm kernel in context (right after the matmul that writes its
input, overwritten in place), brrr's kernel and variants against Inductor's kernel body. Each variant: a CUDA
graph of 10 x (addmm -> LN in place), replay timed by do_bench; the matmul alone is subtracted."""
import importlib.util
import os
import tempfile

import torch
import triton
from triton.testing import do_bench

from brrr.compile.explain import explain
from brrr.examples import mlp

model, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
src = [k.source for k in explain(model, x).kernels if "RBLOCK" in k.source][0]
w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
W = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
bias = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
buf = torch.empty(16384, 1024, device="cuda", dtype=torch.bfloat16)

INDUCTOR = '''
import triton
import triton.language as tl

@triton.jit
def ind(in_out_ptr0, in_ptr0, in_ptr1, XBLOCK: tl.constexpr):
    R0_BLOCK: tl.constexpr = 1024
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    r0_1 = tl.arange(0, R0_BLOCK)[None, :]
    x0 = xindex
    tmp0 = tl.load(in_out_ptr0 + (r0_1 + 1024*x0), None).to(tl.float32)
    tmp22 = tl.load(in_ptr0 + (r0_1), None, eviction_policy='evict_last').to(tl.float32)
    tmp25 = tl.load(in_ptr1 + (r0_1), None, eviction_policy='evict_last').to(tl.float32)
    tmp6 = tl.sum(tmp0, 1)[:, None]
    tmp9 = tmp6 / 1024.0
    tmp10 = tmp0 - tmp9
    tmp14 = tl.sum(tmp10 * tmp10, 1)[:, None]
    tmp20 = tl.rsqrt(tmp14 / 1024.0 + 1e-05)
    tmp27 = tmp10 * tmp20 * tmp22 + tmp25
    tl.store(in_out_ptr0 + (r0_1 + 1024*x0), tmp27, None)
'''


def load(text, name):
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def graph_us(body):
    for _ in range(3):
        body()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            body()
    return do_bench(g.replay, warmup=50, rep=300) * 1e3 / 10


def mm():
    torch.addmm(bias, x, W.t(), out=buf)


base = graph_us(mm)
print(f"addmm alone {base:.1f} us", flush=True)
variants = {
    "brrr": src,
    "brrr, weights evict_last": src.replace("tl.load(in_ptr1 + (rindex))", "tl.load(in_ptr1 + (rindex), eviction_policy='evict_last')")
                                   .replace("tl.load(in_ptr2 + (rindex))", "tl.load(in_ptr2 + (rindex), eviction_policy='evict_last')"),
    "brrr, no double cast": src.replace("tl.cast(tl.cast(tmp14, tl.bfloat16), tl.float32)", "tmp14"),
}
k1 = None
for label, text in variants.items():
    fn = load(text, "k1")
    for rows, warps in ((1, 4), (2, 4), (4, 8), (8, 8)):
        def body(fn=fn, rows=rows, warps=warps):
            mm()
            fn[(16384 // rows,)](buf, w, b, buf, XBLOCK=rows, RBLOCK=1024, num_warps=warps)
        print(f"{label:28s} rows={rows} warps={warps}: LN {graph_us(body) - base:5.1f} us", flush=True)
ind = load(INDUCTOR, "ind")
for rows, warps in ((1, 4), (2, 4), (4, 8), (8, 8)):
    def body(rows=rows, warps=warps):
        mm()
        ind[(16384 // rows,)](buf, w, b, XBLOCK=rows, num_warps=warps)
    print(f"{'inductor body':28s} rows={rows} warps={warps}: LN {graph_us(body) - base:5.1f} us", flush=True)
