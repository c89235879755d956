"""Session-4 probe 2: why the traced step costs ~45 us per op over eager inside a profiler session but ~20
outside it. Each variant of the tracer runs inside its own profiler session; only the step is timed."""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import brrr  # noqa: E402,F401
from brrr.analyze import capture, timing  # noqa: E402
from brrr.analyze.capture import OpTracer, _op_range, _record_functions, RANGE_PREFIX  # noqa: E402
from brrr.analyze.step import Step  # noqa: E402
from brrr.examples import build_example  # noqa: E402

DEV = os.environ.get("PROBE_DEVICE", "cuda")
model, (ids,) = build_example("bert-base", device=DEV, dtype=torch.bfloat16 if DEV == "cuda" else torch.float32, batch=8 if DEV == "cuda" else 1, seq=512 if DEV == "cuda" else 8)
step = Step(model, (ids,))
dev = torch.device(DEV)
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)
os.environ["TEARDOWN_CUPTI"] = "1"


class QuietTracer(OpTracer):
    """Ranges with record_function off for the whole step: only brrr#i ranges are recorded."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        index = len(self.funcs)
        self.funcs.append(func)
        run = func._op
        _record_functions(True)
        with _op_range(RANGE_PREFIX + str(index)):
            _record_functions(False)
            out = run(*args, **kwargs) if kwargs else run(*args)
        if self.record_costs:
            self._note(func, args, kwargs, out)
        return out

    def __enter__(self):
        _record_functions(False)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _record_functions(True)


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
        t2 = time.perf_counter()
        counts.append(len(prof.profiler.kineto_results.events()))
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
    ("quiet ranges", traced(QuietTracer, False, True)),
    ("quiet note + ranges", traced(QuietTracer, True, True)),
]


def outside(fn, n=5):
    ts = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


import faulthandler  # noqa: E402
faulthandler.dump_traceback_later(100, exit=True)
for rnd in range(2):
    base_in = base_out = None
    for label, fn in variants:
        t_out = outside(fn)
        t, stop, count = in_session(fn)
        base_in, base_out = base_in or t, base_out or t_out
        print(f"[{rnd}] {label:22s} outside {t_out:6.2f} ms (+{(t_out - base_out) / n_ops * 1e3:5.1f} us/op) | "
              f"in profiler {t:6.2f} ms (+{(t - base_in) / n_ops * 1e3:5.1f} us/op), stop {stop:5.1f} ms, "
              f"{count} events", flush=True)
print("done", flush=True)
