"""Session-3 probe 3: where the seed MLP's train step spends host time under brrr's lean runtime.
A: host time per call of the ATen matmuls and a direct Triton launch, with the device kept busy.
B: cProfile of brrr's train step by cumulative time, and who calls the costly ATen builtins.
C: bench of the train step: eager, brrr, brrr-cudagraphs (same process, no Inductor)."""
import sys

import torch

from brrr.bench import bench
from brrr.compile.backend import brrr_backend
from brrr.examples import mlp
from probe_common import SeedMLPTrain, host_seconds, profile_report


def host_us(fn, n=200):
    return host_seconds(fn, n, warmup=5, busy_gib=1, fills=1) * 1e6  # one 1 GiB fill queued, as when first run


parts = sys.argv[1] if len(sys.argv) > 1 else "ABC"
aten = torch.ops.aten


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
    mlp_train = SeedMLPTrain()
    step = mlp_train.step(brrr_backend)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    print(f"B brrr train: {host_us(step, n=100):.0f} us host per step (device kept busy)", flush=True)
    print(profile_report(step, 100, sorts=("cumulative",), rows=35, callers="aten"))
    eager_step = mlp_train.step()
    print(f"B eager train: {host_us(eager_step, n=100):.0f} us host per step (device kept busy)", flush=True)

if "C" in parts:
    model, inputs = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
    r = bench(model, *inputs, backends=["eager", "brrr", "brrr-cudagraphs"], train=True, warmup=25, rep=100,
              compile_warm=False)
    for row in r.rows:
        print(f"C {row.backend:18s} {row.status} median {row.median_s*1e3:.3f} steady {row.steady_s*1e3:.3f} ms "
              f"{row.reason or ''}", flush=True)
