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
  shortest memory-bound op.
- the step (`mode_step_seconds`): the longer of the host and the device, plus what the analyzed step spent beyond
  both. The host of a step whose device idles HOST_BOUND_SHARE of the time is its wall time; of any other, a
  launch latency per op (the profiler's op ranges can't say: a host far ahead of the device blocks inside
  them). Each op autocast inserts adds a launch latency: a host-bound step gets slower under autocast, as
  measured, and a device-bound one gets its contractions' gain until its host paces it.
"""

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from brrr.analyze.advise import fp32_contractions
from brrr.analyze.capture import _RawOp, _thaw, launches_kernel, record_step
from brrr.analyze.regimes import time_scale
from brrr.cost.device import median_time
from brrr.cost.ops import written_arguments

HOST_BOUND_SHARE = 0.25  # a step whose device idles this share of the wall time is paced by its host
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


# ------------------------------------------------------------------------------------------------ measuring

def measure_modes(step, records, raw, device, tf32_enabled):
    """{key: ModeStep} for the modes that could speed this step up: bf16 where it has fp32 contractions, TF32
    on CUDA where it has fp32 cuBLAS matmuls and TF32 is off. `raw`: the analyzed trace's raw ops, one per
    record. A mode whose step raises is left out (predict falls back to the roofline ratio)."""
    modes = {}
    if any(r.kernel for r in records) or _compiled(step.model):
        return modes   # compiled code: its kernels run outside the traced ops, and autocast would recompile it
    matmuls = fp32_contractions(records, cublas_only=True)
    if device.type == "cuda" and not tf32_enabled and matmuls:
        timed = time_contractions(raw, [r.index for r in matmuls], records, device, tf32_matmuls)
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
    MAX_TIMED_CALLS and TIME_BUDGET_S. An op that writes its inputs, takes an integer tensor (offsets, lengths,
    RNG seeds) or whose operands can't be rebuilt is left out."""
    calls = {}
    for i in indices:
        op = raw[i]
        if type(op) is not _RawOp or written_arguments(op.func):
            continue
        if any(not op.metas[g][2].is_floating_point for g in op.inputs):
            continue   # offsets, lengths or seeds random data can't stand for (a kernel reading out of bounds)
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
    with torch.no_grad(), (settings() if settings else nullcontext()):
        return _median_seconds(lambda: op.func(*args, **kwargs), device)


def _median_seconds(fn, device):
    return median_time(fn, device, reps=3, rep_ms=10, warmup_ms=2)


# ------------------------------------------------------------------------------------------------ pricing

def align(records, mode_records):
    """For each mode record, the index of the analyzed record it stands for, or None for an op the analyzed step
    did not run (a cast autocast inserted). Launching ops only (views move nothing); in order, greedily: the
    same op name matches, a cast the analyzed step has not here is inserted, and any other op is looked for
    LOOKAHEAD ops ahead, the analyzed ops skipped on the way left unmatched."""
    analyzed = [r for r in records if launches_kernel(r)]
    matched, i = {}, 0
    for m in mode_records:
        if not launches_kernel(m):
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
    # a kernel's fixed device cost: the shortest memory-bound op the step ran
    shortest = min((r.time_s for r in records if r.time_s > 0 and launches_kernel(r) and not r.contraction), default=0.0)
    bandwidth = ceilings.bandwidth * COPY_FRACTION
    times = {}
    for m in mode.records:
        if not launches_kernel(m):
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


def mode_step_seconds(mode, records, ceilings, wall_s, busy_s, split):
    """(predicted step seconds in the mode, how, parts), or None for a step with no ATen op (see the module
    docstring)."""
    analyzed = [r for r in records if launches_kernel(r) and not r.kernel]
    if not analyzed:
        return None
    scale = time_scale(records, wall_s, busy_s)   # traced op times -> the plain step's busy time
    matched = {r.index: r.index for r in records} if mode.same_ops else align(records, mode.records)
    device = mode_device_times(mode, records, matched, ceilings)
    # traced times are scaled to the plain step; a contraction timed alone already ran plain (scaled too, a loaded
    # host's slow trace shrank the seed MLP's timed bf16 matmuls to nothing and its step to 0 s)
    plain = {i: t if i in mode.timed else t * scale for i, t in device.items()}
    mode_device = sum(plain.values())
    inserted = sum(1 for index in device if matched.get(index) is None)
    if ceilings.kind != "cuda":   # the CPU's ops run on the host: the step is their sum
        step = wall_s + mode_device - sum(r.time_s for r in analyzed) * scale
        host = mode_host = None
    else:
        host_bound = split.get("overhead", 0.0) >= HOST_BOUND_SHARE * wall_s
        host = wall_s if host_bound else len(analyzed) * ceilings.launch_latency
        mode_host = host + inserted * ceilings.launch_latency
        step = max(mode_host, mode_device) + max(wall_s - max(host, min(busy_s, wall_s)), 0.0)
    how = (f"{len(mode.timed)} contraction calls timed in {mode.key}, {inserted} ops added (casts); device "
           f"{min(busy_s, wall_s) * 1e3:.3g} -> {mode_device * 1e3:.3g} ms")
    if mode_host is not None:
        how += f", host {host * 1e3:.3g} -> {mode_host * 1e3:.3g} ms"
    by_class = {}   # where the mode's device time goes, for the sweep's records: contractions, casts, the rest
    for m in mode.records:
        if m.index in device:
            key = "cast" if matched.get(m.index) is None and m.name in CASTS else m.op_class
            by_class[key] = by_class.get(key, 0.0) + plain[m.index]
    parts = (("device_s", mode_device), ("host_s", mode_host), ("timed_calls", len(mode.timed)),
             ("inserted_ops", inserted)) + tuple((f"device_{key}_s", v) for key, v in sorted(by_class.items()))
    return max(step, 0.0), how, parts
