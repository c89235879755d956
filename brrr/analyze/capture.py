"""Stage 1 of the analyzer (capture -> time -> regimes -> advise -> report): record every ATen op of a step.

A TorchDispatchMode sees each op after autograd and decompositions, forward and backward alike. For each
one it records the module it ran in, input shapes and dtypes, FLOPs, bytes and class (priced by
brrr.cost.ops), and which earlier op produced each input: by storage address, where the latest non-view
writer wins. The fusion advice walks those producer -> consumer links.

Modules: in forward, a stack kept by global module hooks; in backward, the module of the forward op whose
autograd node is running (matched by the node's sequence number), else "<backward>".

With `mark_ranges=True` each op runs inside a profiler range `brrr#<index>`, so a profiler around the step
can attribute host time and the device kernels an op launched to that op's record (see timing.py).
"""

import functools
from dataclasses import dataclass, field

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from brrr.cost.ops import (OpCost, cost_key, has_flop_formula, mutated_tensors, op_cost, tensor_bytes,
                           tensors_in)

RANGE_PREFIX = "brrr#"
# record_function's C++ core: a profiler range without record_function's own op dispatches (~1 us, not ~7)
_op_range = torch._C._profiler._RecordFunctionFast
OUTSIDE_MODEL = {"forward": "<step>", "backward": "<backward>"}


@dataclass
class OpRecord:
    """One ATen op call of the step. `time_s` is filled by timing, `regime` and friends by regimes."""

    index: int
    name: str                       # e.g. "aten.addmm.default"
    module: str                     # e.g. "encoder.layer.0.attention.self.query"
    phase: str                      # "forward" | "backward"
    op_class: str
    flops: int
    bytes_read: int
    bytes_written: int
    dtype: torch.dtype | None       # first floating input (or output): selects the matmul peak
    input_shapes: list = field(default_factory=list)
    input_dtypes: list = field(default_factory=list)
    inputs_from: list = field(default_factory=list)   # [(producer index, bytes of that input)]
    consumers: list = field(default_factory=list)     # indices of later ops that read this op's outputs
    time_s: float = 0.0
    roofline_time_s: float = 0.0
    regime: str = "overhead"
    is_step_output: bool = False    # wrote a tensor the step hands back (model output, parameter gradient)

    @property
    def bytes(self):
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self):
        """FLOPs per byte, None for an op that moves nothing."""
        return self.flops / self.bytes if self.bytes else None

    @property
    def contraction(self):
        return self.op_class == "contraction"


