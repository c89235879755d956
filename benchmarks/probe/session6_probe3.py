"""Session-6 probe 5 (results: ...-analyze-session-cost-session6-probe5.log), BERT-base bf16 8x512 inference:
what the profiler session around the traced step costs once there is a real step inside it.

Over 12 analyses, each after eager steps: Kineto's prepare / enable / disable (wrapped), the session's
enter and exit as brrr's `profiled` sees them, and the traced step. Then, for one traced session, the raw
Kineto events by kind and name: how many the session hands back and what they are.
"""
import os
import statistics
import sys
import time
from collections import Counter, defaultdict

import torch
from torch.autograd import DeviceType

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brrr  # noqa: E402,F401
from brrr.analyze.capture import record_step  # noqa: E402
from brrr.analyze.timing import profiled  # noqa: E402
from probe_common import bert_base_inference, median_ms, session_timed, time_kineto_calls  # noqa: E402

analyze_module = sys.modules["brrr.analyze"]
model, ids, step, ceil = bert_base_inference()
calls = time_kineto_calls()
parts = defaultdict(list)
analyze_module.profiled = session_timed(analyze_module.profiled, lambda name, ms: parts[name].append(ms))
real_record = analyze_module.record_step


def record_timed(*args, **kwargs):
    start = time.perf_counter()
    try:
        return real_record(*args, **kwargs)
    finally:
        parts["traced step"].append((time.perf_counter() - start) * 1e3)


analyze_module.record_step = record_timed

for _ in range(3):
    step()
brrr.analyze(model, ids, ceilings=ceil)
for values in list(calls.values()) + list(parts.values()):
    values.clear()
eagers = []
for _ in range(12):
    with torch.no_grad():
        eagers.append(median_ms(lambda: model(ids), n=5))
    brrr.analyze(model, ids, ceilings=ceil)

print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; eager step {statistics.median(eagers):.2f} ms; "
      "medians of 12 analyses (ms):")
for name, values in list(calls.items()) + list(parts.items()):
    print(f"  {name:20s} {statistics.median(values):7.2f}   (min {min(values):.2f}, max {max(values):.2f})")

with profiled(torch.device("cuda")) as prof:
    trace = record_step(step, range_kernel_free_ops=False)
events = prof.kineto_results.events()
kinds = Counter()
names = Counter()
for e in events:
    kind = "cpu" if e.device_type() == DeviceType.CPU else "device"
    name = e.name()
    label = "brrr#<i>" if name.startswith("brrr#") else name[:60]
    kinds[kind] += 1
    names[(kind, label)] += 1
print(f"\none traced session: {len(events)} events ({dict(kinds)}), {len(trace.raw)} ops traced")
for (kind, label), count in names.most_common(25):
    print(f"  {count:5d}  {kind:6s} {label}")
