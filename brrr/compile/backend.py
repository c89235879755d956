"""The torch.compile backend (**capture** -> lower -> schedule -> codegen -> runtime).

    torch.compile(model, backend="brrr")          # registered entry point
    brrr.compile(model, cuda_graphs=True)         # same, with options (cuda_graphs: "auto", "fastest", True, False)

Dynamo hands us an FX graph; `aot_autograd` with brrr's decomposition table turns it into core-ATen forward and
backward graphs, split by the min-cut rematerialization partitioner; each graph then goes through
`compile_graph`. What brrr cannot compile falls back at the smallest scope (fallbacks.py): one op, one
kernel's ops, or the whole graph, which then runs as Dynamo captured it (CPU without TRITON_INTERPRET=1,
symbolic shapes, planning failures): eager's ops at eager's speed, with one warning, never a wrong answer.
"""

import contextlib
import functools
import os
import sys

import torch

from brrr.compile import fallbacks
from brrr.compile.fallbacks import (GraphFallback, KernelFailed, MAX_REPLANS, debugging, is_out_of_memory, recover,
                                    warn_once)
from brrr.compile.ir import sizes
from brrr.compile.passes import graph_breaks, layouts
from brrr.compile.passes.attention_mask import contiguous_attention_masks
from brrr.compile.passes.linear_cross_entropy import fuse_linear_cross_entropy
from brrr.compile.passes.partition import partition_fn
from brrr.compile.passes.specialize import PerShape, copy_graph_module, symbolic
from brrr.compile.runtime import compile_workers

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
# composites core ATen decomposes that brrr lowers whole: col2im's decomposition is an accumulating index_put
# (ATen's sort-based kernel: 16x Inductor's time for F.fold on an H100), lowered as a gather (windows.py)
KEPT_WHOLE = ["col2im", "im2col"]


@functools.lru_cache(maxsize=1)
def decomposition_table():
    from torch._decomp import core_aten_decompositions, get_decompositions
    table = dict(core_aten_decompositions())
    ops = [getattr(aten, name) for name in EXTRA_DECOMPOSITIONS if hasattr(aten, name)]
    table.update(get_decompositions(ops))
    for name in KEPT_WHOLE:
        for overload in getattr(aten, name).overloads():
            table.pop(getattr(getattr(aten, name), overload), None)
    # attention stays one ATen call (an Extern): never decompose it into bmm + softmax
    return {op: fn for op, fn in table.items() if "scaled_dot_product" not in str(op)}


def _values(gm):
    for node in gm.graph.nodes:
        val = node.meta.get("val", node.meta.get("example_value"))
        yield from (val if isinstance(val, (tuple, list)) else [val])


def _static(gm, example_inputs=()):
    """True when every value in the graph (and every example input) has concrete sizes."""
    return not any(symbolic(v) for v in list(_values(gm)) + list(example_inputs))


def _devices(gm, example_inputs=()):
    return {v.device.type for v in list(_values(gm)) + list(example_inputs) if isinstance(v, torch.Tensor)}


SYMBOLIC = "dynamic shapes: brrr plans the graph at its symbolic sizes, or once per shape it is called with"


def graph_refusal(gm, example_inputs=(), planning_only=False):
    """Why brrr's kernels cannot run this graph here as it is (None when they can). `planning_only` (explain)
    asks only whether it can be planned: a CPU graph without TRITON_INTERPRET=1 can, though its kernels cannot
    run. A symbolic graph (SYMBOLIC) is planned at its symbolic sizes (sizes.py) or per shape (specialize.py)
    where its devices allow."""
    if not _static(gm, example_inputs):
        return SYMBOLIC
    if planning_only:
        return None
    return device_refusal(gm, example_inputs)


def device_refusal(gm, example_inputs=()):
    """Why brrr's kernels cannot run on this graph's devices here, or None."""
    devices = _devices(gm, example_inputs)
    if "cuda" in devices and torch.cuda.is_available() and devices <= {"cuda", "cpu"}:
        return None
    if devices <= {"cpu"}:
        if os.environ.get("TRITON_INTERPRET") == "1":
            return None
        return "no GPU: graphs run as captured on CPU (set TRITON_INTERPRET=1 to run brrr's kernels)"
    return f"devices {sorted(devices)}: no brrr kernels for them, the graph runs as captured"


