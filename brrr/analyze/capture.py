"""Stage 1 of the analyzer (capture -> time -> regimes -> advise -> report): record every ATen op of a step.

A TorchDispatchMode sees each op after autograd and decompositions, forward and backward alike. The work is
split so the step itself slows down as little as possible:

- during the step, per op, only raw metadata is noted (`OpTracer`): the op, its arguments with each tensor
  replaced by a group number (one per distinct tensor of the call), per group its shape, stride, dtype and
  storage key (device, storage address), the module it ran in and the phase;
- after the step (`Trace.records`), each op is priced by brrr.cost.ops on meta tensors rebuilt from that
  metadata, memoized per signature for the whole process (a 12-layer model repeats the same calls: BERT-base
  inference needs 29 prices for its 482 ops), and the storage keys are replayed to link every input to the
  op that produced it: the latest non-view writer of a storage wins, views are transparent, and a fresh
  allocation forgets the previous writer. The fusion advice walks those producer -> consumer links.

Modules: in forward, a stack kept by global module hooks; in backward, the module of the forward op whose
autograd node is running (matched by the node's sequence number), else "<backward>".

With `mark_ranges=True` each op runs inside a profiler range `brrr#<index>`, so a profiler around the step
can attribute host time and the device kernels an op launched to that op's record (see timing.py). When only
device time is wanted (CUDA), ops that can't launch a kernel (views, metadata) go without a range: two thirds
of BERT's ops, each range costing a few microseconds in the step and one more event to read. With
`mark_kernels=True` (CPU) each brrr kernel the Triton interpreter runs gets a range `brrr-kernel:<name>` too
(`kernel_range`, through brrr.compile.runtime.kernel_registry.LAUNCH_HOOK), with the tracer off inside it.
"""

import functools
import gc
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch._ops import OpOverload
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from brrr.compile.runtime import host_copies, kernel_registry
from brrr.cost.ops import OpCost, launches_no_kernel, nbytes_touched, op_class, op_cost, tensors_in, written_arguments

RANGE_PREFIX = "brrr#"
KERNEL_RANGE_PREFIX = "brrr-kernel:"  # around an interpreted brrr kernel's launch (CPU): `brrr-kernel:<its name>`
STEP_RANGE = "brrr-step"  # around the whole traced step: kernels launched in it but outside every op range
                          # come from compiled code (timing.cuda_op_times)
# record_function's C++ core: a profiler range without record_function's own op dispatches (~1 us, not ~7)
_op_range = torch._C._profiler._RecordFunctionFast
_record_functions = torch.autograd._enable_record_function
_graph_task_id = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
OUTSIDE_MODEL = {"forward": "<step>", "backward": "<backward>"}
_TENSOR = object()  # a recorded argument (_TENSOR, group) stands for the op's tensor number `group`


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
    kernel: bool = False            # a kernel launched by compiled code, not by an ATen op: its time is
                                    # measured, its FLOPs and bytes come from its compiler (kernels.py) or are
                                    # unknown (0)
    fused_ops: tuple = ()           # a kernel's ATen ops, as its compiler tells ("aten.gelu.default", ...)
    modules: tuple = ()             # a brrr kernel's modules, the one doing most of its FLOPs first (= module)
    blocker: str | None = None      # why a CUDA graph holding this call cannot be captured (host_copies), or None

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

    @property
    def unpriced(self):
        """A compiled kernel whose FLOPs and bytes nobody told: placed by its duration alone."""
        return self.kernel and not (self.flops or self.bytes_read or self.bytes_written)


def _storage_key(t):
    """Identity of the memory a tensor lives in: (device index, storage start address); None for tensors
    with no real storage (or 0 elements). From data_ptr and offset: cheaper than building the storage object."""
    try:
        ptr = t.data_ptr() - t.storage_offset() * t.itemsize
    except Exception:  # sparse, nested or wrapper subclasses
        return None
    return (t.get_device(), ptr) if ptr else None


