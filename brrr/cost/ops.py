"""Per-ATen-op cost: FLOPs, bytes read and written, and the op's class.

This is the one place brrr counts work. The analyzer (brrr/analyze) prices every op it traces with
`op_cost`; the compiler (brrr/compile) prices unfused graphs and fused kernels with `tensor_bytes`.

Rules:
- FLOPs of matmul, conv and attention come from `torch.utils.flop_counter`'s registry (2 per multiply-add).
  Everything else is counted here: elementwise ops cost a few FLOPs per output element (a table below, 1 by
  default; a transcendental counts as one op), reductions one per input element, composites (softmax,
  layer/RMS/batch/group norm and their backwards) a fixed small count per element.
- Bytes: each distinct input tensor is read once and each output written once, as the bytes of the region
  actually touched: unique elements (a stride-0 broadcast dim counts once) times itemsize. Views, reshapes
  and metadata ops move 0 bytes. Gathers (embedding, index_select, gather) read only the rows they fetch.
  Ops that overwrite an argument without reading it (copy_, fill_, zero_, random fills, out=) don't read it,
  and `*_like` factories read nothing.
"""

import functools
import math
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

OP_CLASSES = ("contraction", "normalization", "elementwise", "view", "other")


@dataclass(frozen=True)
class OpCost:
    flops: int
    bytes_read: int
    bytes_written: int
    op_class: str

    @property
    def bytes(self):
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self):
        """Arithmetic intensity, FLOPs per byte moved (inf for an op that moves nothing)."""
        return self.flops / self.bytes if self.bytes else math.inf


def _names(*names):
    return frozenset(names)


# Ops that move no bytes although the dispatcher doesn't mark them as views.
ZERO_BYTE_OPS = _names(
    "_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_reshape_alias",
    "view_as_real", "view_as_complex", "resize_", "set_", "lift_fresh_copy", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "_local_scalar_dense", "is_same_size", "_has_compatible_shallow_copy_type",
)

# Ops that launch no device work at all (metadata only). The empty* allocations move no bytes but stay out:
# under torch.use_deterministic_algorithms they fill the new memory with a kernel.
KERNEL_FREE_OPS = _names(
    "_unsafe_view", "_reshape_alias", "view_as_real", "view_as_complex", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
)

CONTRACTION_OPS = _names(
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "dot", "vdot", "mv", "addmv", "addbmm", "einsum",
    "convolution", "_convolution", "convolution_backward", "cudnn_convolution", "conv1d", "conv2d", "conv3d",
    "_scaled_mm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
    "_efficient_attention_backward", "scaled_dot_product_attention", "_slow_conv2d_forward",
    "mkldnn_convolution", "convolution_overrideable",
)

# Statistics over a dimension: norms, softmax and plain reductions. FLOPs are per input element.
NORMALIZATION_FLOPS_PER_ELEMENT = {
    "native_layer_norm": 8, "native_layer_norm_backward": 12, "layer_norm": 8,
    "_fused_rms_norm": 5, "_fused_rms_norm_backward": 8, "rms_norm": 5,
    "native_batch_norm": 8, "_native_batch_norm_legit": 8, "_native_batch_norm_legit_no_training": 4,
    "native_batch_norm_backward": 12, "batch_norm_backward": 12, "cudnn_batch_norm": 8,
    "cudnn_batch_norm_backward": 12, "native_group_norm": 8, "native_group_norm_backward": 12,
    "_softmax": 5, "_log_softmax": 5, "softmax": 5, "log_softmax": 5,
    "_softmax_backward_data": 3, "_log_softmax_backward_data": 3,
    "sum": 1, "mean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "prod": 1, "argmax": 1, "argmin": 1,
    "any": 1, "all": 1, "var": 3, "var_mean": 3, "std": 3, "std_mean": 3, "norm": 2, "linalg_vector_norm": 2,
    "logsumexp": 4, "cumsum": 1, "cumprod": 1, "nll_loss_forward": 1, "nll_loss_backward": 1,
    "nll_loss2d_forward": 1, "nll_loss2d_backward": 1, "mse_loss": 3, "topk": 1, "sort": 1,
}

