"""Between timing and predict (capture -> time -> **precision** -> regimes -> predict): what the step costs in a
faster precision mode, from the ops that mode runs, each contraction timed in it.

Scaling each fp32 matmul by the ratio of two roofs missed by 15-60% on the sweep (results/sweep-analyze): a
tensor-core GEMM of a model's shapes reaches a smaller share of its roof than an fp32 one does of its own, and
bf16 autocast adds work the contractions alone don't show (a cast before each contraction, fp32 norms and
softmaxes reading bf16, a launch and a dispatch per cast). So, per mode:

- the ops: for bf16, the step runs once more under the tracer inside `torch.autocast` (no profiler): the casts
  autocast inserts and every op's dtypes in that mode. TF32 runs the analyzed step's own ops.
- device time per op (`mode_device_times`): each distinct contraction call of the mode is timed on the device
  with random operands of its recorded shapes, strides and dtypes (`time_contractions`, at most
  MAX_TIMED_CALLS, the most FLOPs first); an op whose call is the analyzed one's keeps its measured time; one
  whose dtypes changed is scaled by its bytes (by its roofline floors if a contraction); an op the analyzed
  step did not run (a cast) moves its bytes at COPY_FRACTION of the copy bandwidth, no faster than the step's
  shortest kernel.
- the step (`mode_step_seconds`): a host issuing the ops in order and a device running their kernels in order,
  simulated (`simulated_wall`). The analyzed step's host time per op comes from its profiler ranges (the op's
  own ATen call) and the gaps between them (Python, scaled by the one factor that makes the simulation take
  the measured wall time: the tracer's own cost sits in the gaps). An op autocast inserted costs the host the
  median ATen call of the step. A host-bound step thus gets slower under autocast, as measured, and a device-
  bound one gets the contractions' gain.
"""

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from brrr.analyze.capture import _RawOp, _thaw, record_step
from brrr.cost.device import synchronize
from brrr.cost.ops import written_arguments

MAX_TIMED_CALLS = 48   # distinct contraction calls timed per mode (a 12-layer transformer has ~10)
TIME_BUDGET_S = 5.0    # ... and no more seconds of timing per mode; the rest are scaled by their roofs
COPY_FRACTION = 0.85   # a cast is a plain copy: brrr's and ATen's copies reach 85-90% of the copy bandwidth
CASTS = ("aten._to_copy.default", "aten.to.dtype", "aten.copy_.default")
LOOKAHEAD = 8          # ops the alignment skips in the analyzed step to find an op of the mode's step again


@contextmanager
def tf32_matmuls():
    """TF32 for fp32 matmuls for the body; the previous settings restored after."""
    precision, allow = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cuda.matmul.allow_tf32 = allow


@dataclass
class ModeStep:
    """The step in precision mode `key`: its ops and the device seconds measured for some of them."""

    key: str
    records: list                 # OpRecords of the step in the mode, in order (tf32: the analyzed step's own)
    timed: dict = field(default_factory=dict)   # index into records -> device seconds measured in the mode
    same_ops: bool = False        # the mode runs the analyzed step's ops one to one (tf32)


def fp32_contractions(records, cublas_only=False):
    """The step's fp32 contractions that do work (for TF32: cuBLAS matmuls only; see advise.CUBLAS_MATMULS)."""
    from brrr.analyze.advise import CUBLAS_MATMULS, short_name

    return [r for r in records if r.contraction and r.dtype == torch.float32 and r.flops > 0
            and (not cublas_only or short_name(r.name) in CUBLAS_MATMULS)]


# ------------------------------------------------------------------------------------------------ measuring

def measure_modes(step, records, raw, device, tf32_enabled):
    """{key: ModeStep} for the modes that could speed this step up: bf16 where it has fp32 contractions, TF32
    on CUDA where it has fp32 cuBLAS matmuls and TF32 is off. `raw`: the analyzed trace's raw ops, one per
    record. A mode whose step raises is left out (predict falls back to the roofline ratio)."""
    modes = {}
    if any(r.kernel for r in records) or _compiled(step.model):
        return modes   # compiled code: its kernels run outside the traced ops, and autocast would recompile it
    if device.type == "cuda" and not tf32_enabled and fp32_contractions(records, cublas_only=True):
        timed = time_contractions(raw, [r.index for r in fp32_contractions(records, cublas_only=True)], records,
                                  device, tf32_matmuls)
        modes["tf32"] = ModeStep("tf32", records, timed, same_ops=True)
    if fp32_contractions(records):
        try:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                trace = record_step(step, mark_ranges=False)
            mode_records = trace.records()
        except Exception:  # a model autocast breaks: no measured figure, and verify will say why
            return modes
        baseline = {_call_key(r) for r in records}
        wanted = [r.index for r in mode_records if r.contraction and r.flops > 0 and _call_key(r) not in baseline]
        modes["bf16"] = ModeStep("bf16", mode_records, time_contractions(trace.raw, wanted, mode_records, device))
    return modes


