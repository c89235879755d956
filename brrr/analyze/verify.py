"""After advise (capture -> time -> regimes -> predict -> advise -> **verify** -> report): apply each remedy
brrr can apply to a copy of the model, measure the step, and set the measurement beside the prediction.

`analyze(..., verify=True)` / `brrr analyze --verify`. Each remedy (a `Remedy` in REMEDIES; tests add
doubles) is applied to `copy.deepcopy` of the model and its inputs; the copy's step runs `warmup_calls`
times (compiling happens there: a call during which Dynamo compiled counts, less one measured step, as
compile time, kept apart from the step time) and on until no trial of brrr's is timing or waiting
(`trial_turns.settle`: a model of several graphs decides them in turn), then is timed as the analyzer times
its wall step (`timing.timed_runs`: plain synchronized steps, the fastest), MEASURE_RUNS of them. The model as
analyzed is timed the same way before and after the remedies; the faster is the baseline every remedy is judged
against (a step right after the analysis' profiler session can run slow for a while). Global settings a remedy changes
(TF32 flags, autocast) are restored after it; a remedy that raises is reported as failed with its reason.

Per remedy: the predicted step time (predict.py, calibrated where calibration.py has measured that kind; a
prediction built on the analyzed wall time, such as "the step less a saving", moves with the baseline's
difference from it: `Prediction.at_wall`), the measured one, the saving against the baseline, and the
prediction's error, (predicted - measured) / measured. A remedy that measured no faster than the baseline is
a loss: its advice (and, for "compile", the fusion advice that says brrr.compile does it) is dropped from
the analysis' advice. Each measurement is recorded in the calibration table (measured / uncalibrated
predicted).

The doubled batch is measured and predicted per current batch (the doubled step's time over two).
"""

import copy
import gc
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from brrr.analyze import calibration
from brrr.analyze.advise import advice_item, fp32_contractions
from brrr.analyze.precision import tf32_matmuls
from brrr.analyze.progress import step_bar
from brrr.analyze.step import Step
from brrr.analyze.timing import dynamo_frames_compiled, timed_runs
from brrr.compile.runtime import trial_turns
from brrr.cost.device import synchronize

MEASURE_RUNS = 5      # plain steps timed per remedy (and for the baseline); the fastest is the step time
WARMUP_CALLS = 3      # calls before timing: compiles, autotuning, lazy initialization, the allocator growing
REASON_CHARS = 300    # a failed remedy's reason is cut here


@dataclass
class Prepared:
    """A remedy applied to a copy: the model and inputs to step, the settings to step them under, and how
    many current batches one step holds."""

    model: object
    inputs: tuple
    settings: object = nullcontext   # a context-manager factory, entered around warm-up and timing
    batches: int = 1
    warmup_calls: int = WARMUP_CALLS


@dataclass
class Target:
    """What a remedy is applied to: the analyzed model and inputs, and how the analysis ran them."""

    model: object
    inputs: tuple
    train: bool
    device: torch.device
    fp32_contractions: int | None = None   # fp32 matmul-family ops the analysis saw (None: not known)
    fp32_matmuls: int | None = None        # ... of them cuBLAS matmuls, what TF32 reaches


class Remedy:
    """One thing brrr can apply and measure. `kind` matches the advice kind (predict.REMEDY_KINDS)."""

    kind = ""
    label = ""

    def not_applicable(self, target):
        """Why this remedy does not apply to `target`, or None when it does."""
        return None

    def prepare(self, model, inputs, target):
        """Apply the remedy to `model` and `inputs` (already copies): a Prepared."""
        raise NotImplementedError


def _floating_dtype(model, inputs):
    """The first floating parameter's dtype, else the first floating input's, else None."""
    if isinstance(model, torch.nn.Module):
        for p in model.parameters():
            if p.is_floating_point():
                return p.dtype
    return next((t.dtype for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()), None)


def _already_compiled(model):
    return isinstance(model, torch._dynamo.eval_frame.OptimizedModule) if hasattr(torch, "_dynamo") else False