def can_run_kernels(gm):
    """(ok, reason) - whether generated Triton kernels can run for this graph here."""
    reason = graph_refusal(gm)
    return reason is None, reason or ""


def plan_graph(gm, forced=None, split=(), wider=()):
    """FX graph -> scheduled Plan (no kernels run, nothing compiled); `forced` FX nodes run as ATen calls, `split`
    FX nodes' values start kernels of their own, `wider` FX nodes' reductions split across more programs (the
    floor's alternatives, runtime/floor.py). Unaligned matmuls
    are padded first, in gm itself (passes/pad_matmuls.py), so its ATen fallback runs them too."""
    from brrr.compile.lowering.core import lower
    from brrr.compile.scheduling.schedule import schedule
    # a node's value inlines its chain of pointwise producers, one Python call per link: a backward graph's
    # gradient sums chain hundreds (Inductor raises the limit for the same reason)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
    prepare_graph(gm)
    return schedule(lower(gm, forced, wider), split)


def prepare_graph(gm):
    """The FX passes planning starts with, in gm itself (idempotent): a graph the graph cache serves gets them
    too, so its ATen fallback and its constants are the planned graph's."""
    from brrr.compile.passes.device_constants import move_host_constants
    from brrr.compile.passes.pad_matmuls import pad_matmuls

    pad_matmuls(gm)
    move_host_constants(gm)   # a copy of a host constant to the device: made once, not in every call


def static_inputs(graph_kind):
    """The positions of the parameters and buffers among a forward or inference graph's inputs, from
    AOTAutograd's metadata (None for a backward, whose inputs it does not describe, or where it is absent)."""
    if graph_kind not in ("forward", "inference"):
        return None
    context = torch._guards.TracingContext.try_get()
    indices = getattr(getattr(context, "fw_metadata", None), "static_input_indices", None)
    return tuple(indices) if indices is not None else None


