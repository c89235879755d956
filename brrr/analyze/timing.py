"""Stage 2 of the analyzer (capture -> time -> regimes -> advise -> report): how long things take.

Three measurements of the same step:
- per-op time: the step runs under capture's tracer with a `brrr#<index>` profiler range around each op;
  on CUDA an op's time is the device time of the kernels launched inside its range, on CPU the host time
  of the range. A CUDA inference step traced before runs without the tracer instead, its ATen events
  matched to the traced ops (replay.py); the kernels are attributed the same way (attribute_kernels).
- wall time: a plain step (no tracer, no profiler), synchronized: the fastest of the warm-up step and one
  more (and more while they still come down, `settled_runs`), all before the traced step (a plain step right after a CUPTI session runs slow for a while). A step
  brrr has timed before in this process needs only the first when it is as fast as then
  (step.KnownSteps).
- device busy time: on CUDA the union of the traced run's kernel intervals (kernels take as long with the
  tracer as without; only the gaps between them grow); on CPU a plain profiled step's summed top-level ATen
  op time, plus the traced host time of interpreted brrr kernels. Wall minus busy is time the device waited on
  the host (overhead).
- kernels compiled code launched outside every op: on CUDA those launched inside the step range but outside
  every op range; on CPU the launch ranges `brrr-kernel:<name>` of interpreted brrr kernels (capture.kernel_range).
  They become records in kernels.py. The traced run's intervals (ops' ranges, device kernels) are kept as a
  timeline of Slices for the trace export.

The profiler's raw Kineto events are read directly: on CUDA a kernel belongs to op i when the runtime call
that launched it (same correlation id) started inside range `brrr#i`; on CPU an op's time is the length of
its range. Building torch's FunctionEvent tree (`prof.function_events`) instead cost ~0.4 s per profiled
BERT-base step on the H100, 40x the step itself.
"""

import bisect
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler import profile

from brrr.analyze.capture import KERNEL_RANGE_PREFIX, RANGE_PREFIX, STEP_RANGE
from brrr.cost.device import synchronize, time_once
from brrr.errors import BrrrError


@contextmanager
def profiled(device, warm_up=True):
    """A Kineto profiler session over CPU (and CUDA when the step runs there); yields the profiler, whose
    `kineto_results` hold the raw events once the session has ended.

    This is torch.autograd.profiler.profile, the session torch.profiler.profile drives, without that wrapper:
    its start imports torch._inductor (~1.8 s in a fresh process, to read a CUDA-graphs setting) and gathers
    trace metadata brrr never writes out.

    The first op in a fresh session runs slow (seen: the first matmul at twice its time on an H100), so by
    default one tiny op runs first, outside any op range, to take that cost.
    """
    if torch.autograd._profiler_enabled():
        # Kineto runs one session at a time: starting brrr's would silently end the user's
        raise BrrrError("brrr.analyze runs its own profiler session: call it outside torch.profiler.profile")
    cuda = device.type == "cuda"
    tear_down = cuda and tear_down_cupti_after()
    synchronize(device)
    try:
        prof = profile(use_cpu=True, use_device="cuda" if cuda else None, use_kineto=True,
                       experimental_config=_lean_config())
        with without_native_lines(KINETO_NOISE):
            prof.__enter__()
        try:
            if warm_up:
                torch.zeros(1, device=device).add_(1)
                synchronize(device)
            yield prof
            synchronize(device)
        finally:
            with without_native_lines(KINETO_NOISE):
                prof.__exit__(*sys.exc_info())
    finally:
        if tear_down:
            # Kineto's teardown is lazy: it detaches CUPTI inside the callback of the next kernel launch. A
            # process that exits before launching another kernel hung at exit on the H100 host (`brrr analyze`
            # never returned), so the launch that completes the teardown happens here.
            torch.zeros(1, device=device).add_(1)
            synchronize(device)


# what Kineto's C++ prints on stderr as a session starts and stops ("USDT:<time> <pid>:<tid>
# SyncActivityProfilerHandler.cpp:52] profiler_start"): trace points meant for a tracer, noise in a terminal
KINETO_NOISE = "USDT:"


