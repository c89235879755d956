"""Session-3 probe. A: seed MLP bf16 16384 train/inference, eager vs Inductor vs brrr (lean runtime) vs brrr with
AOTAutograd's runtime (BRRR_AOT_RUNTIME=1) vs brrr-cudagraphs, same process. B: host time of a tiny Linear train
step per backend. C: cProfile of brrr's MLP train step. D: MLP inference kernels, brrr vs Inductor, and
Inductor's code. E: where brrr.analyze's traced step spends host time on BERT-base bf16 8x512 inference."""
import os
import statistics
import sys
import time

import torch

from brrr.bench import bench
from brrr.compile.backend import brrr_backend
from brrr.examples import build_example, mlp
from probe_common import SeedMLPTrain, back_to_back_s, brrr_with_env, median_ms, profile_report, tiny_linear_steps

OUT = os.environ.get("OUT", "/tmp")
parts = sys.argv[1] if len(sys.argv) > 1 else "ABCDE"


aot_runtime_backend = brrr_with_env("brrr-aot-runtime", BRRR_AOT_RUNTIME="1")


if "A" in parts:
    for train in (True, False):
        model, inputs = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
        backends = ["eager", "inductor", "brrr", aot_runtime_backend, "brrr-cudagraphs"]
        r = bench(model, *inputs, backends=backends, train=train, warmup=25, rep=100, compile_warm=False,
                  graph_timing=not train, label="seed MLP 16384 bf16")
        for row in r.rows:
            ms = lambda v: "-" if v is None else f"{v*1e3:.3f}"  # noqa: E731
            print(f"A {'train' if train else 'inference'} {row.backend:18s} {row.status:6s} median {ms(row.median_s)} "
                  f"steady {ms(row.steady_s)} graph {ms(row.graph_s)} ms  {row.reason or ''}", flush=True)

if "B" in parts:
    for name, be in (("eager", None), ("inductor", "inductor"), ("brrr", brrr_backend),
                     ("brrr-aot-runtime", aot_runtime_backend)):
        train, infer = tiny_linear_steps(be)
        print(f"B tiny linear {name}: train step {back_to_back_s(train, reps=5)*1e6:.0f} us, "
              f"inference {back_to_back_s(infer, reps=5)*1e6:.0f} us", flush=True)

if "C" in parts:
    mlp_train = SeedMLPTrain()
    for name, be in (("brrr", brrr_backend), ("brrr-aot-runtime", aot_runtime_backend), ("eager", None)):
        step = mlp_train.step(be)
        print(f"C {name} MLP train: {back_to_back_s(step, n=100, reps=5)*1e6:.0f} us per step (back to back)",
              flush=True)
        if name == "brrr":
            print(profile_report(step, 100, rows=25))

if "D" in parts:
    from torch.profiler import ProfilerActivity, profile
    model, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
    for name, be in (("brrr", brrr_backend), ("inductor", "inductor")):
        torch._dynamo.reset()
        fn = torch.compile(model, backend=be)
        with torch.no_grad():
            if name == "inductor":
                from torch._inductor.utils import run_and_get_code
                _, codes = run_and_get_code(fn, x)
                with open(os.path.join(OUT, "inductor-mlp-inference.py"), "w") as f:
                    f.write("\n\n".join(codes))
            for _ in range(5):
                fn(x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn(x)
                torch.cuda.synchronize()
        totals = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                totals.setdefault(e.name, []).append(e.device_time)
        for k, v in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
            print(f"D {name}: {k[:90]:90s} n={len(v):3d} mean {statistics.mean(v):7.1f} us", flush=True)

if "E" in parts:
    from brrr.analyze.capture import record_step
    from brrr.analyze.step import Step
    import brrr
    model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
    step = Step(model, (ids,), train=False)

    def timed(fn, n=7):
        return median_ms(fn, n) / 1e3
    for _ in range(3):
        step()
    eager = timed(step)
    traced = timed(lambda: record_step(step, mark_ranges=True))
    plain_mode = timed(lambda: record_step(step, mark_ranges=False))
    n_ops = len(record_step(step).raw)
    print(f"E eager {eager*1e3:.2f} ms, record_step {traced*1e3:.2f} ms, record_step no ranges "
          f"{plain_mode*1e3:.2f} ms, {n_ops} ops", flush=True)
    # host cost alone: the step with the device work already queued is hidden; time host work per op
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    host_eager = time.perf_counter() - t0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    record_step(step, mark_ranges=True)
    host_traced = time.perf_counter() - t0
    torch.cuda.synchronize()
    print(f"E host only (no sync): eager {host_eager*1e3:.2f} ms, traced {host_traced*1e3:.2f} ms", flush=True)
    print(profile_report(lambda: record_step(step, mark_ranges=True), 3, rows=30))
    for i in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        a = brrr.analyze(model, ids)
        torch.cuda.synchronize()
        print(f"E analyze #{i}: {(time.perf_counter() - t0)*1e3:.1f} ms = {(time.perf_counter() - t0)/eager:.1f}x eager",
              flush=True)