def compile_graph(gm, example_inputs, cuda_graphs="auto", sink=None, graph_kind="forward", matmul_templates=None,
                  symbolic_sizes=False, statics=None):
    """One core-ATen graph -> a callable. `sink` (explain) observes each plan instead of building it;
    `matmul_templates` is brrr.compile's option (matmul/choice.py).

    A kernel that fails to generate or compile (and, later, on its first launch) gets the graph re-planned
    with its ops as ATen calls, up to MAX_REPLANS times; anything else that stops the graph from compiling
    raises GraphFallback, and the backend runs Dynamo's own graph instead."""
    from torch._functorch.aot_autograd import make_boxed_func

    from brrr.compile.matmul.fusion import epilogue_pass
    from brrr.compile.runtime import graph_cache
    from brrr.compile.runtime.compiled import build, generate_all
    from brrr.compile.runtime.host_copies import host_copies

    reason = graph_refusal(gm, planning_only=sink is not None)
    if reason == SYMBOLIC and symbolic_sizes:
        reason = None   # planned at symbolic sizes; CUDA graphs are then captured per shape (runtime/compiled.py)
    if reason:
        raise GraphFallback(reason)
    forced, split, wider, replans = {}, set(), set(), []
    if statics is None:   # read now: a re-plan may run after AOTAutograd's context has closed
        statics = static_inputs(graph_kind)

    def attempt():
        with sizes.planning(), sizes.recording_guards(example_inputs if symbolic_sizes else (), graph_kind, sink):
            return plan_and_build()

    def plan_and_build():
        cached = sink is None and graph_cache.enabled() and not symbolic_sizes
        if cached:
            prepare_graph(gm)   # keyed as planned: after the passes planning starts with
        key = graph_cache.key(gm, graph_kind, forced, split, {"matmul_templates": matmul_templates}, wider=wider) \
            if cached else None
        on_gpu = cuda_graphs if "cuda" in _devices(gm) else False
        compiled = graph_cache.load(key, gm, on_gpu) if key is not None else None
        if compiled is None:
            compiled = plan_fresh(on_gpu)
            if sink is not None:
                return compiled
            if key is not None:
                graph_cache.store(key, compiled, gm)
        for op, why in compiled.op_fallbacks:
            fallbacks.log("op", graph_kind, op, why)
            warn_once(f"{op} runs as ATen: {why}")
        compiled.static_inputs = statics
        compiled.host = host_copies(gm)
        compiled.replan = replan
        compiled.alternative, compiled.adopt = alternative, adopt
        compiled.forget = (lambda: graph_cache.forget(key)) if key is not None else None
        return compiled

    def plan_fresh(on_gpu):
        graph_cache.STATS["planned"] += 1
        if sink is None and "cuda" in _devices(gm):
            compile_workers.start()   # they import torch and Triton while this graph is planned
        try:
            plan = plan_graph(gm, forced, split, wider)
        except Exception as e:
            if debugging():
                raise
            raise GraphFallback(f"planning failed ({type(e).__name__}: {str(e)[:200]})") from e
        rewrite_kernels = epilogue_pass(matmul_templates)
        if sink is not None:
            sink.planned(graph_kind, gm, plan, generate_all(plan, graph_kind, rewrite_kernels))
            return make_boxed_func(gm)
        compiled, _ = build(plan, gm, cuda_graphs=on_gpu, kind=graph_kind, rewrite_kernels=rewrite_kernels)
        compiled.op_fallbacks = [(f"aten.{getattr(fx.target, '__name__', fx.target)}", str(why))
                                 for fx, why, scope in plan.lowering.fallbacks if scope == "op"]
        return compiled

    def alternative(force=(), split_at=(), widen=()):
        """The graph compiled again with the FX nodes `force` as ATen calls, the plan split at `split_at` and the
        reductions of `widen` across more programs (the floor's alternatives to a slow kernel,
        runtime/floor.py), or None where that cannot be built. The choices stand only once `adopt`ed."""
        before = dict(forced), set(split), set(wider)
        adopt(force, split_at, widen)
        try:
            return attempt()
        except (KernelFailed, GraphFallback) as e:
            if debugging():
                raise
            fallbacks.log("kernel", graph_kind, "floor alternative", f"{type(e).__name__}: {str(e)[:200]}")
            return None
        finally:
            forced.clear()
            forced.update(before[0])
            split.clear()
            split.update(before[1])
            wider.clear()
            wider.update(before[2])

    def adopt(force=(), split_at=(), widen=()):
        """Keep an alternative's choices: later plans (a re-plan after a failed kernel) start from them."""
        forced.update({fx: "measured: ATen ran faster than the kernel fusing it" for fx in force
                       if fx not in forced})
        split.update(split_at)
        wider.update(widen)

    def replan(failure):
        """Add `failure`'s ops to the forced ones and compile again; None when no re-plan is left or it
        would force nothing new."""
        new = {fx: str(failure) for fx in failure.fx_nodes if fx not in forced}
        if not new or len(replans) >= MAX_REPLANS:
            return None
        replans.append(failure)
        forced.update(new)
        fallbacks.log("kernel", graph_kind, failure.name, str(failure))
        warn_once(f"{failure}; its {len(new)} op(s) run as ATen, the rest of the graph stays compiled")
        try:
            return attempt()
        except KernelFailed as again:
            return replan(again)

    try:
        return attempt()
    except KernelFailed as failure:
        if debugging():
            raise
        compiled = replan(failure)
        if compiled is None:
            raise GraphFallback(f"{failure}, and re-planning without it did not help") from failure
        return compiled


def _dynamo_graph_fallback(reason, eager_forward, sink):
    """Dynamo's graph as captured: no decomposition, no AOTAutograd, eager's own ops at eager's speed."""
    fallbacks.log("graph", "dynamo", "graph", reason)
    if sink is not None:
        sink.fell_back("dynamo", reason)
    else:
        warn_once(reason)
    return eager_forward


