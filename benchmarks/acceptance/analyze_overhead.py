"""What `brrr.analyze` costs on top of the step it analyzes, on CPU, stage by stage.

    .venv/bin/python benchmarks/acceptance/analyze_overhead.py [--train] [--batch 1 --seq 8] [--repeats 5]
    PYTHONPATH=$PWD python3 benchmarks/acceptance/analyze_overhead.py --device cuda --dtype bf16 --batch 8 --seq 512

BERT-base with a tiny input (1x8 tokens by default), so host overhead dominates as it does for BERT-base
bf16 8x512 on an H100 (470 ATen ops in ~8.4 ms). Prints the eager step, the extra host cost per op of
`capture()` (with and without a profiler around it), the seconds of each stage of `analyze()` (timed by
wrapping the functions analyze calls, so the real code path runs) and the analyze / eager ratio. The
ceilings come from the cache (`brrr ceilings` once first), as in the acceptance run. A GPU run's output is kept
as benchmarks/results/acceptance-analyze/<date>-<gpu>-<commit>-overhead.log.
"""

import argparse
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

import brrr  # noqa: F401  (brrr.analyze is replaced by a callable module on import)
from brrr.analyze.capture import capture
from brrr.analyze.step import Step
from brrr.analyze.timing import profiled
from brrr.cost.device import get_ceilings, synchronize
from brrr.examples import bert_base

analyze_module = sys.modules["brrr.analyze"]
capture_module = sys.modules["brrr.analyze.capture"]


def median_seconds(fn, repeats, device="cpu"):
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profiled_capture(step, device):
    with profiled(device):
        return capture(step)


STAGES_AFTER = ["pricing + links", "profiler start/stop", "classify"]


class StageClock:
    """Wraps the functions `analyze` calls (by name, in brrr.analyze's namespace) to sum their seconds."""

    WRAPPED = {  # name in brrr.analyze -> stage
        "capture": "capture (traced step)",  # before the capture was split in two
        "record_step": "capture (traced step)",
        "trace_names": "extra profiled steps",
        "_replayed_run": "replayed step (CUDA)",
        "_profiled_times": "profiler event processing",
        "wall_time": "wall runs",  # before 9eadf11 (timed_runs)
        "timed_runs": "wall runs",
        "device_busy_time": "busy-time step",
    }

    def __init__(self):
        self.seconds = defaultdict(float)

    def _timed(self, stage, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - start
        return wrapper

    @contextmanager
    def installed(self):
        saved = {}
        for name, stage in self.WRAPPED.items():
            if hasattr(analyze_module, name):
                saved[name] = getattr(analyze_module, name)
                setattr(analyze_module, name, self._timed(stage, saved[name]))
        saved["profiled"] = analyze_module.profiled
        analyze_module.profiled = self._profiled(saved["profiled"])
        if hasattr(capture_module, "Trace"):
            saved_records = capture_module.Trace.records
            capture_module.Trace.records = self._timed("pricing + links", saved_records)
        analysis_cls = analyze_module.Analysis
        saved_from = analysis_cls.__dict__["from_measurements"]
        analysis_cls.from_measurements = classmethod(self._timed("classify", saved_from.__func__))
        try:
            yield self
        finally:
            for name, fn in saved.items():
                setattr(analyze_module, name, fn)
            analysis_cls.from_measurements = saved_from
            if hasattr(capture_module, "Trace"):
                capture_module.Trace.records = saved_records

    def _profiled(self, fn):
        clock = self

        @contextmanager
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            manager = fn(*args, **kwargs)
            prof = manager.__enter__()
            clock.seconds["profiler start/stop"] += time.perf_counter() - start
            try:
                yield prof
            finally:
                start = time.perf_counter()
                manager.__exit__(None, None, None)
                clock.seconds["profiler start/stop"] += time.perf_counter() - start
        return wrapper


def timed_analysis(model, *inputs, device="cuda", **kwargs):
    """(milliseconds of one analyze() call, {stage: milliseconds}, the Analysis), device synchronized first."""
    clock = StageClock()
    with clock.installed():
        synchronize(device)
        start = time.perf_counter()
        analysis = analyze_module.analyze(model, *inputs, **kwargs)
        total = (time.perf_counter() - start) * 1e3
    return total, {stage: seconds * 1e3 for stage, seconds in clock.seconds.items()}, analysis


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--repeats", type=int, default=5, help="analyses timed (the median is printed)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    model, inputs = bert_base(device=device, dtype=dtype, batch=args.batch, seq=args.seq)
    step = Step(model, inputs, train=args.train)
    ceilings = get_ceilings(device)
    for _ in range(3):
        step()

    eager = median_seconds(step, 20, device)
    ops = len(capture(step))
    captured = median_seconds(lambda: capture(step), 10, device)
    captured_profiled = median_seconds(lambda: profiled_capture(step, device), 10, device)
    print(f"BERT-base {args.dtype} {args.batch}x{args.seq} {'train' if args.train else 'inference'} on {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"eager step          {eager * 1e3:8.2f} ms   ({ops} ATen ops, {eager / ops * 1e6:.1f} us/op)")
    print(f"capture()           {captured * 1e3:8.2f} ms   (+{(captured - eager) / ops * 1e6:.1f} us/op over eager)")
    print(f"capture() profiled  {captured_profiled * 1e3:8.2f} ms   "
          f"(+{(captured_profiled - eager) / ops * 1e6:.1f} us/op over eager)")

    analyze_module.analyze(model, *inputs, train=args.train, ceilings=ceilings)  # first-call costs
    totals, stage_runs = [], []
    for _ in range(args.repeats):
        total_ms, stage_ms, _ = timed_analysis(model, *inputs, device=device, train=args.train, ceilings=ceilings)
        totals.append(total_ms / 1e3)
        stage_runs.append({stage: ms / 1e3 for stage, ms in stage_ms.items()})
    total = statistics.median(totals)
    print(f"analyze()           {total * 1e3:8.2f} ms   = {total / eager:.1f}x eager  "
          f"(median of {args.repeats}; stages below are medians too)")
    stages = {stage: statistics.median(run.get(stage, 0.0) for run in stage_runs)
              for stage in dict.fromkeys(list(StageClock.WRAPPED.values()) + STAGES_AFTER)}
    for stage, seconds in stages.items():
        print(f"  {stage:26s}{seconds * 1e3:8.2f} ms   {seconds / eager:5.1f}x eager")
    rest = total - sum(stages.values())
    print(f"  {'rest':26s}{rest * 1e3:8.2f} ms   {rest / eager:5.1f}x eager")


if __name__ == "__main__":
    main()
