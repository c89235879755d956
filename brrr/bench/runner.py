"""bench(): eager vs torch.compile backends side by side, in one process, on the same inputs.

For each backend, in order: compile cold (Dynamo reset, time the first call), compile warm (reset again,
time the first call with on-disk caches warm), check the result (outputs, and gradients for train=True)
against eager — and for bf16/fp16 against a float64 run of the same model — then time it (median and
p20/p80 of single calls, plus back-to-back calls), then the peak memory of one call (CUDA only: CPU
allocations are not tracked by torch, so that column is None there).

A backend that raises is a row marked "FAILED: reason"; one outside tolerance is "WRONG: error ..." (still
timed). Neither stops the others. Eager always runs first: it is the reference and the speedup's base.
"""


import torch

from brrr.bench import compare
from brrr.bench.backends import backend_name, fresh_compile, strict_dynamo
from brrr.bench.result import BenchResult, BenchRow, dtype_name
from brrr.bench.step import Step, make_cotangents, to_dtype
from brrr.bench.timing import time_graph, time_kernel, time_steady
from brrr.compile.runtime.replay_choice import TRIAL_CALLS
from brrr.compile.runtime.trial_turns import settle
from brrr.cost.device import synchronize, time_once

DEFAULT_BACKENDS = ("eager", "inductor", "brrr")


def _infer_device(model, inputs):
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    if isinstance(model, torch.nn.Module):
        for p in model.parameters():
            return p.device
    return torch.device("cpu")


def _judged_dtype(tensors):
    """The precision the comparison is judged in: a half type if any output or gradient has one (a training
    step's fp32 loss over bf16 gradients is a bf16 computation), else the first floating dtype."""
    dtypes = [t.dtype for t in tensors if t.is_floating_point()]
    return next((d for d in dtypes if d in compare.HALF_TYPES), dtypes[0] if dtypes else None)


def _peak_memory(step, device, held=0):
    """The most memory allocated during one call of `step`, less `held`: bytes the harness itself keeps on the
    device (eager's reference outputs and gradients, a precise run's), which no backend's user would hold."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device)) - held


def device_bytes(tensors, device):
    """Bytes of the distinct storages behind `tensors` that live on `device`."""
    storages = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device == device:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _reason(exc, limit=160):
    """'FAILED: Outer <- Root: first line of the root cause's message', cut to `limit` characters."""
    root = exc
    while True:  # Dynamo wraps a backend's exception (BackendCompilerFailed.inner_exception / __cause__)
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if inner is None or inner is root:
            break
        root = inner
    lines = str(root).strip().splitlines()
    text = f"{type(root).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    if root is not exc:
        text = f"{type(exc).__name__} <- {text}"
    return "FAILED: " + (text if len(text) <= limit else text[: limit - 1] + "…")


def versions():
    v = {"torch": torch.__version__}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:
        v["triton"] = None
    return v


class _Reference:
    """Eager's outputs and gradients (and, for half types, a higher-precision run's): what every backend must
    match."""

    def __init__(self, outputs, grads, precise=None, eager_vs_precise=None, precise_name=None):
        self.outputs, self.grads = outputs, grads
        self.precise, self.eager_vs_precise, self.precise_name = precise, eager_vs_precise, precise_name
        self.dtype = _judged_dtype(outputs + [g for g in grads if g is not None])

    def held_bytes(self, device):
        """What the reference keeps on `device`: counted in every backend's peak, so taken out of it."""
        return device_bytes(self.outputs + self.grads + list(self.precise or ()), device)

    def judge(self, outputs, grads):
        """(error vs eager, error vs the precise run or None, None or 'WRONG: ...')."""
        vs_eager = compare.error(outputs + grads, self.outputs + self.grads)
        vs_precise = compare.error(outputs + grads, self.precise) if self.precise is not None else None
        return vs_eager, vs_precise, compare.verdict(self.dtype, vs_eager, vs_precise, self.eager_vs_precise,
                                                     self.precise_name)


def _precise_run(model, inputs, train, cotangents, dtype, reference):
    """Outputs and gradients of the same model in `dtype`: a cast copy, or `reference(dtype)`'s model and
    inputs for models a cast cannot copy (state outside parameters and buffers, such as a KV cache)."""
    if reference is not None:
        copied, copied_inputs = reference(dtype)
        cotangents = [c.to(dtype) for c in cotangents] if cotangents is not None else None
    else:
        copied, copied_inputs, cotangents = to_dtype(model, inputs, cotangents, dtype)
    outputs, grads = Step(copied, copied, [copied_inputs], train, cotangents).run_on_first_inputs()
    del copied
    return outputs + grads


