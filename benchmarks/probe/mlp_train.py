"""Why is the compiled seed-MLP train step (bf16, batch 16384) slower than eager on the H100?

Times eager, aot_eager, inductor and brrr through brrr.bench, then prints the top CUDA kernels of one
brrr-compiled and one eager step (torch.profiler), to tell harness overhead from slow kernels.
"""
import torch
from rich.console import Console
from torch.profiler import ProfilerActivity, profile

import brrr
from brrr.compile.backend import brrr_backend
from brrr.examples import mlp

console = Console(width=200)
model, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
brrr.bench(model, x, backends=["eager", "aot_eager", "inductor", brrr_backend], train=True).print(console)


def kernels(fn, title):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    print(title)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))


x.requires_grad_(False)
compiled = torch.compile(model, backend=brrr_backend)
kernels(lambda: model(x).float().sum().backward(), "eager")
kernels(lambda: compiled(x).float().sum().backward(), "brrr")
