"""Session-4 probe 3: the cost of one analysis of BERT-base bf16 8x512 inference against an eager step, each
analysis next to a fresh eager measurement, stage by stage (as benchmarks/analyze_overhead.py)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import brrr  # noqa: E402,F401
from analyze_overhead import timed_analysis  # noqa: E402
from probe_common import bert_base_inference, median_ms  # noqa: E402

model, ids, step, ceil = bert_base_inference()


def eager_ms(n=20):
    return median_ms(step, n)


for _ in range(3):
    step()
for i in range(int(os.environ.get("ANALYSES", "5"))):
    eager = eager_ms()
    tot, stages, a = timed_analysis(model, ids, ceilings=ceil)
    print(f"analysis {i}: {tot:.1f} ms, eager {eager:.2f} ms -> {tot / eager:.1f}x (wall {a.wall_time_s * 1e3:.2f});",
          {k: round(v, 1) for k, v in stages.items()}, flush=True)
print(f"eager after: {eager_ms():.2f} ms", flush=True)
print("done", flush=True)
