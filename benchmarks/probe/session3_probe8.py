"""Session-3 probe 8: where brrr's BERT-base bf16 8x512 train step spends host time (lean runtime, no CUDA
graphs): back-to-back step times for eager and brrr, then cProfile of 10 brrr steps (tottime and cumulative)."""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from suite_sections import HiddenStates  # noqa: E402

from brrr.compile.backend import brrr_backend  # noqa: E402
from brrr.examples import build_example  # noqa: E402
from probe_common import profile_report  # noqa: E402

model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
model = HiddenStates(model, use_cache_kwarg=False)
params = [p for p in model.parameters() if p.requires_grad]
cot = None


def make_step(fn):
    def step():
        global cot
        for p in params:
            p.grad = None
        out = fn(ids)
        if cot is None:
            cot = torch.randn_like(out)
        torch.autograd.backward([out], [cot])
    return step


def b2b_ms(step, n=20):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def host_ms(step, n=10):
    """host time per step with the device kept busy (a big fill queued first)."""
    torch.cuda.synchronize()
    big = torch.empty(1 << 31, device="cuda", dtype=torch.uint8)
    for _ in range(40):
        big.fill_(1)   # ~40 x 0.7 ms of device work queued
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize()
    return t


eager = make_step(model)
print(f"eager: back to back {b2b_ms(eager):.2f} ms, host {host_ms(eager):.2f} ms per step", flush=True)
torch._dynamo.reset()
brrr = make_step(torch.compile(model, backend=brrr_backend))
print(f"brrr: back to back {b2b_ms(brrr):.2f} ms, host {host_ms(brrr):.2f} ms per step", flush=True)
print(profile_report(brrr, 10, sorts=("tottime", "cumulative"), rows=28))
