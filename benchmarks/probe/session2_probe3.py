"""Session-2 probe 3: (G) BERT-base bf16 8x512 train step under brrr with torch's attention choice (cuDNN
first on the H100) against brrr with cuDNN attention excluded at compile time, beside eager: do_bench,
back-to-back and the top kernels; (H) garbage-collection time inside brrr.analyze on BERT-base."""
import gc
import statistics
import sys
import time

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from brrr.compile.backend import brrr_backend
from brrr.examples import build_example

part = sys.argv[1] if len(sys.argv) > 1 else "GH"

if "G" in part:
    model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
    params = [p for p in model.parameters()]

    def make(fn):
        def step():
            for p in params:
                p.grad = None
            fn(ids).last_hidden_state.float().sum().backward()
        return step

    variants = {"eager": (model, None)}
    for name, backends in (("brrr", None), ("brrr-no-cudnn", [SDPBackend.FLASH_ATTENTION,
                                                              SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])):
        torch._dynamo.reset()
        fn = torch.compile(model, backend=brrr_backend)
        step = make(fn)
        if backends:
            with sdpa_kernel(backends):
                step()
        else:
            step()
        variants[name] = (fn, step)
        for v, (f, s) in list(variants.items()):
            pass
        ms = triton.testing.do_bench(step, warmup=25, rep=200)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        b2b = (time.perf_counter() - t0) / 20
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        print(f"G {name}: do_bench {ms:.2f} ms, back-to-back {b2b*1e3:.2f} ms", flush=True)
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:10]:
            if e.self_device_time_total > 0:
                print(f"   {e.key[:90]:90s} n={e.count:4d} {e.self_device_time_total/1e3:7.3f} ms")
    step = make(model)
    print(f"G eager: do_bench {triton.testing.do_bench(step, warmup=25, rep=200):.2f} ms")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:10]:
        if e.self_device_time_total > 0:
            print(f"   {e.key[:90]:90s} n={e.count:4d} {e.self_device_time_total/1e3:7.3f} ms")
    del model, variants

if "H" in part:
    import brrr
    model, inputs = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
    spent = []

    def on_gc(phase, info):
        if phase == "start":
            spent.append([time.perf_counter(), None, info["generation"]])
        else:
            spent[-1][1] = time.perf_counter()
    brrr.analyze(model, *inputs)
    gc.callbacks.append(on_gc)
    totals = []
    for _ in range(7):
        spent.clear()
        t0 = time.perf_counter()
        brrr.analyze(model, *inputs)
        total = time.perf_counter() - t0
        gcs = [(e - s, g) for s, e, g in spent if e]
        totals.append(total)
        print(f"H analyze {total*1e3:.1f} ms, gc {sum(d for d, _ in gcs)*1e3:.1f} ms in {len(gcs)} collections "
              f"(generations {sorted(g for _, g in gcs)})")
    gc.callbacks.remove(on_gc)
