"""`brrr.analyze(model, *inputs)`: where a step's time goes, op by op, and what to do about it.

The pipeline, one module per stage:
    step.py      the step: forward (no_grad), or forward + backward for train=True
    capture.py   TorchDispatchMode trace: every ATen op, its module, shapes, FLOPs, bytes, producers
    replay.py    a step traced before, timed again without the tracer (its ops matched to profiler events)
    timing.py    torch.profiler: per-op device (CUDA) or host (CPU) time, wall time, device busy time
    kernels.py   kernels compiled code launched outside the ops, priced from brrr's kernel registry
    regimes.py   roofline floor and regime per op / module / run; the op-class table
    graphs.py    the graphs, breaks and guards Dynamo cuts the step into (priced per graph call by predict.py)
    precision.py the step in bf16 autocast and TF32: the ops each mode runs, its contractions timed in it
    predict.py   one predicted step time per remedy brrr can apply (compile, CUDA graphs, TF32, ...)
    advise.py    fusion, overhead and precision advice, each with a predicted saving
    calibration.py  per device and remedy kind, how far off predictions were: the correction applied
    verify.py    (verify=True) each remedy applied to a copy of the model and measured
    report.py    terminal, JSON, roofline PNG and HTML renderings of the Analysis (analysis.py)
    trace.py     Chrome/Perfetto trace of the analyzed step
"""

import statistics

import torch

from brrr.analyze import calibration
from brrr.analyze.analysis import Analysis
from brrr.analyze.progress import step_bar
from brrr.callable_package import make_callable
from brrr.analyze.capture import OpRecord, gc_paused, record_step, step_range, trace_names
from brrr.analyze.graphs import graph_structure
from brrr.analyze.kernels import kernel_records
from brrr.analyze.precision import measure_modes
from brrr.analyze.replay import expected_ops, match_ops, model_state, span_seconds
from brrr.analyze.step import KnownStep, KnownSteps, Step, resolve_device
from brrr.analyze.timing import (CudaTimes, attribute_kernels, cpu_times, cuda_op_times, device_busy_time,
                                 dynamo_frames_compiled, median_times, op_times, profiled, session_events,
                                 settled_runs)

__all__ = ["analyze", "Analysis", "OpRecord"]

STAGES = ("ceilings", "capture", "profile", "wall time", "precision modes", "classify")
WALL_RUNS = 2  # plain steps timed for the wall time (the faster): the warm-up step and one more, unless the
               # first comes within timing.WARM_TOLERANCE of this step's last plain step in an earlier analysis;
               # more while they still come down (timing.settled_runs)
KNOWN_STEPS = KnownSteps()  # what earlier analyses in this process learned: last wall time, trace
REPLAY_DEVICES = ("cuda",)  # where a step traced before is timed without the tracer (replay.py). Not on CPU: there
                            # views take host time too, and the replay times only the ops that launch kernels


def _stage_bar(enabled, done=1):
    """A rich progress bar over STAGES (the first `done` already finished), or a no-op."""
    return step_bar(enabled, "analyze", len(STAGES), done)


def _tf32_enabled(device):
    if torch.get_float32_matmul_precision() != "highest":
        return True
    return device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32


def _profiled_times(prof, count, device):
    """(per-op seconds, busy seconds or None, kernels launched outside every op, kernels per op or None, timeline
    or None) of one profiled tracer run (timing.CudaTimes)."""
    if device.type == "cuda":
        fast = cuda_op_times(prof, count)
        if fast is not None:
            return fast
        return CudaTimes(op_times(prof, count, device), None, [], None)
    return cpu_times(prof, count)


def _traced_run(step, device):
    """One step under the tracer and the profiler: (its Trace, _profiled_times). Traced again when Dynamo
    compiled during it: brrr's global module hooks are among what Dynamo guards on, so a compiled model's
    first traced step recompiles, and compiling may autotune on the device (candidate kernels would count as
    the step's)."""
    for _ in range(2):
        compiles = dynamo_frames_compiled()
        # on CUDA only ops that launch kernels need a range: views and metadata ops take no device time
        with profiled(device) as prof:
            cpu = device.type != "cuda"
            trace = record_step(step, range_kernel_free_ops=cpu, mark_kernels=cpu)
        if dynamo_frames_compiled() == compiles:
            break
    return trace, _profiled_times(prof, len(trace.raw), device)


def _replayed_run(step, device, known):
    """(per-op seconds, busy seconds or None, outside kernels) of one plain step in a profiler session, timed
    against the KnownStep's trace (replay.py); None when the step no longer runs that program: an op without
    its event, another number of kernels from an op, other kernels outside the ops, or Dynamo compiled."""
    compiles = dynamo_frames_compiled()
    with profiled(device) as prof:
        with step_range():
            step()
    if dynamo_frames_compiled() != compiles:
        return None
    events = session_events(prof, {name for _, name in known.expected})
    spans = match_ops(events.marks, known.expected, events.step)
    if spans is None:
        return None
    if device.type != "cuda":
        return span_seconds(spans, len(known.trace.raw)), None, [], None
    timed = attribute_kernels(events, spans, len(known.trace.raw))
    if timed is None or timed.kernels != known.kernels or [k[0] for k in timed.outside] != known.outside:
        return None
    return timed.times, timed.busy_s, timed.outside, timed.timeline