class _Call:
    """Collects one op call's tensors while its arguments are frozen (see `freeze`).

    The tracer's hot path (~1 call per op and argument): tensors, ints and int lists are handled inline, and
    each distinct tensor's metadata is read once (`_add`)."""

    __slots__ = ("groups", "metas", "keys", "found")

    def __init__(self):
        self.groups = {}  # id(tensor) -> group: one tensor passed twice is one group
        self.metas = []   # per group: (shape, stride, dtype)
        self.keys = []    # per group: storage key
        self.found = []   # groups in order of appearance, repeats included

    def freeze(self, value):
        """`value` with tensors replaced by (_TENSOR, group) and lists by tuples: hashable, holds no tensor."""
        if isinstance(value, torch.Tensor):
            group = self.groups.get(id(value))
            if group is None:
                group = self._add(value)
            self.found.append(group)
            return _MARKS[group] if group < _MARKED else (_TENSOR, group)
        if isinstance(value, (list, tuple)):
            return self.sequence(value)
        return value

    def sequence(self, values):
        frozen = []
        groups, found = self.groups, self.found
        for v in values:
            if isinstance(v, torch.Tensor):
                group = groups.get(id(v))
                if group is None:
                    group = self._add(v)
                found.append(group)
                v = _MARKS[group] if group < _MARKED else (_TENSOR, group)
            elif isinstance(v, (list, tuple)):
                # a list that starts with an int is an int[] argument (sizes, dims): no tensor inside
                v = tuple(v) if v and type(v[0]) is int else self.sequence(v)
            frozen.append(v)
        return tuple(frozen)

    def _add(self, t):
        group = self.groups[id(t)] = len(self.keys)
        self.metas.append((t.shape, t.stride(), t.dtype))
        try:  # _storage_key, inline
            ptr = t.data_ptr() - t.storage_offset() * t.itemsize
            self.keys.append((t.get_device(), ptr) if ptr else None)
        except Exception:
            self.keys.append(None)
        return group


def launches_kernel(record):
    """Whether the op costs a launch: views and metadata ops (no FLOPs, no bytes) launch nothing."""
    return record.kernel or bool(record.flops or record.bytes_read or record.bytes_written)


_MARKED = 64
_MARKS = tuple((_TENSOR, group) for group in range(_MARKED))  # shared markers: no tuple per tensor


class _RawOp(NamedTuple):
    """What the tracer notes about one op during the step; priced and linked afterwards."""

    func: object
    args: tuple                 # frozen (see _Call.freeze)
    kwargs: tuple               # frozen ((name, value), ...)
    out: object                 # frozen
    metas: tuple                # per tensor group: (shape, stride, dtype)
    keys: list                  # per tensor group: storage key
    inputs: list                # tensor groups of args then kwargs, in order, repeats included
    arg_inputs: int             # how many of `inputs` come from args (not kwargs)
    outputs: list               # tensor groups of the output, in order
    module: str | None
    phase: str

    def signature(self):
        """What op_cost depends on: the op, its arguments and every tensor's shape, stride and dtype."""
        return self.func, self.args, self.kwargs, self.out, self.metas


class _ViewOp(NamedTuple):
    """What the tracer notes about an op that launches no kernel (a view, a metadata read): it moves nothing
    and writes nothing, so its inputs' shapes and dtypes are all its record needs (links pass through views)."""

    func: object
    shapes: tuple               # per input tensor, args then kwargs, repeats included
    dtypes: tuple
    module: str | None
    phase: str

    def signature(self):
        return self.func, self.shapes, self.dtypes


def _input_tensors(values, found):
    """Append the tensors among `values` (arguments, one list level deep) to `found`."""
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)) and v and type(v[0]) is not int:
            found.extend(t for t in v if isinstance(t, torch.Tensor))
    return found


def _plain(values):
    """True when no tensor can be among `values`: ints, floats, bools, None, or lists of ints."""
    for v in values:
        t = type(v)
        if t is list or t is tuple:
            if v and type(v[0]) is not int:
                return False
        elif t is not int and t is not float and t is not bool and v is not None:
            return False
    return True


def _groups_in(frozen):
    if type(frozen) is tuple:
        if frozen and frozen[0] is _TENSOR:
            yield frozen[1]
        else:
            for v in frozen:
                yield from _groups_in(v)