@contextmanager
def without_native_lines(prefix):
    """Run the body with file descriptor 2 captured, then pass on every line but those starting with `prefix`:
    lines written by C++ (not through sys.stderr) can only be kept off the terminal at the descriptor."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:   # no descriptor 2 (a daemon): nothing reaches a terminal anyway
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(prefix)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def tear_down_cupti_after():
    """Ask Kineto to release CUPTI when the session stops (TEARDOWN_CUPTI=1), unless the user chose already;
    True when the session will tear down.

    Left attached, CUPTI keeps instrumenting every launch: on the H100 host a BERT-base step ran 27-45% slower
    for the rest of the process after one analysis (`results/probes/...-df1d808-cupti-teardown.log`), which
    would slow the user's own training and inflate the wall time of any later analysis. The price is a re-initialization per analysis
    (~12 ms). CUDA before 12.6 could crash re-initializing CUPTI after CUDA graphs, so it is left alone there.
    """
    cuda = getattr(torch.version, "cuda", None)
    try:
        recent = cuda is not None and tuple(int(p) for p in cuda.split(".")[:2]) >= (12, 6)
    except ValueError:
        recent = False
    if recent:
        os.environ.setdefault("TEARDOWN_CUPTI", "1")
    return os.environ.get("TEARDOWN_CUPTI") == "1"


def _lean_config():
    """Kineto without external correlation: kernels are linked to ops here through the launch call's own
    correlation id and the brrr#i range around it, so the per-op correlation push is pure cost."""
    try:
        return torch.profiler._ExperimentalConfig(disable_external_correlation=True)
    except (AttributeError, TypeError):   # a torch without the option
        return None


def _kineto_events(prof):
    return prof.kineto_results.events()


def _range_index(name):
    """i for a `brrr#<i>` range, else None."""
    return int(name[len(RANGE_PREFIX):]) if name.startswith(RANGE_PREFIX) else None


class Slice(NamedTuple):
    """One interval of the traced step, kept for the trace export (trace.py)."""

    track: str        # "host": an op's range or an interpreted kernel's launch range | "device": a device kernel
    start_ns: int
    end_ns: int
    op: int | None    # the op index it belongs to, or None
    kernel: int | None  # its index among the kernels launched outside every op (their records), or None
    name: str         # a device kernel's name; "" for an op's range


class CudaTimes(NamedTuple):
    """What a profiled tracer run measured (see cuda_op_times; cpu_times on CPU)."""

    times: list       # device seconds per op index (CPU: host seconds)
    busy_s: float     # union of the step's kernel intervals (CPU: None)
    outside: list     # [(kernel name, seconds, index of the op range before its launch or -1)]
    kernels: list     # kernels launched per op index (CPU: None)
    timeline: list = None  # [Slice] of the run


class SessionEvents(NamedTuple):
    """The raw Kineto events of a session that timing reads, from one pass (session_events)."""

    launches: dict    # correlation id -> start of the runtime/driver call that launched it
    step: tuple       # (start, end) of the STEP_RANGE, or None
    kernels: list     # [(correlation id, start, end, event)]
    marks: list       # op spans: [(start, end, op index)] of the brrr#i ranges, or, with `wanted`, every CPU
                      # event named in it: [(start, end, name)]; sorted, outer before inner


def session_events(prof, wanted=None):
    """One pass over every event of a profiler session with as few accessor calls as it can. A launch call is a
    CUDA runtime or driver call: cudaLaunchKernel, cuLaunchKernelEx, ..."""
    launches, kernels, marks, step = {}, [], [], None
    cpu, prefix, cut = DeviceType.CPU, RANGE_PREFIX, len(RANGE_PREFIX)
    for e in _kineto_events(prof):
        if e.device_type() == cpu:
            name = e.name()
            if name.startswith("cu") and (name[2:4] == "da" or name[2:3].isupper()):
                launches[e.correlation_id()] = e.start_ns()
            elif name == STEP_RANGE:
                step = (e.start_ns(), e.end_ns())
            elif wanted is None:
                if name.startswith(prefix):
                    marks.append((e.start_ns(), e.end_ns(), int(name[cut:])))
            elif name in wanted:
                marks.append((e.start_ns(), e.end_ns(), name))
        elif not e.is_user_annotation():
            kernels.append((e.correlation_id(), e.start_ns(), e.end_ns(), e))
    marks.sort(key=_outer_first)
    return SessionEvents(launches, step, kernels, marks)


def _outer_first(mark):
    return mark[0], -mark[1]  # by start; of two events starting together the longer (outer) first


def cuda_op_times(prof, count):
    """Per-op device seconds, busy seconds and the kernels launched outside every op range, of a profiled
    tracer run on CUDA (its brrr#i ranges), from the raw Kineto events; None when the launch calls can't be
    linked to kernels (an unexpected profiler version)."""
    events = session_events(prof)
    return attribute_kernels(events, events.marks, count)


