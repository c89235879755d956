"""How brrr times a callable: the one timer that bench/, experiments/ and benchmarks/ share.

Two questions, two timers:
- `time_kernel(fn)`: how long one call takes on the device. CUDA: `triton.testing.do_bench` (device events
  around each call, L2 flushed between calls), median and p20/p80. CPU: `perf_counter` around each call,
  median and p20/p80. `warmup` and `rep` are milliseconds, as in do_bench.
- `time_steady(fn)`: how long a call takes when calls run back to back, as in a training loop. Synchronize,
  run n calls, synchronize; per-call time is the chunk time over n, median over a few chunks. Host overhead
  (Python, dispatch, launches) shows up here and hides in time_kernel when the device waits on nobody.
- `time_graph(fn)` (CUDA only): the device's own time per call. n calls are captured into one CUDA graph and
  its replays timed by do_bench, over n. No host overhead and no launch gaps: for kernels of 10-30 us,
  where do_bench's per-call events and the gap before each launch are a large part of time_kernel.
"""

import time
from dataclasses import dataclass

import torch

from brrr.cost.device import synchronize


@dataclass(frozen=True)
class Timing:
    median_s: float
    p20_s: float
    p80_s: float
    calls: int
    method: str

    @property
    def spread(self):
        """(p80 - p20) / median: the relative width of the middle 60% of samples."""
        return (self.p80_s - self.p20_s) / self.median_s if self.median_s > 0 else 0.0

    def to_dict(self):
        return {"median_s": self.median_s, "p20_s": self.p20_s, "p80_s": self.p80_s,
                "spread": self.spread, "calls": self.calls, "method": self.method}


def quantile(sorted_values, q):
    """Linear-interpolated quantile of an already sorted list (q in [0, 1])."""
    if not sorted_values:
        raise ValueError("quantile of no samples")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _do_bench_ms(fn, warmup, rep):
    import triton.testing

    result = triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])
    return [float(v) for v in result]


def time_kernel(fn, device, warmup=25, rep=100, min_calls=5, max_calls=10_000, max_rep=3000):
    """Median time of one call of `fn` (seconds) with its p20/p80 spread, over at least `min_calls` calls
    (on CUDA `rep` grows to fit them, up to `max_rep` ms: do_bench alone times rep / (one call) calls, which
    for a 50 ms training step and rep=100 is a median of two)."""
    device = torch.device(device)
    if device.type == "cuda":
        with torch.cuda.device(device):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            one_call_ms = (time.perf_counter() - start) * 1e3
            rep = max(rep, min(max_rep, 1.2 * min_calls * one_call_ms))
            median, p20, p80 = _do_bench_ms(fn, warmup, rep)
        return Timing(median / 1e3, p20 / 1e3, p80 / 1e3, calls=-1, method="triton.testing.do_bench")
    fn()
    start = time.perf_counter()
    fn()
    estimate = max(time.perf_counter() - start, 1e-7)
    for _ in range(min(int(warmup / 1e3 / estimate), max_calls)):
        fn()
    calls = max(min_calls, min(int(rep / 1e3 / estimate), max_calls))
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return Timing(quantile(samples, 0.5), quantile(samples, 0.2), quantile(samples, 0.8), calls,
                  method="perf_counter")


def time_steady(fn, device, chunk_s=0.02, chunks=5, max_calls=10_000):
    """Per-call time of back-to-back calls (seconds): host overhead included, as a training loop sees it."""
    device = torch.device(device)
    fn()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    estimate = max(time.perf_counter() - start, 1e-7)
    n = max(1, min(int(chunk_s / estimate), max_calls))
    for _ in range(n):  # warm-up chunk
        fn()
    synchronize(device)
    per_call = []
    for _ in range(chunks):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        synchronize(device)
        per_call.append((time.perf_counter() - start) / n)
    per_call.sort()
    return Timing(quantile(per_call, 0.5), quantile(per_call, 0.2), quantile(per_call, 0.8), n * chunks,
                  method=f"back-to-back loops of {n}")


def time_graph(fn, device, calls=10, warmup=25, rep=100):
    """Per-call device time of `calls` back-to-back calls of `fn` replayed from one CUDA graph; None off CUDA
    or when `fn` cannot be captured (the reason is then in `time_graph.last_error`)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):   # warm up off the default stream, as capture requires
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
            median, p20, p80 = _do_bench_ms(graph.replay, warmup, rep)
    except Exception as e:
        time_graph.last_error = f"{type(e).__name__}: {e}"
        return None
    scale = 1e3 * calls
    return Timing(median / scale, p20 / scale, p80 / scale, calls=calls,
                  method=f"CUDA graph of {calls} calls, replays timed by triton.testing.do_bench")


time_graph.last_error = None
