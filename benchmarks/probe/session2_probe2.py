"""Session-2 probe 2: (D) the fixed host cost of a compiled train step (tiny model: eager vs aot_eager vs
brrr), (E) where brrr's seed-MLP train step spends host time now (cProfile), (F) BERT-base bf16 inference
under brrr: device time by kernel, launches, and the attention op in the graph."""
import cProfile
import os
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from brrr.compile.backend import brrr_backend
from brrr.examples import build_example, mlp

part = sys.argv[1] if len(sys.argv) > 1 else "DEF"


def host_per_step(step, n=200):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


if "D" in part:
    lin = torch.nn.Linear(8, 8, device="cuda")
    x = torch.randn(4, 8, device="cuda")
    for name, be in (("eager", None), ("aot_eager", "aot_eager"), ("inductor", "inductor"), ("brrr", brrr_backend)):
        torch._dynamo.reset()
        fn = lin if be is None else torch.compile(lin, backend=be)

        def train():
            lin.weight.grad = lin.bias.grad = None
            fn(x).sum().backward()

        def infer():
            with torch.no_grad():
                fn(x)
        print(f"D tiny linear {name}: train step {host_per_step(train)*1e6:.0f} us, "
              f"inference {host_per_step(infer)*1e6:.0f} us", flush=True)

if "E" in part:
    model, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
    cot = torch.randn_like(x)
    params = list(model.parameters())
    torch._dynamo.reset()
    fn = torch.compile(model, backend=brrr_backend)

    def step():
        for p in params:
            p.grad = None
        torch.autograd.backward([fn(x)], [cot])
    print(f"E brrr MLP train: {host_per_step(step)*1e6:.0f} us per step (back to back)")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        step()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)

if "F" in part:
    os.environ["BRRR_DUMP_DIR"] = os.path.join(os.environ.get("OUT", "/tmp"), "bert-dump")
    model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
    for name, be in (("eager", None), ("brrr", brrr_backend), ("inductor", "inductor")):
        torch._dynamo.reset()
        fn = model if be is None else torch.compile(model, backend=be)
        with torch.no_grad():
            for _ in range(3):
                fn(ids)
            torch.cuda.synchronize()
            host = host_per_step(lambda: fn(ids), n=20)
            torch.cuda.reset_peak_memory_stats()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                fn(ids)
                torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**20
        events = [e for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(e.self_device_time_total for e in events)
        print(f"F {name}: back-to-back {host*1e3:.2f} ms/call, kernels {total/1e3:.2f} ms, peak {peak:.0f} MiB")
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:14]:
            print(f"   {e.key[:80]:80s} n={e.count:4d} total {e.self_device_time_total/1e3:7.3f} ms")
    os.system(f"grep -ho 'aten[._a-z]*attention[._a-z]*' {os.environ['BRRR_DUMP_DIR']}/*.py | sort | uniq -c")
