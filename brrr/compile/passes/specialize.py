"""Changing shapes (capture -> **specialize** -> lower -> schedule -> codegen -> runtime).

A graph Dynamo captures with symbolic sizes (a dimension changed between calls) is planned once at those sizes
(sizes.py), the default. With `symbolic_sizes=False`, or where that planning fails, `PerShape` compiles it
once per concrete shape it is called with instead, each time through brrr's static path: AOTAutograd
re-traces the captured graph at those sizes (a size input arrives as an int and is baked in like any other
constant). At most `MAX_SHAPES` shapes per graph get their own compile; past
them, and for a shape whose compile falls back, the captured graph runs as Dynamo gave it.

Why not just run the captured graph: it is not eager. Traced, Hugging Face models build their attention masks
without the data-dependent shortcuts eager takes, so BERT's attention there runs as math attention in fp32,
5x eager's device time on an H100 at 8x512 (`benchmarks/NOTES.md`). A specialization gets brrr's mask pass and
fused kernels, and costs one compile per new shape.
"""

import torch
import torch.fx

from brrr.compile import fallbacks
from brrr.compile.fallbacks import warn_once

MAX_SHAPES = 8


def symbolic(value):
    """A SymInt/SymFloat/SymBool, or a tensor with a symbolic size or stride."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    return isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt)
                                                   for s in list(value.shape) + list(value.stride()))


def varying_inputs(gm):
    """Positions of the graph's inputs whose sizes are symbolic: the only ones that can differ between calls
    (Dynamo's guards hold the others, parameters among them, to the sizes they were captured at)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, n in enumerate(placeholders)
            if symbolic(n.meta.get("val", n.meta.get("example_value")))]


def signature(args):
    """What a specialization is valid for: each tensor's sizes, strides, dtype and device; each other value."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((tuple(a.shape), tuple(a.stride()), a.dtype, a.device.type, a.requires_grad))
        elif isinstance(a, (int, float, bool)):
            out.append(a)
        else:
            out.append(type(a).__name__)
    return tuple(out)


class PerShape:
    """A symbolic graph, compiled by `compile_static(gm, args)` once per shape signature of its arguments."""

    def __init__(self, gm, compile_static, eager_forward, limit=None):
        self.gm, self.compile_static, self.eager_forward = gm, compile_static, eager_forward
        self.limit = MAX_SHAPES if limit is None else limit
        self.varying = varying_inputs(gm)     # keyed on these alone: a call does not walk every parameter
        self.compiled = {}

    def __call__(self, *args):
        key = signature([args[i] for i in self.varying])
        fn = self.compiled.get(key)
        if fn is None:
            fn = self.compiled[key] = self.specialize(args)
        return fn(*args)     # a backend's result is called as Dynamo calls it

    def specialize(self, args):
        if len(self.compiled) >= self.limit:
            reason = (f"changing shapes: {self.limit} shapes of this graph already compiled; others run as "
                      f"captured")
            fallbacks.log("graph", "dynamo", "graph", reason)
            warn_once(reason)
            return self.eager_forward
        # a graph of its own: the attention-mask pass rewrites the graph it is given; parameters stay shared
        gm = copy_graph_module(self.gm)
        # outside Dynamo's compile there is no tracing context: AOTAutograd fakes the real arguments statically
        with torch._guards.tracing(None):
            return self.compile_static(gm, list(args))


def copy_graph_module(gm):
    """A GraphModule of its own over a copy of gm's graph (the backend's passes rewrite the graph they get);
    parameters and buffers stay shared."""
    return torch.fx.GraphModule(gm, _copy_graph(gm.graph))


def _copy_graph(graph):
    new = torch.fx.Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new