# Elementwise ops whose per-element cost is clearly more than one FLOP (rough op counts of their formulas).
ELEMENTWISE_FLOPS_PER_ELEMENT = {
    "gelu": 5, "gelu_backward": 8, "silu": 3, "silu_backward": 5, "sigmoid_backward": 2, "tanh_backward": 2,
    "softplus": 3, "softplus_backward": 4, "elu": 3, "mish": 5, "hardswish": 4, "hardsigmoid": 3,
    "addcmul": 2, "addcdiv": 2, "lerp": 2, "threshold_backward": 1, "native_dropout": 2,
    "native_dropout_backward": 1, "leaky_relu": 2, "clamp": 2, "erfinv": 4, "pow": 1,
}

# Data movement that is elementwise in shape but does no arithmetic.
COPY_OPS = _names("clone", "_to_copy", "copy", "copy_", "contiguous", "cat", "stack", "constant_pad_nd",
                  "fill", "fill_", "zero_", "zeros_like", "ones_like", "full_like", "where", "masked_fill",
                  "repeat", "flip", "roll", "tril", "triu")

# Ops that overwrite these mutated arguments without reading their old values.
OVERWRITE_OPS = _names("copy_", "fill_", "zero_", "uniform_", "normal_", "bernoulli_", "random_",
                       "exponential_", "geometric_", "cauchy_", "log_normal_", "set_")

GATHER_OPS = _names("embedding", "index_select", "gather", "index", "take", "_embedding_bag")

_REDUCTION_TAG = getattr(torch.Tag, "reduction", None)


def _per_op(fact):
    """Memoize `fact(func)`, a property of the op alone (it's asked several times per traced call)."""
    cache = {}

    @functools.wraps(fact)
    def lookup(func):
        try:
            return cache[func]
        except KeyError:
            value = cache[func] = fact(func)
            return value
        except TypeError:  # an unhashable callable: not memoized
            return fact(func)

    return lookup


@_per_op
def _base_name(func):
    """'aten::native_layer_norm.default' -> 'native_layer_norm'."""
    schema_name = getattr(func, "_schema", None)
    name = schema_name.name if schema_name is not None else str(func)
    return name.split("::")[-1].split(".")[0]


@_per_op
def _is_view(func):
    return bool(getattr(func, "is_view", False)) or _base_name(func) in ZERO_BYTE_OPS


@_per_op
def launches_no_kernel(func):
    """True for ops that only make a new view of existing memory or read metadata: no device kernel, ever."""
    return bool(getattr(func, "is_view", False)) or _base_name(func) in KERNEL_FREE_OPS


@_per_op
def op_class(func):
    name = _base_name(func)
    if _is_view(func):
        return "view"
    if name in CONTRACTION_OPS or getattr(func, "overloadpacket", None) in flop_registry:
        return "contraction"
    if name in NORMALIZATION_FLOPS_PER_ELEMENT or (_REDUCTION_TAG is not None and _REDUCTION_TAG in func.tags):
        return "normalization"
    tags = getattr(func, "tags", ())
    if torch.Tag.pointwise in tags or name in ELEMENTWISE_FLOPS_PER_ELEMENT or name in COPY_OPS:
        return "elementwise"
    if name.rstrip("_") in ELEMENTWISE_FLOPS_PER_ELEMENT:
        return "elementwise"
    return "other"


def tensors_in(value):
    """Every tensor inside nested tuples/lists/dicts (args, outputs, an HF ModelOutput), in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


def nbytes_touched(shape, strides, itemsize):
    """Bytes of the unique elements a view covers: a stride-0 (broadcast) dim counts once."""
    unique = 1
    for size, stride in zip(shape, strides):
        if size == 0:
            return 0
        if stride != 0:
            unique *= size
    return unique * itemsize


def tensor_bytes(t):
    return nbytes_touched(t.shape, t.stride(), t.element_size())


def _unique(tensors):
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


@_per_op
def written_arguments(func):
    """(position, name) of each argument the op's schema marks as written (in-place self, out=)."""
    return tuple((i, arg.name) for i, arg in enumerate(func._schema.arguments)
                 if arg.alias_info is not None and arg.alias_info.is_write)


