"""Session-5 probe (results: ...-analyze-cost-parts-session5-probe4.log):
where the traced step's extra time goes now (views without ranges, the short view note),
and the profiler session's fixed cost, on BERT-base bf16 8x512 inference.

Each tracer variant is timed (median of 10 synchronized steps, interleaved) outside and inside one profiler
session; the session's fixed cost is split by wrapping Kineto's prepare / enable / disable and timing the
warm-up op and the teardown launch around them.
"""
import os
import statistics
import sys
import time
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import brrr  # noqa: E402,F401
from brrr.analyze.capture import OpTracer, gc_paused, record_step  # noqa: E402
from brrr.analyze.timing import profiled  # noqa: E402
from probe_common import bert_base_inference, median_ms, time_kineto_calls  # noqa: E402

model, ids, step, ceil = bert_base_inference()
device = torch.device("cuda")
record_functions = torch.autograd._enable_record_function


def plain():
    step()


def plain_no_record_function():
    record_functions(False)
    try:
        step()
    finally:
        record_functions(True)


def mode_only():
    with OpTracer(None, record_costs=False), gc_paused():
        plain_no_record_function()


def mode_ranges():
    with OpTracer(None, record_costs=False, mark_ranges=True, range_kernel_free_ops=False), gc_paused():
        step()


def mode_note():
    with OpTracer(model, record_costs=True), gc_paused():
        plain_no_record_function()


def full():
    record_step(step, range_kernel_free_ops=False)


VARIANTS = {"plain": plain, "plain, no record_function": plain_no_record_function, "mode only": mode_only,
            "mode + ranges (kernel ops)": mode_ranges, "mode + note + module hooks": mode_note,
            "full traced step": full}


for _ in range(3):
    for fn in VARIANTS.values():
        fn()
for where in ("outside a profiler", "inside one profiler session"):
    samples = defaultdict(list)
    if where.startswith("inside"):
        session = profiled(device)
        session.__enter__()
    for _ in range(10):
        for name, fn in VARIANTS.items():
            samples[name].append(median_ms(fn, 1))
    if where.startswith("inside"):
        session.__exit__(None, None, None)
    base = statistics.median(samples["plain"])
    print(f"-- {where}")
    for name, values in samples.items():
        ms = statistics.median(values)
        print(f"{name:28s} {ms:7.2f} ms  (+{(ms - base) / 470 * 1e3:5.1f} us/op over plain)", flush=True)

# the profiler session's fixed cost, as analyze opens it
parts = time_kineto_calls()
for i in range(10):
    t0 = time.perf_counter()
    with profiled(device):
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    parts["session total (empty body)"].append((t3 - t0) * 1e3)
    parts["enter (prepare, enable, warm-up op)"].append((t1 - t0) * 1e3)
    parts["exit (disable, teardown launch)"].append((t3 - t2) * 1e3)
print("-- profiler session fixed cost, medians of 10 (ms)")
for name, values in parts.items():
    print(f"{name:40s} {statistics.median(values):7.2f}  (first {values[0]:.2f})", flush=True)