def _compiled(model):
    dynamo = getattr(torch, "_dynamo", None)
    return dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule)


def _call_key(record):
    return record.name, tuple(record.input_shapes), tuple(record.input_dtypes)


def time_contractions(raw, indices, records, device, settings=None):
    """{index: seconds} of the raw ops at `indices` run alone on random operands of their recorded layouts
    (under `settings`, a context-manager factory): each distinct call once, the most FLOPs first, within
    MAX_TIMED_CALLS and TIME_BUDGET_S. An op that writes its inputs, or whose operands can't be rebuilt, is
    left out."""
    calls = {}
    for i in indices:
        op = raw[i]
        if type(op) is not _RawOp or written_arguments(op.func):
            continue
        try:
            calls.setdefault(op.signature(), []).append(i)
        except TypeError:  # an unhashable argument
            continue
    ordered = sorted(calls.items(), key=lambda kv: -records[kv[1][0]].flops)[:MAX_TIMED_CALLS]
    timed, start = {}, time.perf_counter()
    for signature, where in ordered:
        if time.perf_counter() - start > TIME_BUDGET_S:
            break
        seconds = _timed_call(raw[where[0]], device, settings, signature)
        if seconds is not None:
            timed.update((i, seconds) for i in where)
    return timed


_TIMED = {}   # (signature, settings, device) -> seconds or None: a model analyzed twice times nothing again


def _timed_call(op, device, settings, signature):
    key = (signature, getattr(settings, "__name__", None), str(device))
    if key not in _TIMED:
        try:
            _TIMED[key] = _run_alone(op, device, settings)
        except Exception:  # an op whose operands random data can't stand for (indices, seeds on another device)
            _TIMED[key] = None
    return _TIMED[key]


def _operand(shape, stride, dtype, device):
    """A tensor of this layout over its own storage: normal values for floats, zeros otherwise."""
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(n > 0 for n in shape) else 0
    base = torch.empty(max(extent, 1), dtype=dtype, device=device)
    base.normal_() if dtype.is_floating_point else base.zero_()
    return base.as_strided(tuple(shape), tuple(stride))


def _run_alone(op, device, settings):
    tensors = [_operand(shape, stride, dtype, device) for shape, stride, dtype in op.metas]
    args = tuple(_thaw(v, tensors) for v in op.args)
    kwargs = {name: _thaw(v, tensors) for name, v in op.kwargs}
    with torch.no_grad(), (settings() if settings else _nothing()):
        return _median_seconds(lambda: op.func(*args, **kwargs), device)


@contextmanager
def _nothing():
    yield


def _median_seconds(fn, device, runs=5):
    fn()
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=2, rep=10, return_mode="median") / 1e3
    times = []
    for _ in range(runs):
        synchronize(device)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------------ pricing

def _launches(record):
    return record.kernel or bool(record.flops or record.bytes_read or record.bytes_written)


def align(records, mode_records):
    """For each mode record, the index of the analyzed record it stands for, or None for an op the analyzed step
    did not run (a cast autocast inserted). Launching ops only (views move nothing); in order, greedily: the
    same op name matches, a cast the analyzed step has not here is inserted, and any other op is looked for
    LOOKAHEAD ops ahead, the analyzed ops skipped on the way left unmatched."""
    analyzed = [r for r in records if _launches(r)]
    matched, i = {}, 0
    for m in mode_records:
        if not _launches(m):
            continue
        if i < len(analyzed) and analyzed[i].name == m.name:
            matched[m.index], i = analyzed[i].index, i + 1
            continue
        if m.name in CASTS:
            continue
        ahead = next((k for k in range(i + 1, min(i + 1 + LOOKAHEAD, len(analyzed)))
                      if analyzed[k].name == m.name), None)
        if ahead is not None:
            matched[m.index], i = analyzed[ahead].index, ahead + 1
    return matched


def _floor(record, ceilings, bytes_scale=1.0):
    return ceilings.roofline_time(record.flops, record.bytes * bytes_scale, record.dtype, record.contraction)