def brrr_backend(gm, example_inputs, cuda_graphs="auto", _sink=None, matmul_templates=None, symbolic_sizes=None,
                 recompute=None, **options):
    """The Dynamo backend: AOTAutograd (core-ATen decompositions, min-cut partitioner) around compile_graph;
    plain graphs then run from brrr's lean runtime instead of AOTAutograd's wrappers (lean_autograd.py).
    A graph brrr cannot compile (GraphFallback) runs as Dynamo captured it: `gm.forward`, taken before any
    pass here changes the graph. A graph of symbolic sizes is compiled once, at those sizes (sizes.py), or, with
    `symbolic_sizes=False` or where that fails, once per shape (specialize.py)."""
    # bound now, and to real code: the passes below recompile gm, and a lazy GraphModule's forward (Dynamo's)
    # would run whatever they make of it (the captured trial ran the linear + cross-entropy rewrite as "eager")
    realize = getattr(gm, "real_recompile", None)
    if realize is not None:
        realize()
    eager_forward = gm.forward
    compile_workers.hash_triton_ahead()
    breaks = graph_breaks.note_graph(gm)
    if breaks and hasattr(_sink, "graph_breaks"):   # explain's sink lists them
        _sink.graph_breaks.extend(breaks)
    reason = graph_refusal(gm, example_inputs, planning_only=_sink is not None)
    if symbolic_sizes is None:
        symbolic_sizes = os.environ.get("BRRR_SYMBOLIC_SIZES", "1") != "0"
    if reason == SYMBOLIC and symbolic_sizes and (_sink is not None or device_refusal(gm, example_inputs) is None):
        # one compile at symbolic sizes (sizes.py); where brrr cannot plan it so, once per shape
        try:
            compiled = _compile_static(copy_graph_module(gm), example_inputs, eager_forward, cuda_graphs, _sink,
                                       matmul_templates, symbolic_sizes=True, recompute=recompute)
        except Exception as e:
            if debugging() or is_out_of_memory(e):
                raise
            fallbacks.log("graph", "dynamo", "symbolic sizes", f"{type(e).__name__}: {str(e)[:200]}")
            compiled = None
        if compiled is not None:
            return compiled if _sink is not None else _fastest(compiled, eager_forward, example_inputs, True,
                                                               cuda_graphs)
    if reason == SYMBOLIC and _sink is None and device_refusal(gm, example_inputs) is None:
        return _fastest(PerShape(gm, functools.partial(_compile_static, eager_forward=eager_forward,
                                                       cuda_graphs=cuda_graphs, matmul_templates=matmul_templates,
                                                       recompute=recompute),
                                 eager_forward), eager_forward, example_inputs, True, cuda_graphs)
    if reason:
        return _dynamo_graph_fallback(reason, eager_forward, _sink)
    compiled = _compile_static(gm, example_inputs, eager_forward, cuda_graphs, _sink, matmul_templates,
                               recompute=recompute)
    return compiled if _sink is not None else _fastest(compiled, eager_forward, example_inputs, False, cuda_graphs)


def _fastest(compiled, eager_forward, example_inputs, per_shape, cuda_graphs="auto"):
    """`compiled`, or where the floor times it against the graph as captured (runtime/captured_choice.py), the
    two behind one callable that keeps the faster (and with any cuda_graphs but "fastest", only where the
    captured calls' memory allows)."""
    from brrr.compile.runtime import captured_choice

    devices = {a.device.type for a in example_inputs if isinstance(a, torch.Tensor)}
    if compiled is eager_forward or not captured_choice.enabled(devices):
        return compiled
    return captured_choice.CompiledOrCaptured(compiled, eager_forward, per_shape,
                                              memory_bound=cuda_graphs != "fastest")


def _with_layouts(partition):
    """`partition` after the layout pass over AOTAutograd's joint graph: the forward and its backward share the
    layouts, and what the forward saves is saved in them."""
    def partition_with_layouts(joint_module, joint_inputs, **kwargs):
        return partition(layouts.choose(joint_module, "training"), joint_inputs, **kwargs)
    return partition_with_layouts


