"""`brrr.analyze(model, *inputs)`: where a step's time goes, op by op, and what to do about it.

The pipeline, one module per stage:
    step.py      the step: forward (no_grad), or forward + backward for train=True
    capture.py   TorchDispatchMode trace: every ATen op, its module, shapes, FLOPs, bytes, producers
    timing.py    torch.profiler: per-op device (CUDA) or host (CPU) time, wall time, device busy time
    regimes.py   roofline floor and regime per op / module / run; the op-class table
    advise.py    fusion, overhead and precision advice, each with a predicted saving
    report.py    terminal, JSON, roofline PNG and HTML renderings of the Analysis (analysis.py)
"""

import statistics
from contextlib import contextmanager

import torch

from brrr.analyze.analysis import Analysis
from brrr.callable_package import make_callable
from brrr.analyze.capture import OUTSIDE_MODEL, OpRecord, gc_paused, record_step, trace_names
from brrr.analyze.step import Step, resolve_device
from brrr.analyze.timing import (WarmWalls, cuda_op_times, device_busy_time, dynamo_frames_compiled, median_times,
                                 op_times, profiled, timed_runs)

__all__ = ["analyze", "Analysis", "OpRecord"]

STAGES = ("ceilings", "capture", "profile", "wall time", "classify")
WALL_RUNS = 2  # plain steps timed for the wall time (the faster): the warm-up step and one more, unless the
               # first comes within timing.WARM_TOLERANCE of this step's last plain step in an earlier analysis
WARM_WALLS = WarmWalls()


@contextmanager
def _stage_bar(enabled, done=1):
    """A rich progress bar over STAGES (the first `done` already finished), or a no-op."""
    if not enabled:
        yield lambda name: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("analyze", total=len(STAGES), completed=done)
        started = [False]

        def stage(name):
            if started[0]:
                bar.advance(task)
            started[0] = True
            bar.update(task, description=f"analyze: {name}")

        yield stage
        bar.advance(task)


def _tf32_enabled(device):
    if torch.get_float32_matmul_precision() != "highest":
        return True
    return device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32


def _profiled_times(prof, count, device):
    """(per-op seconds, busy seconds or None, kernels launched outside every op) of one profiled tracer run."""
    if device.type == "cuda":
        fast = cuda_op_times(prof, count)
        if fast is not None:
            return fast
    return op_times(prof, count, device), None, []


def _traced_run(step, device):
    """One step under the tracer and the profiler: (its Trace, per-op seconds, busy seconds, outside kernels)."""
    # on CUDA only ops that launch kernels need a range: views and metadata ops take no device time
    with profiled(device) as prof:
        trace = record_step(step, range_kernel_free_ops=device.type != "cuda")
    return (trace, *_profiled_times(prof, len(trace.raw), device))


def _kernel_records(outside, records):
    """OpRecords for the kernels compiled code launched outside every ATen op (see timing.cuda_op_times),
    appended after the ops, each with the module and phase of the op that ran before its launch."""
    kernels = []
    for name, seconds, before in outside:
        near = records[before] if 0 <= before < len(records) else None
        kernels.append(OpRecord(
            index=len(records) + len(kernels), name=name, module=near.module if near else OUTSIDE_MODEL["forward"],
            phase=near.phase if near else "forward", op_class="other", flops=0, bytes_read=0, bytes_written=0,
            dtype=None, time_s=seconds, kernel=True))
    return kernels


def analyze(model, *inputs, train=False, device=None, progress=False, ceilings=None, profile_runs=None):
    """Capture, time and classify every op of one step of `model(*inputs)`; returns an Analysis.

    train: a forward+backward step instead of inference.  device: where the step runs (default: the
    inputs' device).  ceilings: a Ceilings to use instead of the measured/cached ones of `device`.
    profile_runs: profiled steps whose per-op times are combined by median (default: 1 on CUDA, where
    kernel times repeat closely, 3 on CPU, where host times are noisy).
    """
    step = Step(model, inputs, train)
    device = resolve_device(model, inputs, device)
    if profile_runs is None:
        profile_runs = 1 if device.type == "cuda" else 3
    if ceilings is None:
        from brrr.cost.device import get_ceilings

        ceilings = get_ceilings(device, progress=progress)  # before our bar: rich allows one live display
    with _stage_bar(progress) as stage:
        stage("capture")
        # the plain steps that give the wall time run first and back to back; the first is also the warm-up:
        # compiles, autotuning, lazy initialization and a model that raises all happen outside the traced
        # step. They run before it, not after: a plain step right after a CUPTI session ran 5-10% slow on the
        # H100 (session 5, probe 6), which would read as overhead.
        plain = timed_runs(step, device, runs=WALL_RUNS, warm_s=WARM_WALLS.get(step))
        wall = min(plain)
        WARM_WALLS.put(step, plain[-1])
        compiles = dynamo_frames_compiled()
        trace, times, busy, outside = _traced_run(step, device)
        if dynamo_frames_compiled() != compiles:
            # Dynamo compiled in the traced step, warm-up or not: brrr's global module hooks are among what it
            # guards on, so a compiled model's first traced step recompiles. Compiling may autotune, and
            # candidate kernels would count as the step's: trace again, warm.
            trace, times, busy, outside = _traced_run(step, device)
        records = trace.records()  # priced and linked once the profiler has stopped
        names = [r.name for r in records]
        runs, busys = [times], [busy]

        stage("profile")
        for _ in range(profile_runs - 1):
            with profiled(device) as prof:
                run_names = trace_names(step, range_kernel_free_ops=device.type != "cuda")
            if run_names == names:  # a step whose ops differ run to run keeps only the captured timing
                times, busy, _ = _profiled_times(prof, len(records), device)
                runs.append(times)
                busys.append(busy)
        for record, seconds in zip(records, median_times(runs)):
            record.time_s = seconds
        records += _kernel_records(outside, records)

        stage("wall time")
        if None in busys:
            busy = device_busy_time(step, device)
        else:
            busy = statistics.median(busys)

        stage("classify")
        with gc_paused():  # thousands of small objects per analysis: no collection in the middle of them
            return Analysis.from_measurements(records, ceilings, wall, busy, train=train,
                                              tf32_enabled=_tf32_enabled(device))


make_callable(__name__, analyze)