class BrrrCompile(Remedy):
    def __init__(self, cuda_graphs="auto"):
        self.cuda_graphs = cuda_graphs
        self.kind = "cuda-graphs" if cuda_graphs is True else "compile"
        self.label = "brrr.compile(cuda_graphs=True)" if cuda_graphs is True else "brrr.compile"

    def not_applicable(self, target):
        if self.cuda_graphs is True and target.device.type != "cuda":
            return "CUDA graphs need a CUDA device"
        if _already_compiled(target.model):
            return "the model is compiled already"
        return None

    def prepare(self, model, inputs, target):
        from brrr.compile.backend import compile as brrr_compile

        return Prepared(brrr_compile(model, cuda_graphs=self.cuda_graphs), inputs,
                        warmup_calls=WARMUP_CALLS + self.deciding_calls(target))

    def deciding_calls(self, target):
        """Calls a compiled graph spends deciding how to run (none timed as the step): on a GPU, each graph is
        timed against itself as Dynamo captured it (captured_choice.py), and that trial's compiled stretch holds
        the launch-or-replay trial of "auto" (replay_choice.py); one more call takes the last verdict."""
        from brrr.compile.runtime import captured_choice
        from brrr.compile.runtime.replay_choice import TRIAL_CALLS

        if captured_choice.enabled({target.device.type}):
            return captured_choice.TRIAL_LENGTH + 1
        return TRIAL_CALLS if self.cuda_graphs == "auto" and target.device.type == "cuda" else 0


class InductorCompile(Remedy):
    kind, label = "inductor", "torch.compile (Inductor)"

    def not_applicable(self, target):
        return "the model is compiled already" if _already_compiled(target.model) else None

    def prepare(self, model, inputs, target):
        return Prepared(torch.compile(model), inputs)


class Autocast(Remedy):
    kind, label = "bf16", "torch.autocast bf16"

    def not_applicable(self, target):
        if _floating_dtype(target.model, target.inputs) != torch.float32:
            return "the model is not fp32"
        if target.fp32_contractions == 0:
            return "no matmul-family op of the step runs in fp32 (autocast is on already?)"
        return None

    def prepare(self, model, inputs, target):
        return Prepared(model, inputs, settings=lambda: torch.autocast(target.device.type, dtype=torch.bfloat16))



class TF32(Remedy):
    kind, label = "tf32", "TF32 matmuls"

    def not_applicable(self, target):
        if target.device.type != "cuda":
            return "TF32 is a CUDA tensor-core mode"
        if _floating_dtype(target.model, target.inputs) != torch.float32:
            return "the model is not fp32"
        if torch.get_float32_matmul_precision() != "highest" or torch.backends.cuda.matmul.allow_tf32:
            return "TF32 is on already"
        if target.fp32_matmuls == 0:
            return "no cuBLAS matmul of the step runs in fp32 (autocast is on already?)"
        return None

    def prepare(self, model, inputs, target):
        return Prepared(model, inputs, settings=tf32_matmuls)


def _is_image(t):
    return isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point()


class ChannelsLast(Remedy):
    kind, label = "channels-last", "channels_last"

    def not_applicable(self, target):
        model = target.model
        convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)] if isinstance(
            model, torch.nn.Module) else []
        if not convs:
            return "no Conv2d in the model"
        laid_out = all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in convs) and all(
            t.is_contiguous(memory_format=torch.channels_last) for t in target.inputs if _is_image(t))
        return "the model and its images are channels_last already" if laid_out else None

    def prepare(self, model, inputs, target):
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(t.contiguous(memory_format=torch.channels_last) if _is_image(t) else t for t in inputs)
        return Prepared(model, inputs)


class DoubledBatch(Remedy):
    kind, label = "batch", "batch x2"

    def not_applicable(self, target):
        tensors = [t for t in target.inputs if isinstance(t, torch.Tensor)]
        if len(tensors) != len(target.inputs):
            return "an input is not a tensor: its batch dim is unknown"
        sizes = {t.shape[0] if t.dim() else None for t in tensors}
        if len(sizes) != 1 or None in sizes:
            return "the inputs share no leading batch dim"
        return None

    def prepare(self, model, inputs, target):
        doubled = tuple(torch.cat([t, t]).detach().requires_grad_(t.requires_grad) for t in inputs)
        return Prepared(model, doubled, batches=2)


