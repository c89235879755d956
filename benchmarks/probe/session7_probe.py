"""Session-7 probe (results: ...-analyze-cost-session7-probe*.log): a known step timed without the tracer.

Prediction, written before the run: the replayed step (a plain step in a profiler session, ATen events on,
shapes recorded) costs ~7.5 ms against the traced step's ~17 ms at a ~4.4 ms eager step (session 5: a plain
step inside a session took 7.40 ms against 5.15 eager); reading ~1900 events instead of ~560 adds ~1.5 ms and
Kineto's disable ~0.5 ms. Net: -7 to -8 ms per repeat analysis, -1.6 to -1.8x at the fastest hosts (11.0x ->
~9.3x). The class table and per-op kernel times must not move (the same kernels, attributed the same way).

Variants, interleaved over rounds on BERT-base bf16 8x512 inference, each with its own KnownSteps:
  traced   every analysis traces its step (REPLAY_DEVICES empty): session 6's code path
  replay   a known step is replayed (what brrr does now). Run 1 (commit 86a534e) checked input shapes with
           record_shapes: 10.4x against 9.9x traced, Kineto's stop 11 ms against 2.6. Run 2 added replay by
           names alone: 7.8x against 9.9x. The code now replays by names, kernel counts and model state.
Per variant: the median ratio to an eager step (each analysis between two eager medians), its wall time
against the eager step, replays that matched / failed, and where the time goes (Kineto prepare / disable,
the timed step, reading events, pricing, classifying). Then both variants' last analyses side by side: class
table, kernel ops without a time, the largest per-op difference. Then compiled models (Inductor, brrr):
does a replay match, and do the kernels compiled code launches come out the same?
"""
import os
import statistics
import sys
import time
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brrr  # noqa: E402,F401
from brrr.analyze import capture, step as step_module  # noqa: E402
from probe_common import bert_base_inference, median_ms, note_analysis, time_kineto_calls  # noqa: E402

analyze_module = sys.modules["brrr.analyze"]
ROUNDS = int(os.environ.get("ROUNDS", "10"))
model, ids, step, ceil = bert_base_inference()

parts = defaultdict(list)
kineto = time_kineto_calls()
replays = defaultdict(int)


def timed(name, fn, module=analyze_module):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            parts[name].append((time.perf_counter() - start) * 1e3)
    setattr(module, fn.__name__, wrapper)
    return wrapper


real_replayed = analyze_module._replayed_run


def counting_replayed(*args):
    result = real_replayed(*args)
    replays["matched" if result is not None else "failed"] += 1
    return result


analyze_module._replayed_run = counting_replayed
for name in ("_traced_run", "session_events", "match_ops", "attribute_kernels", "timed_runs"):
    timed(name, getattr(analyze_module, name))
real_records = capture.Trace.records
capture.Trace.records = lambda self: _timed_call("records", real_records, self)
real_from = analyze_module.Analysis.from_measurements.__func__
analyze_module.Analysis.from_measurements = classmethod(lambda cls, *a, **k: _timed_call("classify", real_from, cls, *a, **k))


def _timed_call(name, fn, *args, **kwargs):
    start = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        parts[name].append((time.perf_counter() - start) * 1e3)


VARIANTS = ("traced", "replay")
KNOWN = {name: step_module.KnownSteps() for name in VARIANTS}
DEVICES = {"traced": (), "replay": ("cuda",)}


def configure(name):
    analyze_module.KNOWN_STEPS = KNOWN[name]
    analyze_module.REPLAY_DEVICES = DEVICES[name]


def eager_ms():
    with torch.no_grad():
        return median_ms(lambda: model(ids), n=10)


def snapshot():
    return {k: len(v) for k, v in parts.items()}, {k: len(v) for k, v in kineto.items()}, dict(replays)


def since(mark):
    counts, kcounts, rep = mark
    out = {k: sum(v[counts.get(k, 0):]) for k, v in parts.items()}
    out.update({k: sum(v[kcounts.get(k, 0):]) for k, v in kineto.items()})
    out.update({f"replay {k}": replays[k] - rep.get(k, 0) for k in ("matched", "failed")})
    return out