def bench(model, *inputs, backends=DEFAULT_BACKENDS, train=False, progress=False, device=None, warmup=25,
          rep=100, input_sets=None, label=None, compile_warm=True, reference_dtype=torch.float64, reference=None,
          graph_timing=False):
    """Time and check `model(*inputs)` under each backend. Returns a BenchResult.

    backends: torch.compile backend names or callables; "eager" means no compile (always run, first).
    warmup, rep: milliseconds of warm-up and of timed calls (triton.testing.do_bench's meaning).
    input_sets: optional further input tuples; timing rotates through `inputs` and these (so that the
        working set exceeds the caches); correctness is checked on `inputs`.
    compile_warm: also measure the warm compile (a second compile after a Dynamo reset).
    reference_dtype: for bf16/fp16 results, judge against a copy of the model in this dtype (None: against
        eager only). `reference(dtype) -> (model, inputs)` builds that copy where casting cannot.
    graph_timing: on CUDA, also time calls replayed from a CUDA graph (device time without host overhead).
    """
    device = torch.device(device) if device is not None else _infer_device(model, inputs)
    names = [backend_name(b) for b in backends]
    backends = list(backends)
    if "eager" not in names:
        backends.insert(0, "eager")
        names.insert(0, "eager")
    else:  # eager first: it is the reference
        i = names.index("eager")
        backends.insert(0, backends.pop(i))
        names.insert(0, names.pop(i))
    input_sets = [tuple(inputs)] + [tuple(s) for s in (input_sets or [])]
    label = label or (type(model).__name__ if isinstance(model, torch.nn.Module) else backend_name(model))
    result = BenchResult(rows=[], label=label, device=_device_name(device), dtype="?", train=train,
                         versions=versions())
    result.notes.append("peak memory: torch.cuda.max_memory_allocated during one call, less the reference "
                        "outputs and gradients the harness holds" if device.type == "cuda" else
                        "peak memory: not measured on CPU")

    from rich.progress import Progress

    eager_ref = None
    with strict_dynamo(), Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("bench", total=len(backends))
        for backend, name in zip(backends, names):
            bar.update(task, description=f"{label}: {name}")
            row = BenchRow(backend=name)
            try:
                if eager_ref is None:
                    eager_ref = _eager_reference(model, input_sets[0], train, reference_dtype, reference)
                    result.dtype = dtype_name(eager_ref.dtype)
                    result.reference = eager_ref.precise_name
                    row.error_vs_reference = eager_ref.eager_vs_precise
                _run_backend(row, model, input_sets, train, device, backend, eager_ref, warmup, rep,
                             compile_warm, graph_timing)
            except Exception as exc:
                row.status, row.reason = "failed", _reason(exc)
                if eager_ref is None:  # eager itself failed: nothing to compare against
                    result.rows.append(row)
                    break
            result.rows.append(row)
            bar.advance(task)
    torch._dynamo.reset()
    eager = result.rows[0]
    for row in result.rows:
        if row.median_s and eager.median_s and row.status != "failed":
            row.speedup = eager.median_s / row.median_s
    return result


def _eager_reference(model, inputs, train, reference_dtype, reference):
    cotangents = None
    if train:
        cotangents = make_cotangents(model(*inputs))
    outputs, grads = Step(model, model, [inputs], train, cotangents).run_on_first_inputs()
    eager_ref = _Reference(outputs, grads)
    eager_ref.cotangents = cotangents
    if reference_dtype is not None and eager_ref.dtype in compare.HALF_TYPES:
        eager_ref.precise = _precise_run(model, inputs, train, cotangents, reference_dtype, reference)
        eager_ref.eager_vs_precise = compare.error(outputs + grads, eager_ref.precise)
        eager_ref.precise_name = dtype_name(reference_dtype)
    return eager_ref


def _run_backend(row, model, input_sets, train, device, backend, reference, warmup, rep, compile_warm,
                 graph_timing=False):
    make = lambda: Step(fresh_compile(model, backend), model, input_sets, train, reference.cotangents)  # noqa: E731
    if row.backend == "eager":
        step = make()
        row.error_vs_eager = compare.Error.exact()
    else:
        step = make()
        row.cold_compile_s = time_once(step, device)
        if compile_warm:
            step = make()
            row.warm_compile_s = time_once(step, device)
        outputs, grads = step.run_on_first_inputs()
        row.error_vs_eager, row.error_vs_reference, wrong = reference.judge(outputs, grads)
        del outputs, grads   # kept, they would count in the peak below
        if wrong:
            row.status, row.reason = "wrong", wrong
        settle(step, TRIAL_CALLS)   # brrr's graphs choose how to run (launched or replayed, compiled or captured)
    timing = time_kernel(step, device, warmup=warmup, rep=rep)
    row.median_s, row.p20_s, row.p80_s, row.timing_method = timing.median_s, timing.p20_s, timing.p80_s, timing.method
    row.steady_s = time_steady(step, device).median_s
    if graph_timing and not train:
        graphed = time_graph(step, device, calls=max(10, len(input_sets)), warmup=warmup, rep=rep)
        row.graph_s = graphed.median_s if graphed is not None else None
    row.peak_memory_bytes = _peak_memory(step, device, reference.held_bytes(device))


def _device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"
