"""Session-2 probe 2: (D) the fixed host cost of a compiled train step (tiny model: eager vs aot_eager vs
brrr), (E) where brrr's seed-MLP train step spends host time now (cProfile), (F) BERT-base bf16 inference
under brrr: device time by kernel, launches, and the attention op in the graph."""
import cProfile
import os
import pstats
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from brrr.compile.backend import brrr_backend
from brrr.examples import build_example
from probe_common import SeedMLPTrain, back_to_back_s, tiny_linear_steps

part = sys.argv[1] if len(sys.argv) > 1 else "DEF"


if "D" in part:
    for name, be in (("eager", None), ("aot_eager", "aot_eager"), ("inductor", "inductor"), ("brrr", brrr_backend)):
        train, infer = tiny_linear_steps(be)
        print(f"D tiny linear {name}: train step {back_to_back_s(train)*1e6:.0f} us, "
              f"inference {back_to_back_s(infer)*1e6:.0f} us", flush=True)

if "E" in part:
    step = SeedMLPTrain().step(brrr_backend)
    print(f"E brrr MLP train: {back_to_back_s(step)*1e6:.0f} us per step (back to back)")
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
            host = back_to_back_s(lambda: fn(ids), n=20)
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
