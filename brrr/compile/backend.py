"""The torch.compile backend (**capture** -> lower -> schedule -> codegen -> runtime).

    torch.compile(model, backend="brrr")          # registered entry point
    brrr.compile(model, cuda_graphs=True)         # same, with options

Dynamo hands us an FX graph; `aot_autograd` with brrr's decomposition table turns it into core-ATen forward and
backward graphs, split by the min-cut rematerialization partitioner; each graph then goes through
`compile_graph`. When kernels cannot run (CPU without TRITON_INTERPRET=1, symbolic shapes, a failure inside
brrr) the graph runs as ATen - its own FX module - with one warning, so the answer is never wrong.
"""

import functools
import os

import torch

from brrr.compile.attention_mask import contiguous_attention_masks
from brrr.compile.runtime import recover, warn_once

aten = torch.ops.aten

# composites brrr wants as primitives it can fuse (core ATen keeps some of them whole)
EXTRA_DECOMPOSITIONS = [
    "native_layer_norm", "native_layer_norm_backward", "_softmax", "_log_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "native_dropout", "native_dropout_backward", "gelu_backward", "silu_backward",
    "sigmoid_backward", "tanh_backward", "threshold_backward", "var_mean", "rms_norm", "_fused_rms_norm",
    "embedding_dense_backward", "mse_loss", "mse_loss_backward", "nll_loss_forward", "nll_loss_backward",
    "addcmul", "addcdiv", "hardtanh_backward", "leaky_relu_backward", "elu_backward", "std", "var", "logsumexp",
    "native_group_norm", "native_group_norm_backward", "glu", "mish", "softplus",
    "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit",
    "native_batch_norm", "native_batch_norm_backward", "batch_norm_backward", "hardswish", "hardsigmoid",
    "leaky_relu", "elu",
]


@functools.lru_cache(maxsize=1)
def decomposition_table():
    from torch._decomp import core_aten_decompositions, get_decompositions
    table = dict(core_aten_decompositions())
    ops = [getattr(aten, name) for name in EXTRA_DECOMPOSITIONS if hasattr(aten, name)]
    table.update(get_decompositions(ops))
    # attention stays one ATen call (an Extern): never decompose it into bmm + softmax
    return {op: fn for op, fn in table.items() if "scaled_dot_product" not in str(op)}


def _static(gm):
    """True when every value in the graph has concrete sizes."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for v in (val if isinstance(val, (tuple, list)) else [val]):
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return False
            if isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt)
                                                   for s in list(v.shape) + list(v.stride())):
                return False
    return True


def _devices(gm):
    out = set()
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for v in (val if isinstance(val, (tuple, list)) else [val]):
            if isinstance(v, torch.Tensor):
                out.add(v.device.type)
    return out


def can_run_kernels(gm):
    """(ok, reason) - whether generated Triton kernels can run for this graph here."""
    devices = _devices(gm)
    if not _static(gm):
        return False, "dynamic shapes: this graph runs as ATen (mark inputs static to fuse)"
    if "cuda" in devices and torch.cuda.is_available() and devices <= {"cuda", "cpu"}:
        return True, ""
    if devices <= {"cpu"}:
        if os.environ.get("TRITON_INTERPRET") == "1":
            return True, ""
        return False, "no GPU: running graphs as ATen on CPU (set TRITON_INTERPRET=1 to run brrr's kernels)"
    return False, f"devices {sorted(devices)} not supported: running as ATen"


def plan_graph(gm):
    """FX graph -> scheduled Plan (no kernels run, nothing compiled)."""
    from brrr.compile.lower import lower
    from brrr.compile.schedule import schedule
    return schedule(lower(gm))


def compile_graph(gm, example_inputs, cuda_graphs=False, sink=None, graph_kind="forward"):
    """One core-ATen graph -> a callable. `sink(kind, gm, plan, kernels)` observes the plan (explain)."""
    from torch._functorch.aot_autograd import make_boxed_func
    ok, reason = can_run_kernels(gm)
    if sink is None and not ok:
        warn_once(reason)
        return make_boxed_func(gm)
    try:
        plan = plan_graph(gm)
        if sink is not None:
            from brrr.compile.runtime import generate_all
            sink(graph_kind, gm, plan, generate_all(plan))
            return make_boxed_func(gm)
        from brrr.compile.runtime import build
        if any(n is not None and n.kind == "buffer" and n.producer == "fallback" for n in plan.lowering.nodes):
            for fx, why in plan.lowering.fallbacks:
                warn_once(f"aten.{getattr(fx.target, '__name__', fx.target)} runs as ATen: {why}")
        compiled, _ = build(plan, gm, cuda_graphs=cuda_graphs and "cuda" in _devices(gm))
        return compiled
    except Exception as e:
        recover(e, "compiling a graph failed", "running it as ATen")
        return make_boxed_func(gm)


def brrr_backend(gm, example_inputs, cuda_graphs=False, _sink=None, **options):
    """The Dynamo backend: AOTAutograd (core-ATen decompositions, min-cut partitioner) around compile_graph;
    plain graphs then run from brrr's lean runtime instead of AOTAutograd's wrappers (lean_autograd.py)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from brrr.compile.lean_autograd import GraphCapture, lean_backward_patch

    capture = GraphCapture()

    def compiler(kind):
        def compile_kind(g, inputs):
            compiled = compile_graph(g, inputs, cuda_graphs=cuda_graphs, sink=_sink, graph_kind=kind)
            capture.saw(kind, g, compiled)
            return compiled
        return compile_kind

    backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                           inference_compiler=compiler("inference"), decompositions=decomposition_table(),
                           partition_fn=min_cut_rematerialization_partition)
    # The attention kernel (cuDNN, flash, memory-efficient or math) is chosen while AOTAutograd traces, by
    # torch's own priority: give broadcast masks a layout the fused kernels accept first.
    try:
        contiguous_attention_masks(gm)
    except Exception as e:   # an optimization only: the graph stays as Dynamo gave it
        recover(e, "attention mask pass failed", "graph left as is")
    # BRRR_AOT_RUNTIME=1 keeps AOTAutograd's runtime for every graph (to compare the two)
    patch = lean_backward_patch() if _sink is None and os.environ.get("BRRR_AOT_RUNTIME") != "1" else None
    if patch is None:
        return backend(gm, example_inputs)
    with patch:
        compiled = backend(gm, example_inputs)
    try:
        return capture.lean_callable(example_inputs) or compiled
    except Exception as e:
        recover(e, "the lean runtime could not wrap this graph", "using AOTAutograd's runtime")
        return compiled


def make_backend(**options):
    fn = functools.partial(brrr_backend, **options)
    fn.__name__ = "brrr"
    return fn


def compile(model, **options):
    """torch.compile(model, backend=brrr with `options`); options: cuda_graphs=False."""
    unknown = set(options) - {"cuda_graphs"}
    if unknown:
        raise TypeError(f"unknown brrr.compile options: {sorted(unknown)}")
    return torch.compile(model, backend=make_backend(**options))
