"""Stage 1-2 of the analyzer for a step traced before (capture -> time): time it again without the tracer.

The tracer (capture.py) costs ~3-4 eager steps of Python on BERT-base: the dispatch mode, the per-op note,
the module hooks and a profiler range per op. A later analysis of the same step (same model, same
Step.signature, see step.KnownSteps) reuses the earlier trace (its ops, modules, costs and producer links)
and only times the step: one plain step in a profiler session with its ATen events on.

The profiler's ATen events are a superset of the ops the dispatch mode saw: composite ops (aten::linear)
around them and the ops a kernel calls below the mode (aten::empty inside aten::_to_copy) inside them. The
mode's ops never nest, so each traced op that can launch a kernel is matched, in order, to the next event of
its name that starts after the last matched one ended. Kernels then belong to the op whose event their
launch call started in, as with the tracer's ranges (timing.attribute_kernels).

The replay must find the traced program, or the step is traced afresh (and from then on):
- expected_ops refuses a trace whose shapes could change with the data (an op tagged dynamic_output_shape,
  such as nonzero or a boolean-mask index, or data_dependent_output, such as item()), a backward (the
  autograd engine's gradient accumulation `aten::add` reaches the dispatch mode but not the profiler) and an
  op with no ATen schema;
- the model's parameters and buffers have the shapes, dtypes and devices they had (model_state);
- every traced kernel op finds its event, in order; each op launches as many kernels as in the traced run,
  and compiled code launches the same kernels outside the ops (checked by the caller).
Input shapes are not read back from the events: recording them (record_shapes) made Kineto's stop ~4x slower
on the H100 host (`benchmarks/results/probes/2026-11-22-h100-04f38bf-replay-with-shapes.log`), which cost the
replay its gain. A change that keeps the op sequence, the kernel counts and the model's state but changes
inner shapes (a Python attribute that reshapes) would go unseen; Step.signature covers the inputs, the mode, autocast and the matmul settings.
"""

import torch

from brrr.analyze.capture import _RawOp

_DATA_DEPENDENT = tuple(getattr(torch.Tag, name) for name in ("dynamic_output_shape", "data_dependent_output")
                        if hasattr(torch.Tag, name))
_MASK_DTYPES = (torch.bool, torch.uint8)


def expected_ops(trace):
    """[(op index, profiler event name)] for the trace's ops that can launch a kernel (views and metadata ops
    take no device time: nothing to find); None when the trace isn't replayable (see the module docstring)."""
    expected = []
    for index, op in enumerate(trace.raw):
        if op.phase == "backward":
            return None
        if type(op) is not _RawOp:
            continue
        schema = getattr(op.func, "_schema", None)
        if schema is None or _depends_on_data(op):
            return None
        expected.append((index, schema.name))
    return expected


def _depends_on_data(op):
    tags = getattr(op.func, "tags", ())
    if not any(tag in tags for tag in _DATA_DEPENDENT):
        return False
    if op.func._schema.name == "aten::index":  # dynamic only with a mask index; integer indices gather
        return any(op.metas[g][2] in _MASK_DTYPES for g in op.inputs[1:])
    return True


def model_state(model):
    """Shape, dtype and device of each parameter and buffer: a model resized in place runs other shapes."""
    if not isinstance(model, torch.nn.Module):
        return None
    model = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
    return tuple((t.shape, t.dtype, t.device) for t in (*model.parameters(), *model.buffers()))


def match_ops(marks, expected, step=None):
    """Op spans [(start, end, op index)] for `expected` (expected_ops) among `marks`, the session's CPU events
    named like them as [(start, end, name)] sorted outer first (timing.session_events); only events
    inside `step` (start, end) count. None when an op has no matching event."""
    spans, j, count = [], 0, len(marks)
    reach, last = (step[0], step[1]) if step else (None, None)
    for index, name in expected:
        while j < count:
            start, end, mark_name = marks[j]
            j += 1
            if mark_name == name and (reach is None or start >= reach) and (last is None or start <= last):
                break
        else:
            return None
        spans.append((start, end, index))
        reach = end
    return spans


def span_seconds(spans, count):
    """Host seconds per op index from matched spans (on CPU an op's time is its event's length; the ops with
    no span, views and metadata ops, get 0)."""
    times = [0.0] * count
    for start, end, index in spans:
        times[index] = (end - start) / 1e9
    return times