def attribute_kernels(events, spans, count):
    """CudaTimes from op spans [(start, end, op index)], sorted by start: a kernel belongs to op i when the
    call that launched it (same correlation id) started inside op i's span.

    A kernel launched inside the step range but outside every op span was launched by compiled code
    (Triton kernels of torch.compile or brrr) rather than by an ATen op: it counts towards the busy time and
    is returned in `outside`, in launch order. None when no kernel could be linked to its launch."""
    launches, step = events.launches, events.step
    starts = [span[0] for span in spans]
    times, intervals, outside, launched_by = [0.0] * count, [], [], [0] * count
    timeline = [Slice("host", start, end, index, None, "") for start, end, index in spans if index < count]
    for correlation, start, end, kernel in events.kernels:
        launched = launches.get(correlation)
        if launched is None:
            continue
        j = bisect.bisect_right(starts, launched) - 1
        if j >= 0 and launched <= spans[j][1] and spans[j][2] < count:
            times[spans[j][2]] += (end - start) / 1e9
            launched_by[spans[j][2]] += 1
            timeline.append(tuple.__new__(Slice, ("device", start, end, spans[j][2], None, kernel.name())))
        elif step is not None and step[0] <= launched <= step[1]:
            before = spans[j][2] if j >= 0 else -1
            outside.append((launched, kernel.name(), (end - start) / 1e9, before, start, end))
        else:
            continue  # the profiler's own warm-up op
        intervals.append((start, end))
    if events.kernels and not intervals:
        return None
    outside.sort()
    timeline += [Slice("device", entry[4], entry[5], None, k, entry[1]) for k, entry in enumerate(outside)]
    return CudaTimes(times, union_seconds(intervals) / 1e9, [entry[1:4] for entry in outside], launched_by,
                     timeline)


def _device_time_us(event):
    # device_time_total exists in torch >= 2.4; cuda_time_total is its deprecated older name
    value = getattr(event, "device_time_total", None)
    return value if value is not None else event.cuda_time_total


def op_times(prof, count, device):
    """Seconds per op index from the `brrr#<index>` ranges of a profiled tracer run (0 where none): the
    range's host time on CPU, its device time on CUDA (the fallback when cuda_op_times can't link kernels)."""
    if device.type != "cuda":
        return cpu_op_times(prof, count)
    times = [0.0] * count
    for event in prof.function_events:
        if event.device_type != DeviceType.CPU or not event.name.startswith(RANGE_PREFIX):
            continue
        index = int(event.name[len(RANGE_PREFIX):])
        if index < count:
            times[index] = _device_time_us(event) / 1e6
    return times


def cpu_times(prof, count):
    """CudaTimes of a profiled tracer run on CPU, from the raw Kineto events: host seconds per op index (the length
    of each `brrr#<index>` range) and, as kernels launched outside every op, the interpreted brrr kernels' launch
    ranges (`brrr-kernel:<name>`, capture.kernel_range), each with the op range that started before it."""
    times, ops, kernels = [0.0] * count, [], []
    for e in _kineto_events(prof):
        if e.device_type() != DeviceType.CPU:
            continue
        name = e.name()
        index = _range_index(name)
        if index is not None and index < count:
            times[index] = e.duration_ns() / 1e9
            ops.append((e.start_ns(), e.end_ns(), index))
        elif name.startswith(KERNEL_RANGE_PREFIX):
            kernels.append((e.start_ns(), e.end_ns(), name[len(KERNEL_RANGE_PREFIX):]))
    ops.sort()
    kernels.sort()
    starts = [op[0] for op in ops]
    outside, timeline = [], [Slice("host", start, end, index, None, "") for start, end, index in ops]
    for k, (start, end, name) in enumerate(kernels):
        j = bisect.bisect_right(starts, start) - 1
        outside.append((name, (end - start) / 1e9, ops[j][2] if j >= 0 else -1))
        timeline.append(Slice("host", start, end, None, k, name))
    return CudaTimes(times, None, outside, None, timeline)


def cpu_op_times(prof, count):
    """Host seconds per op index: the length of each `brrr#<index>` range, from the raw Kineto events."""
    times = [0.0] * count
    for e in _kineto_events(prof):
        if e.device_type() == DeviceType.CPU:
            index = _range_index(e.name())
            if index is not None and index < count:
                times[index] = e.duration_ns() / 1e9
    return times


def median_times(runs):
    """Element-wise median over equally long lists of per-op times."""
    if len(runs) == 1:
        return list(runs[0])
    return [statistics.median(values) for values in zip(*runs)]