def _thaw(frozen, tensors, sequence=list):
    """A frozen value with real tensors back in; sequences as ATen passes them (arguments: lists, outputs:
    tuples)."""
    if type(frozen) is tuple:
        if frozen and frozen[0] is _TENSOR:
            return tensors[frozen[1]]
        return sequence([_thaw(v, tensors, sequence) for v in frozen])
    return frozen


def _price(op):
    """op_cost of a recorded call, on meta tensors of the recorded shapes, strides and dtypes."""
    try:
        tensors = [torch.empty_strided(shape, stride, dtype=dtype, device="meta") for shape, stride, dtype in op.metas]
        args = tuple(_thaw(v, tensors) for v in op.args)
        kwargs = {name: _thaw(v, tensors) for name, v in op.kwargs}
        return op_cost(op.func, args, kwargs, _thaw(op.out, tensors, tuple))
    except Exception:  # an op the cost model can't price must not stop the analysis
        return OpCost(0, 0, 0, "other")


@functools.cache
def _op_name(func):
    return str(func)


@functools.cache
def _dtype_name(dtype):
    return str(dtype)


def _mutated_groups(op):
    """Tensor groups the schema marks as written (in-place self, out=), as cost.ops.mutated_tensors."""
    written = written_arguments(op.func)
    if not written:
        return []
    kwargs = dict(op.kwargs)
    groups = []
    for i, name in written:
        value = kwargs.get(name) if name in kwargs else (op.args[i] if i < len(op.args) else None)
        groups.extend(_groups_in(value))
    return groups


def _group_bytes(meta):
    shape, stride, dtype = meta
    return nbytes_touched(shape, stride, dtype.itemsize)


def _first_float_dtype(op):
    for group in op.inputs[:op.arg_inputs] + op.outputs:
        dtype = op.metas[group][2]
        if dtype.is_floating_point:
            return dtype
    return None


class ModuleStack:
    """Which module's forward is running now, from global forward hooks: a path like `encoder.layer.0.output`."""

    def __init__(self, model):
        self.names = {}
        if isinstance(model, torch.nn.Module):
            compiled, model = model, getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
            self.names = {id(m): name for name, m in model.named_modules()}
            self.names[id(model)] = self.names[id(compiled)] = type(model).__name__
        self.stack = []

    def current(self):
        return self.stack[-1] if self.stack else None

    def _enter(self, module, args):
        name = self.names.get(id(module))
        if name is None:  # a module outside the model, or created during forward
            parent = self.current()
            if parent and isinstance(module, torch.fx.GraphModule):
                name = parent  # a compiled graph (torch.compile): its ops belong to the module that runs it
            else:
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
        self.model, self.by_sequence_nr, self.pending = model, {}, []

    @functools.cached_property
    def param_modules(self):
        """id(parameter) -> the module owning it; built on first use (inference never asks)."""
        if not isinstance(self.model, torch.nn.Module):
            return {}
        model = getattr(self.model, "_orig_mod", self.model)   # torch.compile's OptimizedModule: the module's names
        return {id(param): name.rpartition(".")[0] or type(model).__name__
                for name, param in model.named_parameters()}

    def resolve_pending(self):
        for outputs, module in self.pending:
            for t in outputs:
                node = t.grad_fn
                if node is not None:
                    self.by_sequence_nr.setdefault(node._sequence_nr(), module)
        self.pending.clear()

    def note_forward(self, out, module):
        # requires_grad is not set yet below autograd, so keep every floating output until the next op
        if module is not None and torch.is_grad_enabled():
            self.pending.append(([t for t in tensors_in(out) if t.is_floating_point()], module))

    def module_of_running_node(self):
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        variable = getattr(node, "variable", None)  # AccumulateGrad
        if variable is not None:
            return self.param_modules.get(id(variable))
        return self.by_sequence_nr.get(node._sequence_nr())


def _code_skipper():
    """set(code): Dynamo runs frames of `code`, and everything they call, without tracing them; or None."""
    try:
        from torch._C._dynamo import eval_frame

        try:  # torch's C types directly: importing torch._dynamo for them costs ~1.4 s
            action, strategy = eval_frame._FrameAction, eval_frame._FrameExecStrategy
        except AttributeError:
            from torch._dynamo.types import FrameAction as action, FrameExecStrategy as strategy
        set_code_exec_strategy = eval_frame.set_code_exec_strategy
        skip = strategy(action.SKIP, action.SKIP)
        return lambda code: set_code_exec_strategy(code, skip)
    except (ImportError, AttributeError, TypeError):
        return None


