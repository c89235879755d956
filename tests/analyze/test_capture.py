"""The lean capture (raw metadata during the step, priced and linked after it) gives the same records as
pricing and linking every op on its real arguments while it runs."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from brrr.analyze.capture import (BackwardModules, ModuleStack, OUTSIDE_MODEL, Trace, _RawOp, _TENSOR, capture,
                                  record_step)
from brrr.analyze.step import Step
from brrr.cost.ops import mutated_tensors, op_cost, tensor_bytes, tensors_in


def storage_key(t):
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:
        return None
    return (t.device, ptr) if ptr else None


class ReferenceTracer(TorchDispatchMode):
    """The straightforward recorder: op_cost on the real arguments and producer links kept as each op runs."""

    def __init__(self, model):
        super().__init__()
        self.ops, self.writer = [], {}
        self.modules, self.backward = ModuleStack(model), BackwardModules(model)

    def __enter__(self):
        self.modules.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.modules.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        cost = op_cost(func, args, kwargs, out)
        arg_tensors, outputs = list(tensors_in(args)), list(tensors_in(out))
        inputs = arg_tensors + list(tensors_in(kwargs))
        module, phase = self.module_and_phase(out)
        first_float = next((t.dtype for t in arg_tensors + outputs if t.is_floating_point()), None)
        op = dict(name=str(func), module=module or OUTSIDE_MODEL[phase], phase=phase, op_class=cost.op_class,
                  flops=cost.flops, bytes_read=cost.bytes_read, bytes_written=cost.bytes_written, dtype=first_float,
                  input_shapes=[tuple(t.shape) for t in inputs], input_dtypes=[str(t.dtype) for t in inputs],
                  inputs_from=[], consumers=[], is_step_output=False)
        self.link(len(self.ops), op, inputs, outputs + mutated_tensors(func, args, kwargs))
        self.ops.append(op)
        return out

    def module_and_phase(self, out):
        self.backward.resolve_pending()
        if torch._C._current_graph_task_id() != -1:
            return self.backward.module_of_running_node(), "backward"
        module = self.modules.current()
        self.backward.note_forward(out, module)
        return module, "forward"

    def link(self, index, op, inputs, written):
        input_keys = [storage_key(t) for t in inputs]
        if op["op_class"] == "view":
            for t in written:
                if storage_key(t) not in input_keys:
                    self.writer.pop(storage_key(t), None)
            return
        seen = set()
        for t in inputs:
            producer = self.writer.get(storage_key(t))
            if producer is not None and (producer, id(t)) not in seen:
                seen.add((producer, id(t)))
                op["inputs_from"].append((producer, tensor_bytes(t)))
                if index not in self.ops[producer]["consumers"]:
                    self.ops[producer]["consumers"].append(index)
        for t in written:
            if storage_key(t) is not None:
                self.writer[storage_key(t)] = index


def reference_ops(step):
    tracer = ReferenceTracer(step.model)
    with tracer:
        output = step()
    for t in list(tensors_in(output)) + [leaf.grad for leaf in step.grad_leaves if leaf.grad is not None]:
        writer = tracer.writer.get(storage_key(t))
        if writer is not None:
            tracer.ops[writer]["is_step_output"] = True
    return tracer.ops


def as_dict(record):
    return {key: getattr(record, key) for key in ("name", "module", "phase", "op_class", "flops", "bytes_read",
                                                  "bytes_written", "dtype", "input_shapes", "input_dtypes",
                                                  "inputs_from", "consumers", "is_step_output")}


def odd_ops(x):
    """The linking rules' corner cases: out=, one tensor read twice, views, in-place, a list of tensors, an op
    that returns none of what it writes (_foreach_add_), and a fresh allocation at a freed address."""
    buf = torch.empty_like(x)
    torch.mul(x, 2, out=buf)
    flat = buf.view(-1)
    square = flat * flat
    parts = [square.clone(), square + 1]
    torch._foreach_add_(parts, 1.0)
    tmp = x + 3
    del tmp
    fresh = torch.empty_like(x)  # most likely tmp's old address: must not link to x + 3
    return torch.cat(parts).sum() + fresh.sum() + x.t().contiguous().sum()


@pytest.mark.parametrize("target, train", [("mlp_target", False), ("mlp_target", True), ("bert_target", False),
                                           ("bert_target", True), ("odd_target", False)])
def test_lean_capture_matches_pricing_every_op_on_its_arguments(target, train, request):
    model, inputs = (odd_ops, (torch.randn(16, 8),)) if target == "odd_target" else request.getfixturevalue(target)
    step = Step(model, inputs, train=train)
    expected = reference_ops(step)
    records = capture(step)
    assert [r.index for r in records] == list(range(len(expected)))
    for record, op in zip(records, expected):
        assert as_dict(record) == op, record.name
    assert any(r.inputs_from for r in records) and any(r.is_step_output for r in records)
    if train:
        assert any(r.phase == "backward" and r.module != OUTSIDE_MODEL["backward"] for r in records)


def test_repeated_layers_are_priced_once(bert_target):
    model, inputs = bert_target
    trace = record_step(Step(model, inputs, train=True))
    signatures = {op.signature() for op in trace.raw}
    assert len(signatures) < len(trace.raw) / 2  # two identical layers, and forward/backward pairs repeat


def test_the_trace_holds_no_tensors(mlp_target):
    """Holding the step's tensors would keep them alive and change the allocator's addresses."""
    model, inputs = mlp_target
    trace = record_step(Step(model, inputs, train=True))
    assert not any(isinstance(v, torch.Tensor) for op in trace.raw for v in tensors_in(list(op)))


def test_a_fresh_allocation_forgets_the_previous_writer():
    """Hand-built trace (the allocator's address reuse is not deterministic): x + 1 writes address A, an
    `empty` lands on A, and the sum reading it must not link to the add."""
    aten, meta = torch.ops.aten, ((torch.Size([4]), (1,), torch.float32),)
    cpu, x, a = torch.device("cpu"), (_TENSOR, 0), (_TENSOR, 1)
    raw = [
        _RawOp(aten.add.Tensor, (x, 1), (), a, meta * 2, [(cpu, 1), (cpu, 2)], [0], 1, [1], None, "forward"),
        _RawOp(aten.empty.memory_format, ((4,),), (), x, meta, [(cpu, 2)], [], 0, [0], None, "forward"),
        _RawOp(aten.sum.default, (x,), (), a, (meta[0], (torch.Size([]), (), torch.float32)),
               [(cpu, 2), (cpu, 3)], [0], 1, [1], None, "forward"),
    ]
    add, empty, total = Trace(raw, [(cpu, 3)]).records()
    assert (add.consumers, empty.op_class, total.inputs_from, total.is_step_output) == ([], "view", [], True)