def dynamo_frames_compiled():
    """How many times Dynamo has been asked to compile a frame in this process (its cache missed); 0 when
    torch._dynamo was never imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return utils.counters["frames"]["total"] if utils is not None else 0
    except (AttributeError, KeyError, TypeError):  # a torch whose counters look different
        return 0


WARM_TOLERANCE = 0.10  # a plain run at most this much slower than the step's last warm run is warm too. A cold
                       # run (lazy kernel loading, cuBLAS set-up, autotuning) is slower by far more; the H100
                       # hosts also drift, by up to 25% between analyses a few seconds apart, and a drift past
                       # this costs a second run, as a cold run would


def timed_runs(step, device, runs=1, recompiles=2, warm_s=None):
    """Seconds of each of up to `runs` back-to-back plain runs of the step (no tracer, no profiler),
    synchronized on both sides; the wall time is the fastest.

    A run during which Dynamo compiled doesn't count and another takes its place (up to `recompiles` times):
    a compiled model's first call compiles, and so does its first plain call after an analysis, since the
    tracer's global module hooks are among what Dynamo guards on.

    warm_s: this step's last warm run, from an earlier analysis (step.KnownSteps). A run that takes at most
    WARM_TOLERANCE longer, during which nothing compiled and the device allocator did not grow, was warm too:
    no more runs are taken."""
    samples, skipped = [], 0
    while len(samples) < runs:
        before, reserved = dynamo_frames_compiled(), _reserved_bytes(device)
        seconds = time_once(step, device)
        compiled = dynamo_frames_compiled() != before
        if compiled and skipped < recompiles:
            skipped += 1
            continue
        samples.append(seconds)
        if (warm_s is not None and not compiled and seconds <= warm_s * (1 + WARM_TOLERANCE)
                and _reserved_bytes(device) == reserved):
            break
    return samples


MAX_SETTLING_RUNS = 6     # plain runs settled_runs takes at most ...
SETTLING_BUDGET_S = 1.0   # ... and no more once they have taken this long together
SETTLED = 0.05            # a run no more than this much faster than the best before it: the step has settled


def settled_runs(step, device, runs, warm_s=None):
    """timed_runs, then more plain runs while the last one beat the best before it by more than SETTLED: a
    host-bound step can take several runs to come down (an H200's sweep saw the first two of 30 steps at
    1.2-2.5x the steady step), and their best is the wall time every regime is split from."""
    samples = timed_runs(step, device, runs=runs, warm_s=warm_s)
    while (len(samples) >= 2 and len(samples) < MAX_SETTLING_RUNS and sum(samples) < SETTLING_BUDGET_S
           and samples[-1] < (1 - SETTLED) * min(samples[:-1])):
        samples += timed_runs(step, device, runs=1)
    return samples


def _reserved_bytes(device):
    """Device memory the caching allocator holds: it grows when a run allocates afresh (a cold run)."""
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def union_seconds(intervals):
    """Total length covered by (start, end) intervals, overlaps counted once."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def top_level_seconds(spans):
    """Summed length of the (thread, start, end) spans not nested inside another span of the same thread."""
    by_thread = defaultdict(list)
    for thread, start, end in spans:
        by_thread[thread].append((start, -end))
    total = 0
    for starts in by_thread.values():
        reach = None
        for start, neg_end in sorted(starts):
            end = -neg_end
            if reach is not None and start < reach and end <= reach:
                continue  # inside the last top-level span
            total += end - start
            reach = end
    return total


def device_busy_time(step, device):
    """Seconds the device spends running ops in one plain profiled step (the warm-up op left out)."""
    with profiled(device) as prof:
        with torch.profiler.record_function(STEP_RANGE):
            step()
    if device.type == "cuda":
        return _cuda_busy_seconds(prof.function_events)
    # CPU: the summed host time of the step's top-level ATen ops, from the raw events
    events = [e for e in _kineto_events(prof) if e.device_type() == DeviceType.CPU]
    mark = next(e for e in events if e.name() == STEP_RANGE)
    start, end = mark.start_ns(), mark.end_ns()
    ops = [(e.start_thread_id(), e.start_ns(), e.end_ns()) for e in events
           if e.name().startswith("aten::") and start <= e.start_ns() <= end]
    return top_level_seconds(ops) / 1e9


def _cuda_busy_seconds(events):
    marks = [e for e in events if e.name == STEP_RANGE and e.device_type == DeviceType.CPU]
    start = marks[0].time_range.start
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and e.time_range.start >= start
               and not getattr(e, "is_user_annotation", False) and e.name != STEP_RANGE]
    return union_seconds((e.time_range.start, e.time_range.end) for e in kernels) / 1e6
