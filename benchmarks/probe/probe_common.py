"""Pieces the probes share: brrr compiled with an environment switch set while it compiles (to compare two
code paths in one process), a cProfile report of a step run n times, and the median time of a step."""
import cProfile
import io
import os
import pstats
import statistics
import time
from collections import defaultdict

import torch

from brrr.compile.backend import brrr_backend


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
