"""Session-6 probe 2 (results: ...-analyze-parts-session6-probe4.log), BERT-base bf16 8x512 inference:

1. Does the CUPTI teardown launch on a helper thread save time? Component times, inline against thread,
   alternating over rounds: the profiler session's exit, the event reading, pricing and links, the
   classification, and analyze's final wait for the thread. The whole-analysis ratios of probe 1 (three runs)
   could not tell the two apart within the hosts' noise.
2. Why do some later analyses still take two wall-time runs? Per analysis: the known warm run, each plain
   run, and whether the allocator grew during it.
"""
import os
import statistics
import sys
import time
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brrr  # noqa: E402,F401
from brrr.analyze import capture, timing  # noqa: E402
from probe_common import bert_base_inference, exit_unless_teardown_thread, median_ms, session_timed  # noqa: E402

analyze_module = sys.modules["brrr.analyze"]
exit_unless_teardown_thread(timing)
model, ids, step, ceil = bert_base_inference()
ROUNDS = int(os.environ.get("ROUNDS", "20"))
parts = defaultdict(float)


def timed(name, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            parts[name] += (time.perf_counter() - start) * 1e3
    return wrapper


def add_part(name, ms):
    parts[name] += ms


analyze_module.profiled = session_timed(analyze_module.profiled, add_part)
analyze_module.record_step = timed("traced step", analyze_module.record_step)
analyze_module._profiled_times = timed("event reading", analyze_module._profiled_times)
capture.Trace.records = timed("pricing + links", capture.Trace.records)
real_from = analyze_module.Analysis.__dict__["from_measurements"].__func__
analyze_module.Analysis.from_measurements = classmethod(timed("classify", real_from))
analyze_module.finish_teardown = timed("final wait", analyze_module.finish_teardown)

runs_log = []
real_timed_runs = analyze_module.timed_runs
real_reserved = timing._reserved_bytes


def logged_timed_runs(step, device, runs=1, recompiles=2, warm_s=None):
    grew = []

    def reserved(device):
        value = real_reserved(device)
        grew.append(value)
        return value

    timing._reserved_bytes = reserved
    try:
        samples = timed_runs_inner(step, device, runs, recompiles, warm_s)
    finally:
        timing._reserved_bytes = real_reserved
    runs_log.append((warm_s, samples, grew))
    return samples


timed_runs_inner = real_timed_runs
analyze_module.timed_runs = timed("wall runs", logged_timed_runs)

real_start = timing._TEARDOWN.start


def inline_start(device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    timing._CuptiTeardown._launch(index)


for _ in range(3):
    step()
brrr.analyze(model, ids, ceilings=ceil)
runs_log.clear()
rows = defaultdict(lambda: defaultdict(list))
for r in range(ROUNDS):
    for name in ("inline", "thread"):
        timing._TEARDOWN.start = inline_start if name == "inline" else real_start
        with torch.no_grad():
            eager = median_ms(lambda: model(ids), n=5)
        parts.clear()
        torch.cuda.synchronize()
        start = time.perf_counter()
        brrr.analyze(model, ids, ceilings=ceil)
        total = (time.perf_counter() - start) * 1e3
        rows[name]["total"].append(total)
        rows[name]["ratio"].append(total / eager)
        for part, ms in parts.items():
            rows[name][part].append(ms)
timing._TEARDOWN.start = real_start

print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {ROUNDS} rounds alternating; medians in ms")
names = list(rows["inline"])
print(f"{'part':18s}" + "".join(f"{n:>10s}" for n in rows))
for part in names:
    print(f"{part:18s}" + "".join(f"{statistics.median(rows[n][part]):10.2f}" for n in rows))
print("\nwall-time runs per analysis: known warm run -> plain runs (ms), allocator growth")
two = 0
for warm_s, samples, reserved in runs_log:
    grew = len(set(reserved)) > 1
    two += len(samples) > 1
    known = f"{warm_s * 1e3:.2f}" if warm_s else "-"
    print(f"  {known:>6s} -> {' '.join(f'{s * 1e3:.2f}' for s in samples)}  ratio {samples[0] / warm_s if warm_s else 0:.3f}"
          f"{'  allocator grew' if grew else ''}")
print(f"{two} of {len(runs_log)} analyses took a second run")
