"""Session-4 probe 1: where one analysis of BERT-base bf16 8x512 inference spends its time on the H100 host,
first analysis in a process included; the fixed costs of a profiler session; the Kineto event processing; the
step right after a traced step (CUPTI torn down); the traced step's per-op cost by part."""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import brrr  # noqa: E402,F401
from analyze_overhead import analyze_module, timed_analysis  # noqa: E402
from brrr.analyze.capture import OpTracer, record_step  # noqa: E402
from brrr.analyze.step import Step  # noqa: E402
from brrr.analyze import timing  # noqa: E402
from brrr.examples import build_example  # noqa: E402
from probe_common import median_ms as ms, profile_report  # noqa: E402

print("inductor imported at start:", "torch._inductor" in sys.modules, flush=True)
model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
from brrr.cost.device import get_ceilings  # noqa: E402
t0 = time.perf_counter()
ceil = get_ceilings("cuda", progress=False)
print(f"ceilings {time.perf_counter() - t0:.2f} s; inductor imported now:", "torch._inductor" in sys.modules, flush=True)
step = Step(model, (ids,))


for _ in range(3):
    step()
eager = ms(step)
print(f"eager step {eager:.2f} ms", flush=True)

for i in range(4):
    tot, stages, _ = timed_analysis(model, ids, ceilings=ceil)
    print(f"analysis {i}: {tot:.1f} ms = {tot / eager:.1f}x;", {k: round(v, 1) for k, v in stages.items()}, flush=True)
print("inductor imported after analyses:", "torch._inductor" in sys.modules)

# fixed costs of a profiler session
for label, env in (("teardown", "1"), ("no teardown", "0")):
    os.environ["TEARDOWN_CUPTI"] = env
    for i in range(3):
        t0 = time.perf_counter()
        cm = timing.profiled(torch.device("cuda"))
        cm.__enter__()
        t1 = time.perf_counter()
        cm.__exit__(None, None, None)
        t2 = time.perf_counter()
        print(f"profiled() {label}: enter {(t1 - t0) * 1e3:.1f} ms, exit {(t2 - t1) * 1e3:.1f} ms", flush=True)
os.environ["TEARDOWN_CUPTI"] = "1"
from torch.autograd import profiler as aprof  # noqa: E402
for i in range(3):
    t0 = time.perf_counter()
    p = aprof.profile(use_cpu=True, use_device="cuda", experimental_config=timing._lean_config())
    p.__enter__()
    t1 = time.perf_counter()
    p.__exit__(None, None, None)
    t2 = time.perf_counter()
    print(f"autograd.profiler.profile: enter {(t1 - t0) * 1e3:.1f} ms, exit {(t2 - t1) * 1e3:.1f} ms", flush=True)

# event processing
with timing.profiled(torch.device("cuda")) as prof:
    trace = record_step(step)
t0 = time.perf_counter()
events = prof.kineto_results.events()
t1 = time.perf_counter()
records = trace.records()
t2 = time.perf_counter()
timing.cuda_op_times(prof, len(records))
t3 = time.perf_counter()
print(f"{len(events)} kineto events for {len(records)} ops: events() {(t1 - t0) * 1e3:.1f} ms, "
      f"records() {(t2 - t1) * 1e3:.1f} ms, cuda_op_times {(t3 - t2) * 1e3:.1f} ms", flush=True)
kinds = {}
for e in events:
    key = "cpu" if e.device_type() == torch.autograd.DeviceType.CPU else "dev"
    name = e.name()
    key += ":range" if name.startswith("brrr#") else (":launch" if timing._is_launch_call(name) else ":other")
    kinds[key] = kinds.get(key, 0) + 1
print("event kinds", kinds, flush=True)

# the plain step right after a traced one (CUPTI torn down)
after = []
for i in range(5):
    with timing.profiled(torch.device("cuda")):
        record_step(step).records()
    after.append(ms(step, 1))
print(f"plain step right after a traced step: {[round(a, 2) for a in after]} ms (eager {ms(step):.2f})", flush=True)

# the traced step, part by part (no profiler unless said)


def traced(record_costs, mark_ranges):
    def run():
        with OpTracer(model, record_costs=record_costs, mark_ranges=mark_ranges):
            step()
    return run


n_ops = len(records)
for label, fn in (("mode only", traced(False, False)), ("mode + note", traced(True, False)),
                  ("mode + ranges", traced(False, True)), ("mode + note + ranges", traced(True, True))):
    t = ms(fn, 10)
    print(f"{label:24s} {t:.2f} ms (+{(t - eager) / n_ops * 1e3:.1f} us/op)", flush=True)


def in_profiler(fn):
    def run():
        with timing.profiled(torch.device("cuda"), warm_up=False):
            fn()
    return run


for label, fn in (("profiler, plain step", in_profiler(step)),
                  ("profiler, note + ranges", in_profiler(traced(True, True)))):
    t = ms(fn, 5)
    print(f"{label:24s} {t:.2f} ms incl. start/stop", flush=True)
print(f"eager again {ms(step):.2f} ms", flush=True)
print(profile_report(lambda: analyze_module.analyze(model, ids, ceilings=ceil), 3, sorts=("tottime",), rows=35))