_SKIP_CODE = _code_skipper()
_CAN_SKIP_CODE = _SKIP_CODE is not None


def _skip_in_dynamo(code):
    """Per step (cheap): a model compiled with torch.compile that runs under the tracer never traces into it."""
    _SKIP_CODE(code)


_DISPATCH = {}  # op -> (what to call: the C++ entry OpOverload.__call__ forwards to, launches no kernel)


def _dispatch_entry(func):
    entry = (func._op if type(func) is OpOverload else func, launches_no_kernel(func))
    try:
        _DISPATCH[func] = entry
    except TypeError:  # an unhashable op: looked up every call
        pass
    return entry


class OpTracer(TorchDispatchMode):
    """Notes every op (raw metadata, see the module docstring) and/or marks each with a profiler range."""

    @classmethod
    def ignore_compile_internals(cls):
        # a torch.compile'd model runs its compiled code under the tracer (Dynamo otherwise falls back to eager
        # for any active mode): its ATen calls are traced, and the kernels it launches itself are timed as
        # kernels outside any op (timing.cuda_op_times). Older torch without this hook runs such models eagerly.
        return True

    @classmethod
    def _should_skip_dynamo(cls):
        # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo, ~5-11 us per op on the H100 host
        # (a quarter of the traced step's overhead). Only when Dynamo can be told once to skip these frames
        # (`_skip_in_dynamo`) does the tracer go without that wrapper.
        return not _CAN_SKIP_CODE

    def __init__(self, model=None, record_costs=True, mark_ranges=False, range_kernel_free_ops=True,
                 mark_kernels=False):
        super().__init__()
        self.record_costs, self.mark_ranges = record_costs, mark_ranges
        # interpreted brrr kernels (CPU) get a range of their own (kernel_range), inside a step whose record
        # functions are off (mark_ranges)
        self.mark_kernels = mark_kernels and mark_ranges
        self.range_kernel_free_ops = range_kernel_free_ops
        self.funcs, self.raw = [], []
        self.modules, self.backward_modules = ModuleStack(model), BackwardModules(model)

    def __enter__(self):
        if not self._should_skip_dynamo():
            _skip_in_dynamo(type(self).__torch_dispatch__.__code__)
        if self.record_costs:
            self.modules.__enter__()
        if self.mark_ranges:
            # record_function stays off for the whole step and is switched on only to open each op's range:
            # a profiler then records the brrr#i ranges and the launches, and none of the composite ops,
            # autograd engine calls and re-dispatched ATen calls around them (seen: 2.2x fewer events)
            _record_functions(False)
        if self.mark_kernels:
            kernel_registry.LAUNCH_HOOK = kernel_range
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if self.mark_kernels:
                kernel_registry.LAUNCH_HOOK = None
            if self.mark_ranges:
                _record_functions(True)
            if self.record_costs:
                self.modules.__exit__(*exc)
                self.backward_modules.pending.clear()

    @property
    def names(self):
        return [_op_name(func) for func in self.funcs]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        index = len(self.funcs)
        self.funcs.append(func)
        entry = _DISPATCH.get(func)
        if entry is None:
            entry = _dispatch_entry(func)
        run, kernel_free = entry
        if self.mark_ranges and (self.range_kernel_free_ops or not kernel_free):
            _record_functions(True)
            with _op_range(RANGE_PREFIX + str(index)):
                # the range is all timing needs: the ATen op (and what it calls) runs unrecorded inside it;
                # its launches are still seen (CUPTI)
                _record_functions(False)
                out = run(*args, **kwargs) if kwargs else run(*args)
        else:
            out = run(*args, **kwargs) if kwargs else run(*args)
        if not self.record_costs:
            return out
        if kernel_free:  # views and metadata ops, two thirds of a transformer's ops: the short note
            first = args[0] if args else None
            if type(first) is not torch.Tensor or len(args) > 1 and not _plain(args[1:]) or kwargs:
                tensors = _input_tensors(kwargs.values(), _input_tensors(args, [])) if kwargs else \
                    _input_tensors(args, [])
                shapes, dtypes = tuple([t.shape for t in tensors]), tuple([t.dtype for t in tensors])
            else:  # the usual view: one tensor, then sizes or dims
                shapes, dtypes = (first.shape,), (first.dtype,)
            module, phase = self._module_and_phase(out)
            self.raw.append(tuple.__new__(_ViewOp, (func, shapes, dtypes, module, phase)))
        else:
            self._note(func, args, kwargs, out)
        return out

    def _note(self, func, args, kwargs, out):
        call = _Call()
        frozen_args = call.sequence(args)  # args always come as a tuple
        arg_inputs = len(call.found)
        frozen_kwargs = tuple([(name, call.freeze(v)) for name, v in kwargs.items()]) if kwargs else ()
        inputs, call.found = call.found, []
        frozen_out = call.freeze(out)
        module, phase = self._module_and_phase(out)
        # tuple.__new__ skips the NamedTuple's Python-level __new__
        self.raw.append(tuple.__new__(_RawOp, (func, frozen_args, frozen_kwargs, frozen_out, tuple(call.metas),
                                               call.keys, inputs, arg_inputs, call.found, module, phase)))

    def _module_and_phase(self, out):
        backward = self.backward_modules
        if backward.pending:
            backward.resolve_pending()
        if _graph_task_id() != -1:
            return backward.module_of_running_node(), "backward"
        stack = self.modules.stack  # ModuleStack.current and BackwardModules.note_forward, inline (per op)
        module = stack[-1] if stack else None
        if module is not None and _grad_enabled():
            backward.note_forward(out, module)
        return module, "forward"