def mode_device_times(mode, records, matched, ceilings):
    """Device seconds per launching op of the mode's step, keyed by its index (see the module docstring)."""
    by_index = {r.index: r for r in records}
    shortest = min((r.time_s for r in records if r.time_s > 0 and _launches(r)), default=0.0)
    bandwidth = ceilings.bandwidth * COPY_FRACTION
    times = {}
    for m in mode.records:
        if not _launches(m):
            continue
        was = by_index.get(m.index) if mode.same_ops else by_index.get(matched.get(m.index))
        if m.index in mode.timed:
            times[m.index] = mode.timed[m.index]
        elif was is None:
            times[m.index] = max(m.bytes / bandwidth if bandwidth > 0 else 0.0, shortest)
        elif mode.same_ops or _call_key(was) == _call_key(m):
            times[m.index] = was.time_s
        elif m.contraction:
            old = _floor(was, ceilings)
            times[m.index] = was.time_s * (_floor(m, ceilings) / old if old > 0 else 1.0)
        else:
            times[m.index] = was.time_s * (m.bytes / was.bytes if was.bytes else 1.0)
    if mode.key == "tf32":   # TF32 under the analysis' settings: the roof for fp32 contractions is TF32's
        for r in fp32_contractions(records, cublas_only=True):
            if r.index not in mode.timed and ceilings.matmul.get("tf32"):
                old = _floor(r, ceilings)
                new = max(r.flops / ceilings.matmul["tf32"], r.bytes / ceilings.bandwidth)
                times[r.index] = r.time_s * (new / old if old > 0 else 1.0)
    return times


def host_program(records, timeline):
    """{record index: (gap seconds before its range, seconds inside its range)} of the analyzed step's ops that
    have a host range in the timeline (analysis.timeline: (track, start_ns, end_ns, index, name))."""
    spans = sorted((s[1], s[2], s[3]) for s in timeline or () if s[0] == "host" and s[3] < len(records))
    program, last_end = {}, None
    for start, end, index in spans:
        gap = 0.0 if last_end is None else max(start - last_end, 0) / 1e9
        program[index] = (gap, (end - start) / 1e9)
        last_end = max(end, last_end or end)
    return program


def simulated_wall(ops):
    """Seconds until the host has issued and the device has run `ops`: (host seconds, device seconds) in order;
    each kernel starts once issued and once the previous one is done."""
    host = device = 0.0
    for host_s, device_s in ops:
        host += host_s
        if device_s > 0:
            device = max(device, host) + device_s
    return max(host, device)


def _gap_scale(ops, wall_s, iterations=30):
    """The factor on the host gaps (not the ops' own ranges) that makes the simulated step take `wall_s`: 0 when
    the device alone takes longer, at most 1 (the traced run's gaps hold the tracer's cost too)."""
    def wall(scale):
        return simulated_wall([(scale * gap + inside, device) for gap, inside, device in ops])

    if wall(0.0) >= wall_s:
        return 0.0
    if wall(1.0) <= wall_s:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if wall(mid) < wall_s else (lo, mid)
    return (lo + hi) / 2


def mode_step_seconds(mode, records, ceilings, wall_s, busy_s, timeline):
    """(predicted step seconds in the mode, how, parts), or None without the analyzed step's host ranges."""
    program = host_program(records, timeline)
    analyzed = [r for r in records if _launches(r) and not r.kernel]
    if not program or not analyzed:
        return None
    total = sum(r.time_s for r in records)
    scale = min(busy_s, wall_s) / total if total > 0 else 0.0   # traced op times -> the plain step's busy time
    ranges = sorted(inside for _, inside in program.values())
    inserted_host = ranges[len(ranges) // 2]
    matched = {r.index: r.index for r in records} if mode.same_ops else align(records, mode.records)
    device = mode_device_times(mode, records, matched, ceilings)
    base = [(*program.get(r.index, (0.0, 0.0)), r.time_s * scale) for r in analyzed]
    gap_scale = _gap_scale(base, wall_s)
    simulated_base = simulated_wall([(gap_scale * g + inside, d) for g, inside, d in base])
    mode_ops = []
    for m in mode.records:
        if m.index not in device:
            continue
        was = matched.get(m.index)
        gap, inside = program.get(was, (0.0, 0.0)) if was is not None else (0.0, inserted_host)
        mode_ops.append((gap_scale * gap + inside, device[m.index] * scale))
    if ceilings.kind == "cuda":
        simulated = simulated_wall(mode_ops)
    else:  # the CPU's ops run on the host: an op's time is host time, and the step is their sum
        simulated, simulated_base = sum(d for _, d in mode_ops), sum(d for _, _, d in base)
    inserted = sum(1 for m in mode.records if m.index in device and matched.get(m.index) is None)
    timed = len(mode.timed)
    step = max(wall_s + simulated - simulated_base, 0.0)
    how = (f"{timed} contraction calls timed in {mode.key}, {inserted} ops added; device "
           f"{sum(d for _, _, d in base) * 1e3:.3g} -> {sum(d for _, d in mode_ops) * 1e3:.3g} ms, host and device "
           f"simulated in step order")
    parts = (("device_s", sum(d for _, d in mode_ops)), ("host_s", sum(h for h, _ in mode_ops)),
             ("timed_calls", timed), ("inserted_ops", inserted), ("gap_scale", gap_scale))
    return step, how, parts