def _measured_run(step, device, known):
    """(Trace, per-op seconds, busy seconds or None, outside kernels, timeline or None) of one timed step:
    replayed against the KnownStep when the step was traced before, its trace can be replayed
    (replay.expected_ops) and the model's state is unchanged; else traced, and `known` updated for later runs. A
    step whose replay failed once is traced from then on."""
    replays = device.type in REPLAY_DEVICES and known.replayable
    state = model_state(step.model) if replays else None
    if replays and known.expected is not None and known.state == state:
        timed = _replayed_run(step, device, known)
        if timed is not None:
            return (known.trace, *timed)
        known.replayable = replays = False
    trace, (times, busy, outside, kernels, timeline) = _traced_run(step, device)
    known.trace, known.state, known.kernels, known.outside = trace, state, kernels, [k[0] for k in outside]
    known.expected = expected_ops(trace) if replays else None
    return trace, times, busy, outside, timeline


def _record_timeline(timeline, ops):
    """The traced run's slices as (track, start_ns, end_ns, record index, name): an op's slices point at its record,
    a kernel launched outside every op at its kernel record (numbered after the `ops` op records)."""
    if not timeline:
        return None
    return [(s.track, s.start_ns, s.end_ns, s.op if s.op is not None else ops + s.kernel, s.name) for s in timeline]


def analyze(model, *inputs, train=False, device=None, progress=False, ceilings=None, profile_runs=None,
            verify=False, calibrate=True):
    """Capture, time and classify every op of one step of `model(*inputs)`; returns an Analysis.

    train: a forward+backward step instead of inference.  device: where the step runs (default: the
    inputs' device).  ceilings: a Ceilings to use instead of the measured/cached ones of `device`.
    profile_runs: profiled steps whose per-op times are combined by median (default: 1 on CUDA, where
    kernel times repeat closely, 3 on CPU, where host times are noisy).
    verify: apply each remedy brrr can apply to a copy of the model and measure it (verify.py); the results
    are in `Analysis.verify` and on the advice items.  calibrate: correct predictions by what earlier
    verifications on this device measured (calibration.py).
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
        # H100 (`results/probes/...-d719300-wall-after-cupti.log`), which would read as overhead.
        known = KNOWN_STEPS.get(step) or KnownStep()  # a step that can't be remembered: for this analysis
        plain = settled_runs(step, device, runs=WALL_RUNS, warm_s=known.wall_s)
        wall = min(plain)
        known.wall_s = plain[-1]
        trace, times, busy, outside, timeline = _measured_run(step, device, known)
        records = trace.records()  # priced and linked once the profiler has stopped
        runs, busys = [times], [busy]

        stage("profile")
        names = [r.name for r in records]
        for _ in range(profile_runs - 1):
            # more timed runs of the same ops (a run whose ops differ doesn't count): replayed where it can be
            if known.expected is not None:
                timed = _replayed_run(step, device, known)
            else:
                with profiled(device) as prof:
                    run_names = trace_names(step, range_kernel_free_ops=device.type != "cuda",
                                            mark_kernels=device.type != "cuda")
                timed = _profiled_times(prof, len(records), device) if run_names == names else None
            if timed is not None:
                runs.append(timed[0])
                busys.append(timed[1])
        for record, seconds in zip(records, median_times(runs)):
            record.time_s = seconds
        ops = len(records)
        records += kernel_records(outside, records, step.model)

        stage("wall time")
        if None in busys:
            busy = device_busy_time(step, device)
            if device.type != "cuda":   # interpreted brrr kernels: host time in no ATen op, busy all the same
                busy += sum(r.time_s for r in records[ops:])
        else:
            busy = statistics.median(busys)

        stage("precision modes")
        # bf16 and TF32 priced from the ops they run, their contractions timed in the mode (precision.py)
        modes = measure_modes(step, records, trace.raw, device, _tf32_enabled(device))

        stage("classify")
        # a host-bound step pays per compiled graph: count the graphs Dynamo would cut it into (graphs.py).
        # Counted on every step, not only on those measured host-bound: a decision on noisy times would differ
        # from one analysis to the next
        structure = graph_structure(model, inputs)
        with gc_paused():  # thousands of small objects per analysis: no collection in the middle of them
            analysis = Analysis.from_measurements(records, ceilings, wall, busy, train=train,
                                                  tf32_enabled=_tf32_enabled(device),
                                                  timeline=_record_timeline(timeline, ops), structure=structure,
                                                  modes=modes)
    table = calibration.load_table(analysis.device) if calibrate else {}
    calibration.calibrate_advice(analysis.advice, table, analysis.wall_time_s)
    if verify:  # after the stage bar: rich shows one live display at a time
        from brrr.analyze.verify import verify as verify_remedies

        verify_remedies(analysis, model, inputs, train=train, device=device, progress=progress, table=table,
                        record=calibrate)
    return analysis


make_callable(__name__, analyze)