@contextmanager
def kernel_range(name):
    """Around one interpreted brrr kernel launch while a CPU step is traced (kernel_registry.LAUNCH_HOOK): a profiler
    range `brrr-kernel:<name>`, the kernel's host time. The Triton interpreter's own tensor calls inside (empty,
    set_, copy_ of each argument) are the launch's, not the model's ops: the tracer doesn't see them and the profiler
    doesn't record them."""
    with _disable_current_modes():
        _record_functions(True)
        try:
            with _op_range(KERNEL_RANGE_PREFIX + name):
                _record_functions(False)
                yield
        finally:
            _record_functions(False)


class _Priced(NamedTuple):
    """The parts of an OpRecord that follow from its call's signature: a 12-layer model repeats each."""

    cost: OpCost
    name: str
    dtype: torch.dtype | None
    input_shapes: tuple
    input_dtypes: tuple
    blocker: str | None = None

    @classmethod
    def of(cls, op):
        name = _op_name(op.func)
        if type(op) is _ViewOp:
            dtype = next((d for d in op.dtypes if d.is_floating_point), None)
            return cls(OpCost(0, 0, 0, op_class(op.func)), name, dtype,
                       tuple(tuple(shape) for shape in op.shapes), tuple(_dtype_name(d) for d in op.dtypes),
                       host_copies.uncapturable(name))
        metas = op.metas
        return cls(_price(op), name, _first_float_dtype(op), tuple(tuple(metas[g][0]) for g in op.inputs),
                   tuple(_dtype_name(metas[g][2]) for g in op.inputs),
                   host_copies.uncapturable_call(name, op.args, dict(op.kwargs)))


_PRICES = {}        # signature -> _Priced, kept across analyses in the process (a model analyzed twice, eager
_MAX_PRICES = 50000  # then compiled, or per batch size, reprices nothing it has seen)


def _known_prices():
    if len(_PRICES) > _MAX_PRICES:
        _PRICES.clear()
    return _PRICES