def _storage_key(t):
    """Identity of the memory a tensor lives in; None for tensors with no real storage (or 0 elements)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:  # sparse, nested or wrapper subclasses
        return None
    return (t.device, ptr) if ptr else None


def _first_float_dtype(arg_tensors, outputs):
    for tensors in (arg_tensors, outputs):
        for t in tensors:
            if t.is_floating_point():
                return t.dtype
    return None


def _cost(func, args, kwargs, out):
    try:
        return op_cost(func, args, kwargs, out)
    except Exception:  # an op the cost model can't price must not stop the analysis
        return OpCost(0, 0, 0, "other")


@functools.cache
def _op_name(func):
    return str(func)


class ModuleStack:
    """Which module's forward is running now, from global forward hooks: a path like `encoder.layer.0.output`."""

    def __init__(self, model):
        self.names = {}
        if isinstance(model, torch.nn.Module):
            self.names = {id(m): name for name, m in model.named_modules()}
            self.names[id(model)] = type(model).__name__
        self.stack = []

    def current(self):
        return self.stack[-1] if self.stack else None

    def _enter(self, module, args):
        name = self.names.get(id(module))
        if name is None:  # a module outside the model, or created during forward
            parent = self.current()
            name = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
        self.stack.append(name)

    def _exit(self, module, args, output):
        if self.stack:
            self.stack.pop()

    def __enter__(self):
        self._handles = [register_module_forward_pre_hook(self._enter), register_module_forward_hook(self._exit)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self.stack.clear()


class BackwardModules:
    """Module paths for backward ops: the forward op that made an autograd node lends it its module.

    Forward ops' outputs get their grad_fn only after the dispatch returns, so outputs wait one op in
    `pending` before their node's sequence number is read. Backward ops look up the node running them
    (AccumulateGrad: the module owning the parameter).
    """

    def __init__(self, model):
        self.by_sequence_nr, self.pending = {}, []
        self.param_modules = {}
        if isinstance(model, torch.nn.Module):
            for name, param in model.named_parameters():
                self.param_modules[id(param)] = name.rpartition(".")[0] or type(model).__name__

    def resolve_pending(self):
        for outputs, module in self.pending:
            for t in outputs:
                node = t.grad_fn
                if node is not None:
                    self.by_sequence_nr.setdefault(node._sequence_nr(), module)
        self.pending.clear()

    def note_forward(self, outputs, module):
        # requires_grad is not set yet below autograd, so keep every floating output until the next op
        if torch.is_grad_enabled() and module is not None:
            self.pending.append(([t for t in outputs if t.is_floating_point()], module))

    def module_of_running_node(self):
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        variable = getattr(node, "variable", None)  # AccumulateGrad
        if variable is not None:
            return self.param_modules.get(id(variable))
        return self.by_sequence_nr.get(node._sequence_nr())


class OpTracer(TorchDispatchMode):
    """Records ops (costs, modules, producers) and/or marks each with a profiler range."""

    def __init__(self, model=None, record_costs=True, mark_ranges=False):
        super().__init__()
        self.record_costs, self.mark_ranges = record_costs, mark_ranges
        self.records, self.names = [], []
        self.modules, self.backward_modules = ModuleStack(model), BackwardModules(model)
        self._writer = {}  # storage key -> index of the op that last wrote it
        self._costs = {}   # cost_key -> OpCost of FLOP-formula ops: repeated layers repeat identical calls

    def __enter__(self):
        if self.record_costs:
            self.modules.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if self.record_costs:
                self.modules.__exit__(*exc)
                self.backward_modules.pending.clear()

    def writer_of(self, t):
        """Index of the op that last wrote `t`'s memory, or None."""
        return self._writer.get(_storage_key(t))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        index = len(self.names)
        name = _op_name(func)
        self.names.append(name)
        if self.mark_ranges:
            with _op_range(f"{RANGE_PREFIX}{index}"):
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        if self.record_costs:
            self._record(index, name, func, args, kwargs, out)
        return out

    def _module_and_phase(self, outputs):
        self.backward_modules.resolve_pending()
        if torch._C._current_graph_task_id() != -1:
            return self.backward_modules.module_of_running_node(), "backward"
        module = self.modules.current()
        self.backward_modules.note_forward(outputs, module)
        return module, "forward"

    def _cost(self, func, args, kwargs, out):
        if not has_flop_formula(func):  # the rest price as fast as their cost_key is built
            return _cost(func, args, kwargs, out)
        try:
            key = cost_key(func, args, kwargs, out)
            cost = self._costs.get(key)
        except Exception:  # unhashable arguments, tensors without strides: price this call afresh
            return _cost(func, args, kwargs, out)
        if cost is None:
            cost = self._costs[key] = _cost(func, args, kwargs, out)
        return cost

    def _record(self, index, name, func, args, kwargs, out):
        arg_tensors = list(tensors_in(args))
        inputs = arg_tensors + list(tensors_in(kwargs)) if kwargs else arg_tensors
        outputs = list(tensors_in(out))
        cost = self._cost(func, args, kwargs, out)
        module, phase = self._module_and_phase(outputs)
        record = OpRecord(
            index=index, name=name, phase=phase, module=module or OUTSIDE_MODEL[phase],
            op_class=cost.op_class, flops=cost.flops, bytes_read=cost.bytes_read, bytes_written=cost.bytes_written,
            dtype=_first_float_dtype(arg_tensors, outputs),
            input_shapes=[tuple(t.shape) for t in inputs], input_dtypes=[str(t.dtype) for t in inputs],
        )
        input_keys = [_storage_key(t) for t in inputs]
        self._link_producers(record, inputs, input_keys)
        self._note_writes(record, func, args, kwargs, outputs, input_keys)
        self.records.append(record)

    def _link_producers(self, record, inputs, input_keys):
        if record.op_class == "view":
            return  # a view reads nothing; whoever reads the view is linked to the real producer
        seen = set()
        for t, key in zip(inputs, input_keys):
            producer = self._writer.get(key)
            if producer is None or (producer, id(t)) in seen:
                continue
            seen.add((producer, id(t)))
            record.inputs_from.append((producer, tensor_bytes(t)))
            if record.index not in self.records[producer].consumers:
                self.records[producer].consumers.append(record.index)

    def _note_writes(self, record, func, args, kwargs, outputs, input_keys):
        if record.op_class == "view":
            # views are transparent: a reader of a view links to the real producer. A fresh allocation
            # (empty, empty_like) forgets whoever used that address before.
            for t in outputs:
                key = _storage_key(t)
                if key is not None and key not in input_keys:
                    self._writer.pop(key, None)
            return
        for t in outputs + mutated_tensors(func, args, kwargs):
            key = _storage_key(t)
            if key is not None:
                self._writer[key] = record.index


def capture(step, mark_ranges=True):
    """Run `step` once under the tracer; returns its OpRecords in execution order."""
    tracer = OpTracer(step.model, record_costs=True, mark_ranges=mark_ranges)
    with tracer:
        output = step()
    results = list(tensors_in(output)) + [leaf.grad for leaf in step.grad_leaves if leaf.grad is not None]
    for t in results:
        writer = tracer.writer_of(t)
        if writer is not None:
            tracer.records[writer].is_step_output = True
    return tracer.records


def trace_names(step, mark_ranges=True):
    """Run `step` once marking ranges only (no pricing); returns the op names, to match against capture."""
    tracer = OpTracer(record_costs=False, mark_ranges=mark_ranges)
    with tracer:
        step()
    return tracer.names
