"""Session-4 probe 2: why the traced step costs ~45 us per op over eager inside a profiler session but ~20
outside it. Each variant of the tracer runs inside its own profiler session; only the step is timed.

The logged run (`...-analyze-cost-session4-probe2.log`) also had "quiet" variants: record_function off for the
whole step but to open each range. OpTracer works that way since, so "mode + ranges" now measures them."""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import brrr  # noqa: E402,F401
from brrr.analyze import capture, timing  # noqa: E402
from brrr.analyze.capture import OpTracer  # noqa: E402
from brrr.analyze.step import Step  # noqa: E402
from brrr.examples import build_example  # noqa: E402
from probe_common import median_ms  # noqa: E402

DEV = os.environ.get("PROBE_DEVICE", "cuda")
model, (ids,) = build_example("bert-base", device=DEV, dtype=torch.bfloat16 if DEV == "cuda" else torch.float32, batch=8 if DEV == "cuda" else 1, seq=512 if DEV == "cuda" else 8)
step = Step(model, (ids,))
dev = torch.device(DEV)
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)
os.environ["TEARDOWN_CUPTI"] = "1"


def traced(cls, record_costs, mark_ranges):
    def run():
        with cls(model, record_costs=record_costs, mark_ranges=mark_ranges):
            step()
    return run


def in_session(fn, n=3):
    steps, stops, counts = [], [], []
    for _ in range(n):
        with timing.profiled(dev) as prof:
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            steps.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
        stops.append(time.perf_counter() - t1)

        counts.append(len(prof.kineto_results.events()))
    return statistics.median(steps) * 1e3, statistics.median(stops) * 1e3, counts[-1]


for _ in range(3):
    step()
n_ops = len(capture.capture(step))
variants = [
    ("plain step", step),
    ("mode only", traced(OpTracer, False, False)),
    ("mode + ranges", traced(OpTracer, False, True)),
    ("mode + note", traced(OpTracer, True, False)),
    ("mode + note + ranges", traced(OpTracer, True, True)),
]


import faulthandler  # noqa: E402
faulthandler.dump_traceback_later(100, exit=True)
for rnd in range(2):
    base_in = base_out = None
    for label, fn in variants:
        t_out = median_ms(fn, 5, sync)
        t, stop, count = in_session(fn)
        base_in, base_out = base_in or t, base_out or t_out
        print(f"[{rnd}] {label:22s} outside {t_out:6.2f} ms (+{(t_out - base_out) / n_ops * 1e3:5.1f} us/op) | "
              f"in profiler {t:6.2f} ms (+{(t - base_in) / n_ops * 1e3:5.1f} us/op), stop {stop:5.1f} ms, "
              f"{count} events", flush=True)
print("done", flush=True)