def mutated_tensors(func, args, kwargs):
    """Tensors the schema marks as written (in-place self, out=)."""
    written = []
    for i, name in written_arguments(func):
        value = kwargs.get(name) if name in kwargs else (args[i] if i < len(args) else None)
        written.extend(tensors_in(value))
    return written


def _gather_bytes(name, args, out_tensors):
    """Bytes read by a gather: the fetched rows plus the indices; written: the output."""
    written = sum(tensor_bytes(t) for t in out_tensors)
    index_bytes = sum(tensor_bytes(t) for t in tensors_in(args[1:]) if not t.is_floating_point())
    return written + index_bytes, written


def op_bytes(func, args, kwargs, out):
    """(bytes_read, bytes_written) of one op call."""
    if _is_view(func):
        return 0, 0
    kwargs = kwargs or {}
    name = _base_name(func)
    out_tensors = _unique(tensors_in(out))
    if name in GATHER_OPS:
        return _gather_bytes(name, args, out_tensors)
    inputs = _unique(list(tensors_in(args)) + list(tensors_in(kwargs)))
    if name.endswith("_like"):  # zeros_like, rand_like, ...: only the input's metadata is used
        inputs = []
    skip = set()
    if name in OVERWRITE_OPS or "out" in kwargs:
        skip = {id(t) for t in mutated_tensors(func, args, kwargs)}
    read = sum(tensor_bytes(t) for t in inputs if id(t) not in skip)
    written = sum(tensor_bytes(t) for t in out_tensors)
    return read, written


@_per_op
def has_flop_formula(func):
    """Whether op_flops calls torch's FLOP formula for `func` (it costs ~10x the rest of op_cost)."""
    return getattr(func, "overloadpacket", None) in flop_registry


def op_flops(func, args, kwargs, out):
    kwargs = kwargs or {}
    packet = getattr(func, "overloadpacket", None)
    if packet in flop_registry:
        return int(flop_registry[packet](*args, **kwargs, out_val=out))
    name = _base_name(func)
    if _is_view(func) or name in COPY_OPS or name in GATHER_OPS:
        return 0
    if name in NORMALIZATION_FLOPS_PER_ELEMENT or op_class(func) == "normalization":
        largest_input = max((t.numel() for t in tensors_in(args)), default=0)
        return NORMALIZATION_FLOPS_PER_ELEMENT.get(name, 1) * largest_input
    if op_class(func) == "elementwise":
        per_element = ELEMENTWISE_FLOPS_PER_ELEMENT.get(name, ELEMENTWISE_FLOPS_PER_ELEMENT.get(name.rstrip("_"), 1))
        first_out = next(tensors_in(out), None)
        return per_element * (first_out.numel() if first_out is not None else 0)
    return 0


def op_cost(func, args, kwargs, out):
    kwargs = kwargs or {}
    read, written = op_bytes(func, args, kwargs, out)
    return OpCost(op_flops(func, args, kwargs, out), read, written, op_class(func))


def cost_key(func, args, kwargs, out):
    """A hashable summary of one op call that fixes its op_cost: tensors by shape, strides, dtype and which
    of them are the same tensor, everything else by type and value. Raises TypeError where unhashable."""
    seen = {}
    return func, _signature(args, seen), _signature(kwargs, seen), _signature(out, seen)


def _signature(value, seen):
    if isinstance(value, torch.Tensor):
        return seen.setdefault(id(value), len(seen)), value.shape, value.stride(), value.dtype
    if isinstance(value, (list, tuple)):
        return type(value), tuple(_signature(v, seen) for v in value)
    if isinstance(value, dict):
        return dict, tuple((k, _signature(v, seen)) for k, v in value.items())
    return type(value), value