# the remedies --verify applies, in report order; tests append doubles
REMEDIES = [BrrrCompile(), BrrrCompile(cuda_graphs=True), InductorCompile(), Autocast(), TF32(), ChannelsLast(),
            DoubledBatch()]


@contextmanager
def _dynamo_room():
    """Enough of Dynamo's recompile limit for the compiled copies: each copy compiles the model's code again,
    and verifying twice in one process would otherwise reach the limit and silently run eager."""
    try:
        import torch._dynamo.config as config

        from brrr.bench.backends import dynamo_limits
    except ImportError:
        yield
        return
    with config.patch(**dynamo_limits(64)):
        yield


def measure(prepared, train, device, runs=MEASURE_RUNS):
    """(step seconds per current batch, compile seconds or None) of a Prepared model's step."""
    step = Step(prepared.model, prepared.inputs, train)
    with _dynamo_room(), prepared.settings():
        compiling = []
        for _ in range(prepared.warmup_calls):
            before = dynamo_frames_compiled()
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            if dynamo_frames_compiled() != before:
                compiling.append(time.perf_counter() - start)
        trial_turns.settle(step, at_least=0)   # a model of several graphs decides them in turn
        samples = timed_runs(step, device, runs=runs)
    step_s = min(samples)
    compile_s = sum(max(t - step_s, 0.0) for t in compiling) if compiling else None
    return step_s / prepared.batches, compile_s


@dataclass
class Row:
    """One remedy's verdict. status: gain, loss, failed or not applicable ("measured" until judged)."""

    kind: str
    remedy: str
    status: str
    reason: str = ""
    predicted_s: float | None = None
    predicted_uncalibrated_s: float | None = None
    calibrated_from: int = 0
    measured_s: float | None = None
    compile_s: float | None = None
    saving_s: float | None = None
    predicted_saving_s: float | None = None
    prediction_error: float | None = None
    prediction_error_uncalibrated: float | None = None
    how: str = ""

    def to_dict(self):
        return dict(self.__dict__)


def _relative_error(predicted, measured):
    return (predicted - measured) / measured if predicted is not None and measured else None


def _measure_one(remedy, target):
    """The remedy's Row with its measurement (status "measured"), or why there is none."""
    reason = remedy.not_applicable(target)
    if reason:
        return Row(remedy.kind, remedy.label, "not applicable", reason)
    row = Row(remedy.kind, remedy.label, "measured")
    model = inputs = prepared = None
    try:
        model, inputs = copy.deepcopy(target.model), copy.deepcopy(target.inputs)
        prepared = remedy.prepare(model, inputs, target)
        row.measured_s, row.compile_s = measure(prepared, target.train, target.device)
    except Exception as e:  # a remedy that fails is a finding, not a crash of the analysis
        row.status, row.reason = "failed", f"{type(e).__name__}: {e}"[:REASON_CHARS]
    finally:
        model = inputs = prepared = None  # the copy's memory, freed before the next remedy's
        gc.collect()
        if target.device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def _judge(row, analysis, baseline_s, table):
    """Fill the row's prediction and, when measured, its saving, error and verdict (gain or loss)."""
    prediction = analysis.predictions.get(row.kind)
    if prediction is not None and row.status != "not applicable":
        # a prediction built on the analyzed wall time (the faster of two steps) follows the re-timed baseline
        # (the fastest of several), which the measurement is compared with
        row.predicted_uncalibrated_s = prediction.at_wall(analysis.wall_time_s, baseline_s)
        row.predicted_s, row.calibrated_from = calibration.calibrated_step(table, row.kind,
                                                                           row.predicted_uncalibrated_s)
        row.predicted_saving_s = baseline_s - row.predicted_s
        row.how = prediction.how
    if row.status == "measured":
        row.status = "gain" if row.measured_s < baseline_s else "loss"
        row.saving_s = baseline_s - row.measured_s
        row.prediction_error = _relative_error(row.predicted_s, row.measured_s)
        row.prediction_error_uncalibrated = _relative_error(row.predicted_uncalibrated_s, row.measured_s)
    return row