def _compile_static(gm, example_inputs, eager_forward, cuda_graphs="auto", _sink=None, matmul_templates=None,
                    symbolic_sizes=False, recompute=None):
    """brrr_backend for a graph of concrete sizes; `symbolic_sizes`: for one of symbolic sizes, planned at them, or
    None where brrr cannot (the caller then compiles it per shape)."""
    from torch._dynamo.backends.common import aot_autograd

    from brrr.compile.runtime import aot_cache, graph_cache
    from brrr.compile.runtime.compiled import CompiledGraph
    from brrr.compile.runtime.lean_autograd import GraphCapture, lean_backward_patch, lean_callable_of

    capture = GraphCapture()
    compiling = [True]   # a backward compiled lazily, after the backend returned, cannot fall back to Dynamo

    def compiler(kind):
        def compile_kind(g, inputs):
            if kind == "inference":   # a training graph's layouts were chosen on its joint graph (partition)
                g = layouts.choose(g, "inference")
            try:
                compiled = compile_graph(g, inputs, cuda_graphs=cuda_graphs, sink=_sink, graph_kind=kind,
                                         matmul_templates=matmul_templates, symbolic_sizes=symbolic_sizes)
            except GraphFallback as e:
                if compiling[0]:
                    raise
                fallbacks.log("graph", kind, "graph", str(e))
                warn_once(f"{e}; this {kind} graph runs as ATen")
                from torch._functorch.aot_autograd import make_boxed_func
                compiled = make_boxed_func(g)
            capture.saw(kind, g, compiled)
            return compiled
        return compile_kind

    try:
        rewrites = fuse_linear_cross_entropy(gm)
    except Exception as e:   # an optimization only: the graph stays as Dynamo gave it
        recover(e, "linear + cross-entropy pass failed", "graph left as is")
    else:
        if rewrites and hasattr(_sink, "linear_losses"):   # explain's sink lists them; other sinks need not
            _sink.linear_losses.extend(rewrites)
    # The attention kernel (cuDNN, flash, memory-efficient or math) is chosen while AOTAutograd traces, by
    # torch's own priority: give broadcast masks a layout the fused kernels accept first.
    try:
        contiguous_attention_masks(gm)
    except Exception as e:   # an optimization only: the graph stays as Dynamo gave it
        recover(e, "attention mask pass failed", "graph left as is")
    # the backward compiles with the forward, so its failures fall back here too; BRRR_AOT_RUNTIME=1 keeps
    # AOTAutograd's runtime for every graph (to compare the two)
    patch = lean_backward_patch()
    lean = _sink is None and os.environ.get("BRRR_AOT_RUNTIME") != "1"
    kept = aot_cache.key(gm, example_inputs, {"matmul_templates": matmul_templates, "recompute": recompute}) \
        if lean and patch is not None and not symbolic_sizes and graph_cache.enabled() else None
    if kept is not None:
        compiled = _from_aot_cache(kept, example_inputs, cuda_graphs, matmul_templates)
        if compiled is not None:
            return compiled
    # built on a miss only: the decomposition table alone costs a warm start ~0.2 s
    backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                           inference_compiler=compiler("inference"), decompositions=decomposition_table(),
                           partition_fn=_with_layouts(partition_fn(recompute)))
    try:
        with patch or contextlib.nullcontext():
            compiled = backend(gm, example_inputs)
    except GraphFallback as e:
        if symbolic_sizes:
            fallbacks.log("graph", "dynamo", "symbolic sizes", str(e))
            return None
        return _dynamo_graph_fallback(str(e), eager_forward, _sink)
    finally:
        compiling[0] = False
    if _sink is not None and hasattr(_sink, "runtimes"):   # explain: which runtime a real compile would take
        from brrr.compile.runtime.lean_autograd import plain_reason

        why = plain_reason(capture, example_inputs) if patch is not None else \
            "this torch cannot compile the backward with the forward"
        _sink.runtimes.append(("inference" if capture.inference is not None else "training", why))
    if not lean or patch is None:
        return compiled
    try:
        spec = capture.lean_spec(example_inputs)
        if spec is None:
            return compiled
        first = capture.inference or capture.forward
        run = lean_callable_of(spec, first[1], first[0], capture.backward[1] if capture.backward else None)
    except Exception as e:
        recover(e, "the lean runtime could not wrap this graph", "using AOTAutograd's runtime")
        return compiled
    captured = {kind: getattr(capture, kind) for kind in ("inference", "forward", "backward")
                if getattr(capture, kind) is not None}
    if kept is not None and all(isinstance(c, CompiledGraph) for _, c in captured.values()):
        aot_cache.store(kept, spec, {kind: g for kind, (g, _) in captured.items()}, first[1].static_inputs)
    return run