class Trace:
    """A traced step's raw ops; `records()` prices and links them into OpRecords."""

    def __init__(self, raw, result_keys):
        self.raw, self.result_keys = raw, result_keys
        self._writer = {}  # storage key -> index of the op that last wrote it (after records())

    def records(self):
        prices, records, self._writer = _known_prices(), [], {}
        with gc_paused():  # as in the step: ~2 OpRecord lists per op would set off collections (a full one: ~0.2 s)
            for index, op in enumerate(self.raw):
                records.append(self._record(index, op, self._priced(op, prices)))
                if type(op) is _RawOp:  # a view passes its inputs' producers through: nothing to link
                    self._link(records, op)
        for key in self.result_keys:
            writer = self._writer.get(key)
            if writer is not None:
                records[writer].is_step_output = True
        return records

    @staticmethod
    def _priced(op, prices):
        """What a record takes from its call's signature alone (_Priced), memoized per signature."""
        try:
            key = op.signature()
            priced = prices.get(key)
        except TypeError:  # an unhashable argument: price this call on its own
            return _Priced.of(op)
        if priced is None:
            priced = prices[key] = _Priced.of(op)
        return priced

    @staticmethod
    def _record(index, op, priced):
        cost = priced.cost
        # positional, in OpRecord's field order (index, name, module, phase, op_class, flops, bytes_read,
        # bytes_written, dtype, input_shapes, input_dtypes): half the cost of keywords, once per op
        record = OpRecord(index, priced.name, op.module or OUTSIDE_MODEL[op.phase], op.phase, cost.op_class,
                          cost.flops, cost.bytes_read, cost.bytes_written, priced.dtype, list(priced.input_shapes),
                          list(priced.input_dtypes))
        if priced.blocker is not None:
            record.blocker = priced.blocker
        return record

    def _link(self, records, op):
        """Link the op's inputs to their producers, then note what it wrote (see the module docstring)."""
        record, keys, writer = records[-1], op.keys, self._writer
        if record.op_class == "view":
            # a view reads nothing and is transparent: a reader of the view links to the real producer. A
            # fresh allocation (empty, empty_like) forgets whoever used that address before.
            input_keys = [keys[g] for g in op.inputs]
            for g in op.outputs:
                key = keys[g]
                if key is not None and key not in input_keys:
                    writer.pop(key, None)
            return
        seen = set()
        for g in op.inputs:
            producer = writer.get(keys[g])
            if producer is None or (producer, g) in seen:
                continue
            seen.add((producer, g))
            record.inputs_from.append((producer, _group_bytes(op.metas[g])))
            if record.index not in records[producer].consumers:
                records[producer].consumers.append(record.index)
        for g in op.outputs + _mutated_groups(op):
            key = keys[g]
            if key is not None:
                writer[key] = record.index


@contextmanager
def gc_paused():
    """Garbage collection paused: the tracer's small per-op tuples would set off a young-generation collection
    every ~50 ops (seen: ~2 us per op on BERT-base); nothing it allocates is cyclic, and the step's own garbage
    waits one step."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def step_range(mark=True):
    return _op_range(STEP_RANGE) if mark else nullcontext()


def record_step(step, mark_ranges=True, range_kernel_free_ops=True, mark_kernels=False):
    """Run `step` once under the tracer; returns its Trace (priced and linked by `.records()`, after the step,
    so that a profiler around this call sees the step alone). range_kernel_free_ops=False: views and
    metadata ops get no profiler range (device timing only needs the ops that launch kernels). mark_kernels:
    interpreted brrr kernels get a range each (kernel_range; CPU)."""
    tracer = OpTracer(step.model, record_costs=True, mark_ranges=mark_ranges,
                      range_kernel_free_ops=range_kernel_free_ops, mark_kernels=mark_kernels)
    with step_range(mark_ranges), tracer, gc_paused(), warnings.catch_warnings():
        # the module hooks are brrr's, for this step only: torch's warning about them is not the user's concern
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        output = step()
    results = list(tensors_in(output)) + [leaf.grad for leaf in step.grad_leaves if leaf.grad is not None]
    return Trace(tracer.raw, [_storage_key(t) for t in results])


def capture(step, mark_ranges=True):
    """Run `step` once under the tracer; returns its OpRecords in execution order."""
    return record_step(step, mark_ranges).records()


def trace_names(step, mark_ranges=True, range_kernel_free_ops=True, mark_kernels=False):
    """Run `step` once marking ranges only (no pricing); returns the op names, to match against capture."""
    tracer = OpTracer(record_costs=False, mark_ranges=mark_ranges, range_kernel_free_ops=range_kernel_free_ops,
                      mark_kernels=mark_kernels)
    with step_range(mark_ranges), tracer:
        step()
    return tracer.names
