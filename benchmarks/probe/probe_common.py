"""Pieces the probes share: brrr compiled with an environment switch set while it compiles (to compare two
code paths in one process), a cProfile report of a step run n times, the median and back-to-back time of a
step, the seed MLP's and a tiny Linear's steps under a backend, BERT-base inference, Kineto call timing."""
import cProfile
import io
import os
import pstats
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from brrr.compile.backend import brrr_backend
from brrr.examples import mlp


def brrr_with_env(name, **env):
    """brrr's backend, registered in bench tables as `name`, compiling with `env` set (e.g. BRRR_AOT_RUNTIME="1")."""
    def backend(gm, example_inputs):
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return brrr_backend(gm, example_inputs)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    backend.__name__ = name
    return backend


def profile_report(step, n, sorts=("tottime",), rows=25, callers=None):
    """cProfile of `step` called n times (device synchronized after), as text, one table per sort key."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        step()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    stats = pstats.Stats(pr, stream=s)
    for key in sorts:
        stats.sort_stats(key).print_stats(rows)
    if callers:
        stats.print_callers(callers)
    return s.getvalue()


def median_ms(fn, n=20, sync=None):
    """Median milliseconds of `fn()` over n runs, each synchronized before and after (default: CUDA)."""
    sync = sync or torch.cuda.synchronize
    times = []
    for _ in range(n):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def bert_base_inference():
    """The analyzer probes' subject: BERT-base bf16 8x512 inference on CUDA, as (model, ids, step, ceilings)."""
    from brrr.analyze.step import Step
    from brrr.cost.device import get_ceilings
    from brrr.examples import build_example

    model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
    return model, ids, Step(model, (ids,)), get_ceilings("cuda", progress=False)


def time_kineto_calls(into=None):
    """Wrap Kineto's prepare / enable / disable calls (as torch.autograd.profiler calls them) so that each call's
    milliseconds are appended to into[name]; returns `into` (a defaultdict(list) by default)."""
    import torch.autograd.profiler as aprof

    into = defaultdict(list) if into is None else into
    for name in ("_prepare_profiler", "_enable_profiler", "_disable_profiler"):
        fn = getattr(aprof, name)

        def timed(*a, _fn=fn, _name=name, **k):
            start = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                into[_name].append((time.perf_counter() - start) * 1e3)
        setattr(aprof, name, timed)
    return into


def back_to_back_s(step, n=200, warmup=5, reps=1):
    """Seconds per call of `step` run n times back to back (after `warmup` calls), synchronized at both ends;
    the best of `reps` such runs."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    best = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - start) / n)
    return min(best)


def compiled(fn, backend):
    """`fn` under torch.compile with `backend` after a Dynamo reset; `fn` itself for backend None (eager)."""
    torch._dynamo.reset()
    return fn if backend is None else torch.compile(fn, backend=backend)


def tiny_linear_steps(backend):
    """(train step, inference step) of an 8x8 Linear on a [4, 8] CUDA input under `backend`: fixed host cost."""
    lin = torch.nn.Linear(8, 8, device="cuda")
    x = torch.randn(4, 8, device="cuda")
    fn = compiled(lin, backend)

    def train():
        lin.weight.grad = lin.bias.grad = None
        fn(x).sum().backward()

    def infer():
        with torch.no_grad():
            fn(x)
    return train, infer


class SeedMLPTrain:
    """The seed MLP's bf16 train step (batch 16384): gradients reset each step, one fixed cotangent."""

    def __init__(self, batch=16384):
        self.model, (self.x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=batch)
        self.cot = torch.randn_like(self.x)
        self.params = list(self.model.parameters())

    def step(self, backend=None):
        """The step with the model under `backend` (None: eager, after a Dynamo reset all the same)."""
        fn = compiled(self.model, backend)

        def step():
            for p in self.params:
                p.grad = None
            torch.autograd.backward([fn(self.x)], [self.cot])
        return step


def host_seconds(fn, n, warmup=0, busy_gib=2, fills=40):
    """Host seconds per call of `fn`, timed while the device is kept busy (`fills` fills of a `busy_gib` GiB
    buffer queued first, ~0.7 ms each for 2 GiB), so launches queue up and no call waits on the device."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    big = torch.empty(int(busy_gib * 2**30), device="cuda", dtype=torch.uint8)
    for _ in range(fills):
        big.fill_(1)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    seconds = (time.perf_counter() - start) / n
    torch.cuda.synchronize()
    return seconds


def exit_unless_teardown_thread(timing):
    """Session-6 probes 1 and 2 compare the helper-thread CUPTI teardown launch, reverted after them (no gain):
    they run on commits dbe2e4d..1828791 only."""
    if not hasattr(timing, "_TEARDOWN"):
        raise SystemExit("this probe compares the helper-thread CUPTI teardown, reverted since: "
                         "check out 1828791 to rerun it")


def session_timed(profiled, record):
    """`profiled` (brrr's profiler session) wrapped so that its enter and its exit are each timed:
    record("session enter" / "session exit", milliseconds)."""
    @contextmanager
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        manager = profiled(*args, **kwargs)
        prof = manager.__enter__()
        record("session enter", (time.perf_counter() - start) * 1e3)
        try:
            yield prof
        finally:
            start = time.perf_counter()
            manager.__exit__(None, None, None)
            record("session exit", (time.perf_counter() - start) * 1e3)
    return wrapper


def note_analysis(row, ms, before, after, analysis):
    """Append one analysis of `ms` milliseconds, between eager steps of `before` and `after` ms, to a probe's
    row of lists: its ratio to the eager step, both times, its wall time against the eager step, and the
    eager step after against the one before (a CUPTI left attached would slow it by 20-35%)."""
    eager = (before + after) / 2
    row["ratio"].append(ms / eager)
    row["analyze_ms"].append(ms)
    row["eager_ms"].append(eager)
    row["wall_vs_eager"].append(analysis.wall_time_s * 1e3 / eager)
    row["after_vs_before"].append(after / before)