def _apply_verdicts(advice, rows):
    """The advice rebuilt from the measurements: every remedy that measured a gain, ranked by its measured
    saving (its prediction beside it, and advised even where the cost model predicted no gain); then what was
    predicted but not measured, by predicted saving, marked as predictions. A measured loss is never advised
    (for compile, nor the fusion advice that says brrr.compile does it)."""
    by_kind = {row.kind: row for row in rows if row.status in ("gain", "loss")}
    lost = {kind for kind, row in by_kind.items() if row.status == "loss"}
    if "compile" in lost:
        lost.add("fuse")  # fusion advice says brrr.compile does it
    kept = [item for item in advice if item["kind"] not in lost]
    measured = [_measured(item, by_kind[item["kind"]]) for item in kept if item["kind"] in by_kind]
    predicted = [item for item in kept if item["kind"] not in by_kind]
    for row in rows:
        if row.status == "gain" and all(a["kind"] != row.kind for a in measured):
            item = advice_item(row.kind, f"{row.remedy} (measured on a copy of the model)",
                               row.predicted_saving_s or 0.0)
            measured.append(_measured(item, row))
    measured.sort(key=lambda a: -a["measured_saving_s"])
    predicted.sort(key=lambda a: -a["predicted_saving_s"])
    advice[:] = measured + predicted
    return advice


def _measured(item, row):
    item.update(basis="measured", measured_s=row.measured_s, measured_saving_s=row.saving_s,
                prediction_error=row.prediction_error,
                predicted_saving_s=row.predicted_saving_s if row.predicted_saving_s is not None else
                item["predicted_saving_s"], unpredicted=row.predicted_saving_s is None)
    return item


def verify(analysis, model, inputs, train=False, device=None, remedies=None, progress=False, table=None,
           record=True):
    """Measure every remedy of `remedies` (default REMEDIES) on copies of `model(*inputs)`; fills
    `analysis.verify` ({"baseline_s", "analyzed_wall_s", "remedies": [Row dicts], "median_error"}) and
    updates `analysis.advice` (measurements added, losses dropped). table: the calibration table to use
    (default: the device's); record: add the measurements to the device's table."""
    if device is None:
        from brrr.analyze.step import resolve_device

        device = resolve_device(model, inputs)
    remedies = REMEDIES if remedies is None else remedies
    table = calibration.load_table(analysis.device) if table is None else table
    target = Target(model, tuple(inputs), train, torch.device(device),
                    fp32_contractions=len(fp32_contractions(analysis.ops)),
                    fp32_matmuls=len(fp32_contractions(analysis.ops, cublas_only=True)))
    rows = []
    with step_bar(progress, "verify", len(remedies) + 2) as next_remedy:
        next_remedy("the model as analyzed")
        baseline = Prepared(model, target.inputs, warmup_calls=1)
        before, _ = measure(baseline, train, target.device)
        for remedy in remedies:
            next_remedy(remedy.label)
            rows.append(_measure_one(remedy, target))
        next_remedy("the model as analyzed, again")
        # timed before and after the remedies, the faster: a step right after the analysis' profiler session
        # can run slow for a while (5-10% on the H100 hosts, benchmarks/NOTES.md), which would read as gains
        after, _ = measure(baseline, train, target.device)
    baseline_s = min(before, after)
    for row in rows:
        _judge(row, analysis, baseline_s, table)
    _apply_verdicts(analysis.advice, rows)
    errors = {}
    for row in rows:
        if row.prediction_error is not None:
            errors.setdefault(row.kind, []).append(abs(row.prediction_error))
    analysis.verify = {
        "baseline_s": baseline_s, "baseline_runs_s": [before, after], "analyzed_wall_s": analysis.wall_time_s,
        "remedies": [row.to_dict() for row in rows],
        "median_error": {kind: statistics.median(values) for kind, values in errors.items()},
    }
    if record:
        calibration.record_ratios(analysis.device, {
            row.kind: row.measured_s / row.predicted_uncalibrated_s for row in rows
            if row.measured_s and row.predicted_uncalibrated_s})
    return analysis.verify
