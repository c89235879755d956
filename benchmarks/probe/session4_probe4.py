"""Session-4 probe 4: analysis cost against eager, interleaved (the H100 hosts change speed within a run), and
the profiler session's fixed cost split into Kineto's prepare / enable / disable and the teardown launch.
Run twice: TEARDOWN_CUPTI unset (brrr sets 1) and TEARDOWN_CUPTI=0."""
import os
import statistics
import sys
from collections import defaultdict


sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import brrr  # noqa: E402,F401
from analyze_overhead import timed_analysis  # noqa: E402
from probe_common import bert_base_inference, median_ms, time_kineto_calls  # noqa: E402

kineto = time_kineto_calls()  # milliseconds per call

model, ids, step, ceil = bert_base_inference()


def eager_ms(n=10):
    return median_ms(step, n)


for _ in range(3):
    step()
tag = f"TEARDOWN_CUPTI={os.environ.get('TEARDOWN_CUPTI', 'unset')}"
ratios, totals, stages = [], [], defaultdict(list)
for i in range(12):
    before = eager_ms()
    tot, stage_ms, _ = timed_analysis(model, ids, ceilings=ceil)
    after = eager_ms()
    eager = (before + after) / 2
    if i:  # the first analysis in the process: CUPTI's one-time load
        ratios.append(tot / eager)
        totals.append(tot)
        for k, v in stage_ms.items():
            stages[k].append(v)
    print(f"{tag} analysis {i}: {tot:.1f} ms, eager {before:.2f}/{after:.2f} ms -> {tot / eager:.1f}x", flush=True)
print(f"{tag} median over analyses 1-11: {statistics.median(totals):.1f} ms, ratio {statistics.median(ratios):.1f}x "
      f"(min {min(ratios):.1f}, max {max(ratios):.1f})")
print(tag, "stage medians (ms):", {k: round(statistics.median(v), 1) for k, v in stages.items()})
print(tag, "kineto medians (ms):", {k: round(statistics.median(v[1:]), 2) for k, v in kineto.items()},
      "first:", {k: round(v[0], 1) for k, v in kineto.items()}, flush=True)