def _from_aot_cache(key, example_inputs, cuda_graphs, matmul_templates):
    """The lean runtime over the graphs AOTAutograd made for this Dynamo graph before (aot_cache.py), each compiled
    through `compile_graph` (whose graph cache serves its plan), or None where none is kept or one cannot compile."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from brrr.compile.runtime import aot_cache
    from brrr.compile.runtime.lean_autograd import lean_callable_of

    found = aot_cache.load(key, torch._guards.detect_fake_mode(example_inputs) or FakeTensorMode())
    if found is None:
        return None
    spec, graphs, statics = found
    first = "inference" if spec.kind == "inference" else "forward"
    try:
        compiled = compile_graph(graphs[first], [], cuda_graphs=cuda_graphs, graph_kind=first,
                                 matmul_templates=matmul_templates, statics=statics)
        backward = compile_graph(graphs["backward"], [], cuda_graphs=cuda_graphs, graph_kind="backward",
                                 matmul_templates=matmul_templates) if spec.kind == "training" else None
    except GraphFallback as e:
        fallbacks.log("graph", first, "kept AOTAutograd graphs", str(e))
        aot_cache.forget(key)
        return None
    return lean_callable_of(spec, compiled, graphs[first], backward)


def make_backend(**options):
    compile_workers.hash_triton_ahead()   # overlaps Dynamo's tracing
    fn = functools.partial(brrr_backend, **options)
    fn.__name__ = "brrr"
    return fn


CUDA_GRAPHS = ("auto", "fastest", True, False)


def compile(model, **options):
    """torch.compile(model, backend=brrr with `options`). cuda_graphs: "auto" (default: each graph replays from
    a CUDA graph when timing shows that is faster and its peak memory grows by 10% at most, replay_choice.py),
    "fastest" (when faster, whatever the memory), True (always, once its inputs allow) or False (never).
    matmul_templates: "off", "always" or "auto" (matmul/choice.py; default: BRRR_MATMUL_TEMPLATES, off when unset):
    whether a matmul and its epilogue run as one brrr kernel. symbolic_sizes: True (default;
    BRRR_SYMBOLIC_SIZES=0 turns it off) plans a graph Dynamo captures with symbolic sizes once, at those sizes
    (sizes.py); False compiles it once per shape (specialize.py). recompute: "cheap" (default) or "pointwise"
    (partition.py): which values a training graph's backward recomputes instead of the forward saving them."""
    from brrr.compile.matmul.choice import MODES

    unknown = set(options) - {"cuda_graphs", "matmul_templates", "symbolic_sizes", "recompute"}
    if unknown:
        raise TypeError(f"unknown brrr.compile options: {sorted(unknown)}")
    if options.get("cuda_graphs", "auto") not in CUDA_GRAPHS:
        raise ValueError(f"cuda_graphs={options['cuda_graphs']!r}: choose \"auto\", \"fastest\", True or False")
    if options.get("matmul_templates") not in MODES + (None,):
        raise ValueError(f"matmul_templates={options['matmul_templates']!r}: choose one of {MODES}")
    partition_fn(options.get("recompute"))   # raises on an unknown choice now, not at the first call
    return torch.compile(model, backend=make_backend(**options))
