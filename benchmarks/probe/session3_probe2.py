"""Session-3 probe 2 (lean runtime + in-place outputs). A: seed MLP bf16 16384 inference and train step, with
Inductor timed after brrr and brrr timed again after Inductor (does Inductor's compile-worker start-up slow the
host for whoever is timed next?). B: device time per kernel of one MLP train step: eager, brrr, Inductor.
C: BERT-base bf16 8x512 train step: eager, brrr, Inductor."""
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from brrr.bench import bench
from brrr.compile.backend import brrr_backend
from brrr.examples import mlp
from probe_common import SeedMLPTrain, brrr_with_env

parts = sys.argv[1] if len(sys.argv) > 1 else "ABC"


aot_runtime_backend = brrr_with_env("brrr-aot-runtime", BRRR_AOT_RUNTIME="1")
brrr_again = brrr_with_env("brrr-after-inductor")
ms = lambda v: "-" if v is None else f"{v*1e3:.3f}"  # noqa: E731


def show(tag, r):
    for row in r.rows:
        print(f"{tag} {row.backend:20s} {row.status:6s} median {ms(row.median_s)} steady {ms(row.steady_s)} "
              f"graph {ms(row.graph_s)} ms cold {row.cold_compile_s and f'{row.cold_compile_s:.1f}'} s "
              f"{row.reason or ''}", flush=True)


if "A" in parts:
    for train in (False, True):
        model, inputs = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
        r = bench(model, *inputs, backends=["eager", "brrr", aot_runtime_backend, "inductor", brrr_again],
                  train=train, warmup=25, rep=100, compile_warm=False, graph_timing=not train)
        show(f"A mlp {'train' if train else 'inference'}", r)

if "B" in parts:
    mlp_train = SeedMLPTrain()
    for name, be in (("eager", None), ("brrr", brrr_backend), ("inductor", "inductor")):
        step = mlp_train.step(be)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        totals = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                totals.setdefault(e.name, []).append(e.device_time)
        busy = sum(sum(v) for v in totals.values()) / 20
        print(f"B {name}: device busy {busy:.1f} us per step", flush=True)
        for k, v in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
            print(f"B {name}: {k[:80]:80s} n/step={len(v)/20:4.1f} mean {statistics.mean(v):7.1f} us "
                  f"per step {sum(v)/20:7.1f}", flush=True)

if "C" in parts:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from suite_sections import HiddenStates

    from brrr.examples import build_example
    model, inputs = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
    r = bench(HiddenStates(model, use_cache_kwarg=False), *inputs, backends=["eager", "brrr", "inductor", brrr_again], train=True,
              warmup=25, rep=100, compile_warm=False)
    show("C bert-base train", r)
