"""Session-5 probe (results: ...-wall-after-cupti-session5-probe6.log):
is the first plain step after a traced step slower than the next one, and why?

In trace-first analyses the single wall-time step read 5-10% above the eager median on a steady host. Each
variant runs something, then two plain steps (a, b), interleaved over 12 rounds on BERT-base bf16 8x512:
  baseline        nothing before a and b
  traced          a profiled traced step, its records(), then a and b (what analyze does)
  traced-gc-off   the same, with the cyclic GC paused during a
  traced-collect  the same, with gc.collect() before a
  profiled-plain  a plain step inside a profiler session (CUPTI attached and released, no tracer)
  tracer-only     a traced step outside any profiler session, its records()
"""
import gc
import os
import statistics
import sys
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brrr  # noqa: E402,F401
from brrr.analyze.capture import gc_paused, record_step  # noqa: E402
from brrr.analyze.timing import profiled  # noqa: E402
from probe_common import bert_base_inference, median_ms  # noqa: E402

model, ids, step, ceil = bert_base_inference()
device = torch.device("cuda")


def traced():
    with profiled(device):
        trace = record_step(step, range_kernel_free_ops=False)
    trace.records()


def tracer_only():
    record_step(step, mark_ranges=False).records()


def profiled_plain():
    with profiled(device):
        step()


def paused_step():
    with gc_paused():
        step()


VARIANTS = {
    "baseline": (None, step),
    "traced": (traced, step),
    "traced-gc-off": (traced, paused_step),
    "traced-collect": (lambda: (traced(), gc.collect()), step),
    "profiled-plain": (profiled_plain, step),
    "tracer-only": (tracer_only, step),
}
for _ in range(3):
    step()
traced()
samples = defaultdict(lambda: defaultdict(list))
for _ in range(12):
    for name, (before, first) in VARIANTS.items():
        if before is not None:
            before()
        samples[name]["a"].append(median_ms(first, 1))
        samples[name]["b"].append(median_ms(step, 1))
for name, runs in samples.items():
    a, b = statistics.median(runs["a"]), statistics.median(runs["b"])
    print(f"{name:15s} first plain step {a:6.2f} ms   second {b:6.2f} ms   ({(a / b - 1) * 100:+5.1f}%)", flush=True)
