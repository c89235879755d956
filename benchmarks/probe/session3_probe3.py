"""Session-3 probe 3: where the seed MLP's train step spends host time under brrr's lean runtime.
A: host time per call of the ATen matmuls and a direct Triton launch, with the device kept busy.
B: cProfile of brrr's train step by cumulative time, and who calls the costly ATen builtins.
C: bench of the train step: eager, brrr, brrr-cudagraphs (same process, no Inductor)."""
import sys
import time

import torch

from brrr.bench import bench
from brrr.compile.backend import brrr_backend
from brrr.examples import mlp
from probe_common import profile_report

parts = sys.argv[1] if len(sys.argv) > 1 else "ABC"
aten = torch.ops.aten


def host_us(fn, n=200):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    big = torch.empty(1 << 28, device="cuda")
    big.zero_()   # keep the device busy so host time is what we see
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t


if "A" in parts:
    x = torch.randn(16384, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    wt = w.t()
    small = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    print(f"A addmm._op(b, x, w.t()) {host_us(lambda: aten.addmm.default._op(b, x, wt)):.1f} us", flush=True)
    print(f"A torch.addmm          {host_us(lambda: torch.addmm(b, x, wt)):.1f} us", flush=True)
    print(f"A F.linear             {host_us(lambda: torch.nn.functional.linear(x, w, b)):.1f} us", flush=True)
    print(f"A mm._op(x, w.t())     {host_us(lambda: aten.mm.default._op(x, wt)):.1f} us", flush=True)
    print(f"A mm._op(x.t(), x)     {host_us(lambda: aten.mm.default._op(x.t(), x)):.1f} us", flush=True)
    print(f"A small mm             {host_us(lambda: aten.mm.default._op(small, small)):.1f} us", flush=True)
    print(f"A x.sum(0)             {host_us(lambda: x.sum(0)):.1f} us", flush=True)
    print(f"A empty_strided        {host_us(lambda: torch.empty_strided((16384, 1024), (1024, 1), dtype=torch.bfloat16, device='cuda')):.1f} us", flush=True)
    print(f"A gelu                 {host_us(lambda: torch.nn.functional.gelu(x)):.1f} us", flush=True)

if "B" in parts:
    model, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
    cot = torch.randn_like(x)
    params = list(model.parameters())
    torch._dynamo.reset()
    fn = torch.compile(model, backend=brrr_backend)

    def step():
        for p in params:
            p.grad = None
        torch.autograd.backward([fn(x)], [cot])
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    print(f"B brrr train: {host_us(step, n=100):.0f} us host per step (device kept busy)", flush=True)
    print(profile_report(step, 100, sorts=("cumulative",), rows=35, callers="aten"))
    torch._dynamo.reset()

    def eager_step():
        for p in params:
            p.grad = None
        torch.autograd.backward([model(x)], [cot])
    print(f"B eager train: {host_us(eager_step, n=100):.0f} us host per step (device kept busy)", flush=True)

if "C" in parts:
    model, inputs = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
    r = bench(model, *inputs, backends=["eager", "brrr", "brrr-cudagraphs"], train=True, warmup=25, rep=100,
              compile_warm=False)
    for row in r.rows:
        print(f"C {row.backend:18s} {row.status} median {row.median_s*1e3:.3f} steady {row.steady_s*1e3:.3f} ms "
              f"{row.reason or ''}", flush=True)
