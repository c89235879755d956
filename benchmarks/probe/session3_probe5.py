"""Session-3 probe 5: where the analyzer's traced step spends its ~42 us per op (BERT-base bf16 8x512
inference, 470 ops). Host time of one step, median of 7, device synchronized, under: eager; a Python dispatch
mode that only calls the op; the same with torch's per-op dynamo-disable wrapper removed; brrr's tracer with
ranges only / metadata only / both; each of those inside a profiler (CPU+CUDA, brrr's lean config); and
analyze() itself."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import brrr
from brrr.analyze.capture import OpTracer, gc_paused
from brrr.analyze.step import Step
from brrr.analyze.timing import profiled
from brrr.examples import build_example
from probe_common import median_ms

model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
step = Step(model, (ids,), train=False)


class Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func._op(*args, **(kwargs or {}))


class RawPassthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func._op(*args, **(kwargs or {}))


raw = RawPassthrough.__dict__["__torch_dispatch__"]
raw = getattr(raw, "__wrapped__", raw)
RawPassthrough.__torch_dispatch__ = raw


def timed(fn, n=7):
    return median_ms(fn, n)


def under(make_mode):
    def run():
        with make_mode(), gc_paused():
            step()
    return run


def tracer(record_costs, mark_ranges):
    return lambda: OpTracer(model, record_costs=record_costs, mark_ranges=mark_ranges)


for _ in range(3):
    step()
cases = [("eager", step), ("passthrough mode", under(Passthrough)),
         ("passthrough mode, no dynamo wrapper", under(RawPassthrough)),
         ("tracer: ranges only", under(tracer(False, True))), ("tracer: metadata only", under(tracer(True, False))),
         ("tracer: both (analyze's)", under(tracer(True, True)))]
eager = None
for name, fn in cases:
    ms = timed(fn)
    eager = eager or ms
    print(f"E {name:40s} {ms:7.2f} ms  (+{(ms - eager) / 470 * 1e3:5.1f} us/op)", flush=True)
    def in_profiler(fn=fn):
        with profiled(torch.device("cuda")):
            fn()
    ms = timed(in_profiler)
    print(f"E {name + ' + profiler':40s} {ms:7.2f} ms  (+{(ms - eager) / 470 * 1e3:5.1f} us/op)", flush=True)
for i in range(4):
    t = timed(lambda: brrr.analyze(model, ids), n=1)
    print(f"E analyze #{i}: {t:.1f} ms = {t / eager:.1f}x eager", flush=True)
