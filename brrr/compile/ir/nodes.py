"""brrr's loop-level IR (lower -> **ir** -> schedule -> codegen).

A tensor node is a function from an output index (one `Ix` per dim) to a `Value`: an expression of loads,
constants and math. Views only rewrite the index, pointwise ops compose functions, so a chain of them costs
nothing until someone stores it. Four kinds of node:

    Pointwise  fn(idx) -> Value                       inlined into its consumers, stored only when it must be
    Reduction  body(src_idx) -> Value over src_shape, reducing `dims` with `rtype`
    Buffer     a tensor in memory: graph input, or the output of an Extern / Fallback / host view
    (Extern and Fallback are Buffers whose producer is an ATen call: mm/conv/sdpa, or an op brrr does not lower)
"""

from dataclasses import dataclass, field

import torch

from brrr.compile.ir.indexing import contiguous_strides, linear

# ---------------------------------------------------------------------------------------------- values


class Value:
    __slots__ = ("dtype",)


class Const(Value):
    __slots__ = ("value",)

    def __init__(self, value, dtype):
        self.value, self.dtype = value, dtype


class Load(Value):
    __slots__ = ("buf", "index", "mask")

    def __init__(self, buf, index, dtype, mask=None):
        self.buf, self.index, self.dtype, self.mask = buf, index, dtype, mask


class Op(Value):
    """math: `name` is a key of codegen's op table; args are Values."""
    __slots__ = ("name", "args")

    def __init__(self, name, args, dtype):
        self.name, self.args, self.dtype = name, tuple(args), dtype


class IndexValue(Value):
    """an index expression used as data (arange, iota masks)."""
    __slots__ = ("index",)

    def __init__(self, index, dtype=torch.int64):
        self.index, self.dtype = index, dtype


class ReduceRef(Value):
    """the result of Reduction `node` at output index `idx` (a list of Ix in node.shape)."""
    __slots__ = ("node", "idx", "mask")

    def __init__(self, node, idx, mask=None):
        self.node, self.idx, self.dtype, self.mask = node, list(idx), node.dtype, mask


class Rand(Value):
    """uniform [0, 1) from Triton's Philox: tl.rand(seed loaded from `seed_buf`, offset)."""
    __slots__ = ("seed_buf", "offset")

    def __init__(self, seed_buf, offset, dtype):
        self.seed_buf, self.offset, self.dtype = seed_buf, offset, dtype


# ---------------------------------------------------------------------------------------------- nodes

MASKS = []     # conditions in force while a node's fn runs (cat / pad branches): loads and refs take them
LOAD_STORED = set()   # stored nodes produced by an earlier kernel: read them from memory instead of recomputing
_RECORD = []   # stack of sets: while codegen renders a kernel, every node whose fn runs adds itself here


@dataclass(eq=False)
class Node:
    name: str
    kind: str                      # "pointwise" | "reduction" | "buffer"
    shape: tuple
    dtype: torch.dtype
    fx: object = None              # the FX node it came from (None for helper nodes)
    ops: tuple = ()                # ATen op names it holds, for explain
    fn: object = None              # pointwise: idx -> Value
    # reduction
    body: object = None            # src_idx -> Value
    src_shape: tuple = ()
    dims: tuple = ()               # reduced dims of src_shape
    rtype: str = ""                # sum | max | min | prod | argmax | argmin | any | all
    # buffer
    stride: tuple = ()
    offset: int = 0
    producer: str = ""             # "input" | "extern" | "fallback" | "view" | "kernel" | "seed"
    reason: str = ""               # fallback: why
    view_of: object = None         # pointwise nodes that are views of another node: (source node)
    meta: dict = field(default_factory=dict)

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __call__(self, idx):
        """The value of this node at `idx`."""
        mask = MASKS[-1] if MASKS else None
        if self.kind == "pointwise" and self not in LOAD_STORED:
            if _RECORD:
                _RECORD[-1].add(self)
            return self.fn(list(idx))
        if self in LOAD_STORED:
            return Load(self, linear(idx, self.stride, 0), self.dtype, mask)
        if self.kind == "reduction":
            return ReduceRef(self, idx, mask)
        return Load(self, linear(idx, self.stride), self.dtype, mask)   # data_ptr() includes storage offset

    def __repr__(self):
        return f"{self.kind}:{self.name}{list(self.shape)}"


def is_host_view(node):
    """A view of a materialized tensor, run as the ATen view it is rather than as an index rewrite. Only an op
    whose result really aliases its input qualifies (the runtime folds a chain of them into one as_strided); any
    other index rewrite (flip: no strides express it) is computed by a kernel."""
    return node.view_of is not None and node.kind == "pointwise" and node.fx is not None \
        and node.fx.op == "call_function" and aliases_input(node.fx.target)


def aliases_input(target):
    """Whether ATen op `target` returns a view of its input (its schema says so; `_unsafe_view` is a view that
    autograd does not track)."""
    return bool(getattr(target, "is_view", False)) or getattr(target, "__name__", "").startswith("_unsafe_view")


def buffer(name, shape, stride, dtype, producer, fx=None, offset=0, **kw):
    return Node(name, "buffer", tuple(shape), dtype, fx=fx, stride=tuple(stride), offset=offset,
                producer=producer, **kw)


def pointwise(name, shape, dtype, fn, fx=None, ops=(), **kw):
    return Node(name, "pointwise", tuple(shape), dtype, fx=fx, fn=fn, ops=tuple(ops), **kw)


def reduction(name, shape, dtype, body, src_shape, dims, rtype, fx=None, ops=()):
    return Node(name, "reduction", tuple(shape), dtype, fx=fx, body=body, src_shape=tuple(src_shape),
                dims=tuple(sorted(dims)), rtype=rtype, ops=tuple(ops))


def contiguous(shape):
    return contiguous_strides(shape)


def walk(value, seen=None):
    """All Values reachable from `value` (loads inside indirect indices included)."""
    from brrr.compile.ir.indexing import Opaque
    seen = {} if seen is None else seen
    stack = [value]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen[id(v)] = v
        if isinstance(v, Op):
            stack.extend(v.args)
        elif isinstance(v, (Load, IndexValue, Rand)):
            ix = v.index if not isinstance(v, Rand) else v.offset
            for b in ix.bases():
                if isinstance(b, Value):
                    stack.append(b)
                elif isinstance(b, Opaque):
                    stack.extend(x for x in b.ix.bases() if isinstance(x, Value))
            if isinstance(v, Load) and v.mask is not None:
                stack.append(v.mask)
        elif isinstance(v, ReduceRef):
            if v.mask is not None:
                stack.append(v.mask)
            for ix in v.idx:
                stack.extend(b for b in ix.bases() if isinstance(b, Value))
    return list(seen.values())

