"""Matmul prologues: an operand's cheap producer computed in the template's K loop (matmul fusion -> **codegen** ->
runtime).

A pointwise kernel that only makes a matmul operand (a cast of fp32 weights to bf16 under autocast, a scale, a
transpose made contiguous) writes the operand and the matmul reads it back. Folded, the template loads what
that kernel loaded and computes the operand's block in registers: the operand never reaches memory and the
producer's launch is gone. The operand's element (row, k) of A or (k, column) of B is named by
`template.PROLOGUE_INDEX`; brrr's pointwise codegen renders the producer's value there, through the
operand's view (a transposed weight is a host view of the cast's output), and rounds it to the operand's dtype
as the producer's store did, so the product is the unfused one's bit for bit.

What is folded must stay cheap, since the template computes each element once per output tile it feeds
(N / BLOCK_N times for A, M / BLOCK_M for B): at most PROLOGUE_MAX_OPS arithmetic ops of PROLOGUE_OPS over
direct loads of at most PROLOGUE_MAX_SOURCES tensors; no reduction, random number, gathered index or
iota. `refusal` says why not otherwise (explain lists it).
"""

import torch

from brrr.compile.codegen.triton import Codegen, Scope, compute_dtype
from brrr.compile.ir import nodes as ir
from brrr.compile.ir.indexing import Ix
from brrr.compile.matmul.template import PROLOGUE_INDEX, Prologue

PROLOGUE_OPS = frozenset({"cast", "round_to", "mul", "add", "sub", "neg", "div"})
PROLOGUE_MAX_OPS = 6
PROLOGUE_MAX_SOURCES = 2


def operand_index(which, operand):
    """The operand's element as Ix of the template's prologue names: (row, k) of A, (k, column) of B."""
    first, second = PROLOGUE_INDEX[which]
    return [Ix.var(first, operand.shape[0]), Ix.var(second, operand.shape[1])]


def operand_views(operand, root):
    """The operand and the host views between it and `root`, the memory they view, root included: what a prologue
    computes instead of loading."""
    views, node = {root}, operand
    while node is not root:
        views.add(node)
        node = node.view_of
    return views


def operand_value(which, operand, load_stored):
    """The Value of a 2-D operand's element, as its producer computes it (through the operand's views), and the
    IR nodes that computation runs."""
    nodes = set()
    ir._RECORD.append(nodes)
    prev, ir.LOAD_STORED = ir.LOAD_STORED, load_stored
    try:
        value = operand(operand_index(which, operand))
    finally:
        ir.LOAD_STORED = prev
        ir._RECORD.pop()
    return value, nodes


def refusal(value):
    """Why the value cannot be a prologue (too costly to compute once per tile, or not a plain function of
    loaded elements), or None."""
    ops, sources = 0, set()
    for v in ir.walk(value):
        if isinstance(v, ir.Op):
            if v.name not in PROLOGUE_OPS:
                return f"its producer computes {v.name}, not only a cast, scale or copy"
            ops += 1
        elif isinstance(v, ir.Load):
            if v.mask is not None or any(not isinstance(b, str) for b in v.index.bases()):
                return "its producer reads through a mask or a gathered index"
            sources.add(v.buf)
        elif not isinstance(v, ir.Const):
            return f"its producer computes a {type(v).__name__}"
    if ops > PROLOGUE_MAX_OPS:
        return f"its producer computes {ops} ops, over the {PROLOGUE_MAX_OPS} a tile may repeat"
    if len(sources) > PROLOGUE_MAX_SOURCES:
        return f"its producer reads {len(sources)} tensors, over {PROLOGUE_MAX_SOURCES}"
    if not sources:
        return "its producer reads no tensor"
    return None


def render(which, operand, producer, stored, load_stored, kernel_of, inputs, interpreted, counter):
    """(Prologue, helpers, IR nodes, next tmp counter) computing operand `which` ("a" or "b") of the template in
    its operand form (`dtype` rounded, widened to fp32 exactly under the interpreter, as the template's own loads
    are). `producer`: the pointwise schedule.Kernel that stored the operand's memory; `inputs`: the fused
    kernel's pointer table (node -> in_ptr name), which the prologue's loads join."""
    dtype = operand.dtype
    widen = dtype == torch.bfloat16 and interpreted   # the template's own bf16 loads are widened there too
    value, nodes = operand_value(which, operand, load_stored)
    branches, helpers = [], set()
    for even in (True, False):
        cg = Codegen(producer, stored, load_stored, kernel_of, interpreted=interpreted)
        cg.inputs, cg.counter = inputs, counter
        cg.x_full = even   # rows wrap inside the operand; only the K tail masks
        cg.y_full = True   # a transpose's tiled producer: its tiles are the template's now
        scope = Scope(indent="")
        name, _ = cg.value(scope, value)
        rounded = cg.narrow(name, dtype) if compute_dtype(dtype) != dtype else name
        if widen:
            rounded = cg.widen(rounded, dtype)
        lines = list(scope.lines)
        if any("xindex * 0" in line for line in lines):   # a scalar load, broadcast to the block
            lines.insert(0, "xindex = {0} * 0 + {1} * 0".format(*PROLOGUE_INDEX[which]))
        if not even:
            lines.insert(0, f"xmask = {PROLOGUE_INDEX[which][1 if which == 'a' else 0]} < K")
        lines.append(f"{which} = {rounded}")
        branches.append(tuple(lines))
        helpers |= cg.helpers
        next_counter = cg.counter
    return Prologue(even=branches[0], masked=branches[1]), helpers, nodes, next_counter
