"""Memory reuse for the generated call (lower -> schedule -> codegen -> **runtime**): a kernel output takes the
memory of a tensor the graph no longer needs instead of a fresh allocation.

In place: a kernel that reads a tensor for the last time and writes an output of the same shape, strides and
dtype, element for element, can write that output over its input. On the H100 this is worth more than the
allocation: the seed MLP's layer norm reads the matmul's output while it still sits in L2, and overwriting
those same lines saved ~3-5 us of its 22-24 (Inductor does the same with its `in_out_ptr` arguments).
Dead: a tensor that nothing reads any more lends its memory to a later output of the same layout.

When in place is safe, per (kernel K, input B, output O):
- B's memory belongs to the graph: a kernel's output, or the result of an Extern that returns fresh memory
  (matmul, convolution), never a graph input, a constant, or a tensor the graph returns;
- nothing reads B (or a view of it) after K, and no other argument of K is a view of B;
- in K's source, every load of B reads exactly the element the one store to O writes (same index, same
  mask) and comes before that store, so each element is read before it is overwritten, by the program that
  overwrites it (`same_element_access`).
"""

import ast
import heapq
import itertools

import torch

from brrr.compile.ir import nodes as ir
from brrr.compile.ir.sizes import same

_aten = torch.ops.aten
FRESH_EXTERNS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
                 _aten.convolution.default}


def root_of(node):
    """The tensor whose memory `node` uses: itself, or the tensor a chain of host views starts from."""
    while isinstance(node, ir.Node) and ir.is_host_view(node):
        node = node.view_of
    return node


def _owned(node):
    """Memory the graph allocated itself, which no one outside the graph can see."""
    if ir.is_host_view(node):
        return False
    if node.kind in ("pointwise", "reduction"):
        return True
    return node.kind == "buffer" and node.producer == "extern" and node.fx is not None \
        and node.fx.target in FRESH_EXTERNS


def _nodes_in(value):
    if isinstance(value, ir.Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _nodes_in(v)


def step_reads(kind, step, kernels, lowering):
    """The IR nodes a plan step reads (a kernel: its every argument)."""
    if kind == "kernel":
        return kernels[step].args
    if kind == "aten" and step.view_of is not None and ir.is_host_view(step):
        return [step.view_of]
    if kind == "aten" and step.fx is not None:
        fx_args = torch.fx.node.map_arg((step.fx.args, step.fx.kwargs), lambda a: lowering.env.get(a))
        return list(_nodes_in(fx_args))
    return []


def _may_alias(fx):
    """Whether an ATen call's result may share memory with its arguments (its schema says so, or unknown)."""
    schema = getattr(fx.target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def last_uses(plan, kernels):
    """(root tensor -> index of the last step that touches it or a view of it, inf for returned tensors;
    roots read by an ATen call whose result may alias them, whose memory is never handed on)."""
    last, aliased = {}, set()
    for t, (kind, step) in enumerate(plan.steps):
        reads = step_reads(kind, step, kernels, plan.lowering)
        risky = kind == "aten" and not ir.is_host_view(step) and step.fx is not None and _may_alias(step.fx)
        for node in reads:
            root = root_of(node)
            last[root] = max(last.get(root, -1), t)
            if risky:
                aliased.add(root)
    for node in _nodes_in(plan.lowering.outputs):
        last[root_of(node)] = float("inf")
    return last, aliased


def _layout(node):
    return tuple(node.shape), tuple(node.stride), node.dtype


def _same_layout(a, b):
    """Whether two buffers have one layout for every size the graph may be called with (no guard)."""
    return a.dtype == b.dtype and same(a.shape, b.shape) and same(a.stride, b.stride)


def _produced(kind, step, kernels):
    if kind == "kernel":
        return kernels[step].stores
    if kind == "aten" and step.kind == "buffer" and step.producer == "extern":
        return [step]
    return []


def reused_memory(plan, kernels):
    """{kernel output: (tensor whose memory it takes, whether in place)}. Two cases, both for tensors the graph
    owns (a kernel's output, a fresh matmul/convolution result) of the same shape, strides and dtype:
    - in place: the kernel reads that tensor for the last time, element for element (module docstring);
    - dead: nothing reads that tensor any more (its last use was an earlier step), so its memory is free.
    Reusing dead memory saves an allocation per kernel output (BERT-base's backward made ~450 per call)
    and keeps the working set small; the most recently freed tensor goes first, as it is likeliest in L2."""
    last, aliased = last_uses(plan, kernels)
    reuse, taken, allocated = {}, set(), set()
    pending, free = [], {}   # (last use, order, node) not yet free; layout -> nodes whose memory is free
    order = itertools.count()   # ties on the last use never compare nodes
    for t, (kind, step) in enumerate(plan.steps):
        while pending and pending[0][0] < t:
            _, _, node = heapq.heappop(pending)
            if node not in taken:
                free.setdefault(_layout(node), []).append(node)
        if kind == "kernel":
            ks = kernels[step]
            inputs = ks.args[:len(ks.args) - len(ks.stores)]
            roots = [root_of(a) for a in inputs]
            for j, out in enumerate(ks.stores):
                if out in allocated:   # an accumulating kernel adds into memory an earlier kernel wrote
                    continue
                allocated.add(out)
                source = _in_place_source(ks, j, out, inputs, roots, last, aliased, taken, t)
                in_place = source is not None
                if source is None:
                    candidates = free.get(_layout(out))
                    while candidates and source is None:
                        node = candidates.pop()
                        source = node if node not in taken else None
                if source is not None:
                    reuse[out] = (source, in_place)
                    taken.add(source)
        for node in _produced(kind, step, kernels):
            end = last.get(node)
            if _owned(node) and node not in aliased and end is not None and end != float("inf"):
                heapq.heappush(pending, (end, next(order), node))
    return reuse


def _in_place_source(ks, j, out, inputs, roots, last, aliased, taken, t):
    for i, b in enumerate(inputs):
        if b in taken or b in aliased or not _owned(b) or last.get(b) != t or roots.count(b) != 1:
            continue
        if _same_layout(b, out) and same_element_access(ks.source, f"in_ptr{i}", f"out_ptr{j}"):
            return b
    return None


def _memory_calls(source):
    """(line number, 'load'|'store'|'other', pointer name, index text, mask text) per tl memory call."""
    calls = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "tl"):
            continue
        if not node.args or not isinstance(node.args[0], ast.BinOp) or not isinstance(node.args[0].left, ast.Name):
            continue
        name = node.func.attr
        kind = name if name in ("load", "store") else "other"
        mask_at = 1 if kind == "load" else 2
        mask = ast.unparse(node.args[mask_at]) if len(node.args) > mask_at else None
        calls.append((node.lineno, kind, node.args[0].left.id, ast.unparse(node.args[0].right), mask))
    return calls


def same_element_access(source, in_ptr, out_ptr):
    """True when the kernel stores to `out_ptr` once, and every access to `in_ptr` is a load of the very
    element (index and mask) that store writes, placed before it."""
    calls = _memory_calls(source)
    stores = [c for c in calls if c[2] == out_ptr]
    if len(stores) != 1 or stores[0][1] != "store":
        return False
    line, _, _, index, mask = stores[0]
    reads = [c for c in calls if c[2] == in_ptr]
    return bool(reads) and all(kind == "load" and at < line and (ix, m) == (index, mask)
                               for at, kind, _, ix, m in reads)
