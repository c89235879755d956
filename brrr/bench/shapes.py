"""bench_shapes(): backends side by side on a model whose input shapes change between calls.

    result = bench_shapes(model, [("len 128", (ids128,)), ("len 256", (ids256,))], backends=("eager", "brrr"))

What a server or a training loop with variable-length batches sees: each backend compiles once (after a Dynamo
reset), then meets the shapes in the given order, so Dynamo recompiles as it would in use (static first, then
with symbolic sizes once a size changes). Per backend and shape: the first call's time (a compile or
recompile when one happens), how many graphs the backend compiled so far, the error against eager at that
shape (and against a higher-precision run for half types, as bench() judges), the median time, and the peak
memory. A backend's total is the sum of its medians; its speedup is eager's total over it.
"""

from dataclasses import dataclass, field

import torch

from brrr.bench import compare
from brrr.bench.backends import backend_name, resolve_backend, strict_dynamo
from brrr.bench.result import Measured, dtype_name, with_errors_as_dicts
from brrr.bench.runner import _eager_reference, _infer_device, _peak_memory, _reason, versions
from brrr.bench.step import Step
from brrr.bench.timing import time_kernel, time_steady
from brrr.compile.runtime.replay_choice import TRIAL_CALLS
from brrr.compile.runtime.trial_turns import settle
from brrr.cost.device import time_once


@dataclass
class ShapePoint:
    shape: str
    status: str = "ok"                   # ok | wrong | failed
    reason: str | None = None
    first_call_s: float | None = None    # compile or recompile included, when one happened
    graphs_compiled: int = 0             # by this backend so far (after this shape's first call)
    median_s: float | None = None
    steady_s: float | None = None
    peak_memory_bytes: int | None = None
    error_vs_eager: compare.Error | None = None
    error_vs_reference: compare.Error | None = None

    def to_dict(self):
        return with_errors_as_dicts(self)


@dataclass
class ShapesRow:
    backend: str
    points: list = field(default_factory=list)
    status: str = "ok"                   # the worst of its points
    reason: str | None = None
    speedup: float | None = None         # eager total / this total

    @property
    def total_s(self):
        times = [p.median_s for p in self.points]
        return sum(times) if times and all(t is not None for t in times) else None

    @property
    def graphs_compiled(self):
        return self.points[-1].graphs_compiled if self.points else 0

    @property
    def peak_memory_bytes(self):
        peaks = [p.peak_memory_bytes for p in self.points if p.peak_memory_bytes is not None]
        return max(peaks) if peaks else None

    def to_dict(self):
        return {"backend": self.backend, "status": self.status, "reason": self.reason, "speedup": self.speedup,
                "total_s": self.total_s, "graphs_compiled": self.graphs_compiled,
                "peak_memory_bytes": self.peak_memory_bytes, "points": [p.to_dict() for p in self.points]}


@dataclass
class ShapesResult(Measured):
    reference: str | None = None

    def to_dict(self):
        return {**self.head_dict(), "reference": self.reference, "rows": [r.to_dict() for r in self.rows]}


class _Counted:
    """A Dynamo backend that counts the graphs it is asked to compile."""

    def __init__(self, backend):
        self.backend, self.graphs = backend, 0
        self.__name__ = backend_name(backend)

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        backend = self.backend
        if isinstance(backend, str):
            from torch._dynamo.backends.registry import lookup_backend

            backend = lookup_backend(backend)
        return backend(gm, example_inputs)


def bench_shapes(model, shape_inputs, backends=("eager", "inductor", "brrr"), train=False, device=None,
                 warmup=25, rep=100, reference_dtype=torch.float64, label=None):
    """Time and check `model` on each `(shape label, inputs)` of `shape_inputs`, in order, per backend."""
    shape_inputs = [(str(name), tuple(inputs)) for name, inputs in shape_inputs]
    device = torch.device(device) if device is not None else _infer_device(model, shape_inputs[0][1])
    names = [backend_name(b) for b in backends]
    backends = ["eager"] + [b for b, n in zip(backends, names) if n != "eager"]
    label = label or (type(model).__name__ if isinstance(model, torch.nn.Module) else backend_name(model))
    result = ShapesResult(rows=[], label=label, device=str(device), dtype="?", train=train, versions=versions())
    references = []
    with strict_dynamo():
        for backend in backends:
            row = ShapesRow(backend=backend_name(backend))
            result.rows.append(row)
            fn = model
            counted = None
            if row.backend != "eager":
                resolved = resolve_backend(backend)
                counted = _Counted(resolved)
                torch._dynamo.reset()
                fn = torch.compile(model, backend=counted)
            for i, (shape, inputs) in enumerate(shape_inputs):
                point = ShapePoint(shape)
                row.points.append(point)
                try:
                    if row.backend == "eager":
                        ref = _eager_reference(model, inputs, train, reference_dtype, None)
                        references.append(ref)
                        result.dtype, result.reference = dtype_name(ref.dtype), ref.precise_name
                        point.error_vs_eager, point.error_vs_reference = compare.Error.exact(), ref.eager_vs_precise
                    ref = references[i]
                    step = Step(fn, model, [inputs], train, ref.cotangents)
                    point.first_call_s = time_once(step, device)
                    point.graphs_compiled = counted.graphs if counted is not None else 0
                    if row.backend != "eager":
                        outputs, grads = step.run_on_first_inputs()
                        point.error_vs_eager, point.error_vs_reference, wrong = ref.judge(outputs, grads)
                        del outputs, grads
                        if wrong:
                            point.status, point.reason = "wrong", wrong
                        settle(step, TRIAL_CALLS)   # brrr's launch-or-replay choice, per shape's graphs, in turn
                    point.median_s = time_kernel(step, device, warmup=warmup, rep=rep).median_s
                    point.steady_s = time_steady(step, device).median_s
                    point.peak_memory_bytes = _peak_memory(step, device,
                                                           sum(r.held_bytes(device) for r in references))
                except Exception as exc:
                    point.status, point.reason = "failed", _reason(exc)
                    if row.backend == "eager":
                        raise
            bad = [p for p in row.points if p.status != "ok"]
            if bad:
                row.status = "failed" if any(p.status == "failed" for p in bad) else "wrong"
                row.reason = f"{bad[0].shape}: {bad[0].reason}"
    torch._dynamo.reset()
    eager_total = result.rows[0].total_s
    for row in result.rows:
        if row.total_s and eager_total and row.status != "failed":
            row.speedup = eager_total / row.total_s
    return result