for _ in range(3):
    step()
configure("replay")
start = time.perf_counter()
brrr.analyze(model, ids, ceilings=ceil)
print(f"first analysis in the process: {(time.perf_counter() - start) * 1e3:.1f} ms")
for name in VARIANTS[::-1]:
    configure(name)
    brrr.analyze(model, ids, ceilings=ceil)

rows = defaultdict(lambda: defaultdict(list))
last = {}
for r in range(ROUNDS):
    for name in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
        configure(name)
        before = eager_ms()
        mark = snapshot()
        torch.cuda.synchronize()
        start = time.perf_counter()
        analysis = brrr.analyze(model, ids, ceilings=ceil)
        ms = (time.perf_counter() - start) * 1e3
        spent = since(mark)
        row = rows[name]
        note_analysis(row, ms, before, eager_ms(), analysis)
        for k, v in spent.items():
            row[k].append(v)
        last[name] = analysis
configure("replay")

print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {ROUNDS} rounds interleaved")
keys = ["ratio", "analyze_ms", "eager_ms", "wall_vs_eager", "after_vs_before", "replay matched", "replay failed",
        "timed_runs", "_prepare_profiler", "_enable_profiler", "_traced_run", "_disable_profiler", "session_events",
        "match_ops", "attribute_kernels", "records", "classify"]
for name, row in rows.items():
    print(f"== {name}: ratio {statistics.median(row['ratio']):.2f}x (range {min(row['ratio']):.2f}-{max(row['ratio']):.2f})")
    for k in keys:
        if k in row:
            print(f"   {k:20s} median {statistics.median(row[k]):8.3f}   sum/rounds {sum(row[k]) / len(row[k]):8.3f}")
for name, row in rows.items():
    print(name, "ratio per round:", " ".join(f"{v:.2f}" for v in row["ratio"]))


def class_table(analysis):
    return {c: round(v["time_pct"], 2) for c, v in analysis.op_classes.items()}


traced, replayed = last["traced"], last["replay"]
print("class time %  traced:", class_table(traced))
print("class time % replayed:", class_table(replayed))
print("kernel ops without a time: traced", sum(1 for o in traced.ops if o.op_class != "view" and o.time_s == 0),
      "replayed", sum(1 for o in replayed.ops if o.op_class != "view" and o.time_s == 0))
print("ops", len(traced.ops), len(replayed.ops), "busy ms", traced.busy_time_s * 1e3, replayed.busy_time_s * 1e3)
diffs = sorted(((abs(a.time_s - b.time_s) / a.time_s, a.index, a.name, a.time_s, b.time_s)
                for a, b in zip(traced.ops, replayed.ops) if a.time_s > 10e-6), reverse=True)
print("largest per-op differences (ops > 10 us):", [(round(d, 3), i, n, round(x * 1e6, 1), round(y * 1e6, 1))
                                                   for d, i, n, x, y in diffs[:5]])
print("median per-op |difference|:", statistics.median(d[0] for d in diffs) if diffs else None)

# compiled models: is a replay matched, and are compiled code's kernels the same?
from brrr.compile.backend import brrr_backend  # noqa: E402
from brrr.examples import mlp  # noqa: E402

for backend in ("inductor", brrr_backend):
    torch._dynamo.reset()
    net, (x,) = mlp(device="cuda", dtype=torch.bfloat16)
    fn = torch.compile(net, backend=backend)
    configure("replay")
    replays.clear()
    first = brrr.analyze(fn, x, ceilings=ceil)
    second = brrr.analyze(fn, x, ceilings=ceil)
    label = backend if isinstance(backend, str) else "brrr"
    names = lambda a: [(o.name, o.kernel) for o in a.ops if o.op_class != "view"]  # noqa: E731
    print(f"compiled ({label}): replays {dict(replays)}; same kernel-op names {names(first) == names(second)}; "
          f"busy {first.busy_time_s * 1e6:.1f} / {second.busy_time_s * 1e6:.1f} us; "
          f"{[(o.name, round(o.time_s * 1e6, 1)) for o in second.ops if o.op_class != 'view']}")
