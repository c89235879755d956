"""Session-5 recompile check (results: ...-dynamo-recompile-session5-probe2.log): does a torch.compile'd
GELU recompile when it runs under brrr's tracer (T: traced and profiled, M: traced only), under a profiler
alone (P), or plainly (W) after those? Each call prints its time and Dynamo's frame counters.

    TORCH_LOGS=recompiles PYTHONPATH=$PWD python3 benchmarks/probe/session5_recompile.py T,T,W,W

It showed no recompile from the mode or the profiler; the recompiles seen in analyses come from brrr's
global module hooks, which Dynamo guards on (a tracer without record_costs installs none).
"""
import sys
import time

import torch

import brrr  # noqa: F401
from brrr.analyze.capture import OpTracer
from brrr.analyze.timing import profiled
from torch._dynamo.utils import counters

act = torch.compile(torch.nn.GELU())
x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
device = torch.device("cuda")


def counts():
    return dict(counters["frames"]), dict(counters["stats"])


def timed(label, fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    print(f"{label}: {(time.perf_counter() - start) * 1e3:.2f} ms", counts(), flush=True)


def traced():
    with profiled(device), OpTracer(None, record_costs=False, mark_ranges=True):
        act(x)


def traced_unprofiled():
    with OpTracer(None, record_costs=False, mark_ranges=True):
        act(x)


def profiled_only():
    with profiled(device):
        act(x)


STEPS = {"T": traced, "M": traced_unprofiled, "P": profiled_only, "W": lambda: act(x)}
for name in sys.argv[1].split(","):
    timed(name, STEPS[name])
