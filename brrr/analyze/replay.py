"""Stage 1-2 of the analyzer for a step traced before (capture -> time): time it again without the tracer.

The tracer (capture.py) costs ~2-3 eager steps of Python per step on BERT-base: the dispatch mode, the per-op
note, the module hooks and a profiler range per op. A later analysis of the same step (same model, same
Step.signature, see step.KnownSteps) reuses the earlier trace (its ops, modules, costs and producer links)
and only times the step: one plain step in a profiler session with ATen events on and their input shapes
recorded, which costs ~1.3 eager steps on the same host.

The profiler's ATen events are a superset of the ops the dispatch mode saw: composite ops (aten::linear)
around them and the ops a kernel calls below the mode (aten::empty inside aten::_to_copy) inside them. The
mode's ops never nest, so each traced op that can launch a kernel is matched, in order, to the next event of
its name that starts after the last matched one ended; the event's input shapes (tensors of one or more
dimensions, in schema order) must equal the traced ones. Kernels then belong to the op whose event their
launch call started in, as with the tracer's ranges (timing.attribute_kernels). Any op that finds no event,
or a different shape, means the step no longer runs the traced program (data-dependent shapes, a changed
model): the caller traces it afresh.
"""

from brrr.analyze.capture import _TENSOR, _RawOp


def expected_ops(trace):
    """[(op index, profiler event name, input shapes)] for the trace's ops that can launch a kernel (views and
    metadata ops take no device time: nothing to find); None when the trace can't be matched: an op with no
    ATen schema (a higher-order op), or a backward op (the autograd engine's gradient accumulation `aten::add`
    reaches the dispatch mode but not the profiler)."""
    expected = []
    for index, op in enumerate(trace.raw):
        if op.phase == "backward":
            return None
        if type(op) is not _RawOp:
            continue
        schema = getattr(op.func, "_schema", None)
        if schema is None:
            return None
        expected.append((index, schema.name, _input_shapes(op)))
    return expected


def _input_shapes(op):
    """The shapes the profiler records for the op's tensor arguments: top-level tensors (not lists of them)
    of one or more dimensions, args then kwargs (schema order)."""
    shapes = []
    for value in op.args + tuple(value for _, value in op.kwargs):
        if type(value) is tuple and value and value[0] is _TENSOR:
            shape = op.metas[value[1]][0]
            if len(shape):
                shapes.append(tuple(shape))
    return tuple(shapes)


def _event_shapes(event):
    return tuple(tuple(shape) for shape in event.shapes() if shape)


def match_ops(marks, expected, step=None):
    """Op spans [(start, end, op index)] for `expected` (expected_ops) among `marks`, the session's CPU events
    named like them as [(start, end, name, event)] sorted outer first (timing.session_events); only events inside
    `step` (start, end) count. None when an op has no matching event."""
    spans, j, count, reach = [], 0, len(marks), step[0] if step else None
    last = step[1] if step else None
    for index, name, shapes in expected:
        while j < count:
            start, end, mark_name, event = marks[j]
            j += 1
            if mark_name == name and (reach is None or start >= reach) and (last is None or start <= last):
                break
        else:
            return None
        if _event_shapes(event) != shapes:
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
