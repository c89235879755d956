"""The lean runtime around compiled graphs (capture -> lower -> schedule -> codegen -> **runtime**).

AOTAutograd returns its compiled forward and backward wrapped in runtime code that handles every case it
supports: input mutations, outputs that alias inputs or each other, tensor subclasses, functionalized RNG,
effect tokens, symbolic sizes saved for the backward. Most graphs need none of it, yet every call pays for
it: on the H100 host, torch 2.11's wrappers cost a one-layer train step ~300 us of Python before the first
kernel, more than the seed MLP's whole backward on the device.

When AOTAutograd's own metadata says a graph is *plain* (`plain_reason` returns None), brrr calls its
compiled graphs directly: inference graphs as they are, training graphs from one `autograd.Function` that
saves what the forward graph returns for the backward graph. Plain includes inputs whose data the graph
updates and that need no gradient (batch norm's running statistics in training): the graph returns their new
values first, and they are written back after the call (write_back.py), where AOTAutograd's wrapper makes one
`copy_` per buffer (densenet121: 363 launches a step). A CompiledGraph writes them back itself (`write_back`),
so that a CUDA-graph replay makes those copies inside the graph, at no host cost. Anything else keeps
AOTAutograd's runtime, which stays correct for every case. The backward graph is compiled with the forward
(`force_non_lazy_backward_lowering`), so both are in hand when the backend returns.

A call on fake tensors only propagates metadata (Dynamo's DDPOptimizer runs each bucket's compiled graph once
that way, to get the next bucket's example inputs; AOTAutograd's runtime answers it from the traced outputs):
under an active fake mode, it runs the captured FX graph, never brrr's kernels.
"""

import contextlib
import threading
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor

from brrr.compile.runtime.compiled import CompiledGraph, layout
from brrr.compile.runtime.cuda_graphs import Loan
from brrr.compile.runtime.write_back import write_back

# A FakeTensor stands in for a plain tensor: Dynamo's DDPOptimizer compiles each bucket's graph on fake inputs
# (a fake tensor subclass such as DTensor keeps its own type and stays out).
PLAIN_INPUT_TYPES = (torch.Tensor, torch.nn.Parameter, FakeTensor, int, float, bool)


def lean_backward_patch():
    """A context in which AOTAutograd compiles the backward with the forward (None where torch lacks it)."""
    config = torch._functorch.config
    if not hasattr(config, "force_non_lazy_backward_lowering"):
        return None
    return config.patch(force_non_lazy_backward_lowering=True)


class GraphCapture:
    """What the compilers saw while AOTAutograd ran: the graphs, brrr's compiled callables, the metadata."""

    def __init__(self):
        self.forward = self.backward = self.inference = None   # (fx graph, compiled callable)
        self.meta = None

    def saw(self, kind, gm, compiled):
        setattr(self, kind, (gm, compiled))
        if kind != "backward":
            context = torch._guards.TracingContext.try_get()
            self.meta = getattr(context, "fw_metadata", None)

    def lean_spec(self, example_inputs):
        """What brrr's runtime needs of AOTAutograd's metadata (LeanSpec), or None when its runtime must stay."""
        if plain_reason(self, example_inputs) is not None:
            return None
        meta = self.meta
        if self.inference is not None:
            return LeanSpec("inference", _unsafe_view_outputs(meta), _mutated_inputs(meta))
        n_out = meta.num_forward_returns
        n_saved = len(_outputs(self.forward[0])) - n_out
        return LeanSpec(
            "training", _unsafe_view_outputs(meta), _mutated_inputs(meta), n_out,
            tuple(i for i, o in enumerate(meta.output_info) if not o.requires_grad),
            tuple(i for i, o in enumerate(meta.output_info) if o.requires_grad), n_saved,
            tuple(tuple(p.meta["val"].stride()) for p in _placeholders(self.backward[0])[n_saved:]))


@dataclass(frozen=True)
class LeanSpec:
    """All brrr's runtime reads of AOTAutograd's metadata, in plain values (the captured-graph cache keeps it):
    the outputs to regenerate (views of intermediates), the inputs the graph updates, and for training the
    forward's user outputs, which need no gradient and which do, how many tensors it saves, and the strides the
    backward's tangents were traced with."""
    kind: str                   # "inference" | "training"
    unsafe_views: tuple
    mutated: tuple
    n_out: int = 0
    non_diff: tuple = ()
    diff: tuple = ()
    n_saved: int = 0
    tangent_strides: tuple = ()


def lean_callable_of(spec, compiled, gm, backward=None):
    """brrr's runtime for a forward or inference graph `gm` compiled as `compiled` (and a training graph's
    compiled `backward`), as `spec` describes them."""
    if spec.kind == "inference":
        return _inference_callable(gm, compiled, spec.unsafe_views, spec.mutated)
    return _training_callable(spec, gm, compiled, backward)


def _outputs(gm):
    return next(n for n in gm.graph.nodes if n.op == "output").args[0]


def _placeholders(gm):
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def plain_reason(capture, example_inputs):
    """Why these graphs need AOTAutograd's runtime, or None when brrr can call them directly."""
    from torch._functorch._aot_autograd.schemas import OutputType

    meta = capture.meta
    if meta is None:
        return "no AOTAutograd metadata"
    if not all(type(x) in PLAIN_INPUT_TYPES for x in example_inputs):
        return "an input is a tensor subclass or not a tensor"
    reason = _mutation_reason(meta)
    if reason is not None:
        return reason
    if any(o.output_type not in (OutputType.non_alias, OutputType.unsafe_view_alias) for o in meta.output_info):
        return "an output aliases an input or another output"
    if meta.num_intermediate_bases or getattr(meta, "tokens", None) or getattr(meta, "is_rng_op_functionalized",
                                                                                  False):
        return "intermediate bases, effect tokens or functionalized RNG"
    for name in ("num_symints_saved_for_bw", "num_tensors_saved_with_no_vc_check",
                 "num_opaque_objects_saved_for_bw"):
        if getattr(meta, name, None):
            return f"{name} = {getattr(meta, name)}"
    graph = (capture.inference or capture.forward or (None,))[0]
    if graph is None or len(_placeholders(graph)) != len(example_inputs):
        return "the compiled graph's inputs differ from the captured ones (deduplicated or lifted)"
    if meta.num_forward_returns != len(_mutated_inputs(meta)) + len(meta.output_info):
        return "the graph returns more than the user's outputs and its updated inputs"
    if capture.inference is not None:
        return None
    if capture.backward is None:
        return "no backward graph compiled with the forward"
    return _training_shape_reason(capture, meta)


def _mutated_inputs(meta):
    """Positions of the inputs whose new values the graph returns first (AOTAutograd applies them after it)."""
    return tuple(getattr(meta, "mutated_inp_runtime_indices", ()))


def _mutation_reason(meta):
    """Why the graph's input mutations need AOTAutograd's runtime, or None: data updates of inputs that need no
    gradient, applied after the graph, are brrr's to write back."""
    written_back = set(_mutated_inputs(meta))
    for i, info in enumerate(meta.input_info):
        if not (info.mutates_data or info.mutates_metadata):
            continue
        if info.mutates_metadata or getattr(info, "mutates_storage_metadata", False):
            return "the graph changes an input's sizes, strides or storage"
        if info.requires_grad:
            return "the graph updates an input that requires grad"
        if i not in written_back:
            return "the graph updates an input inside itself"
    if getattr(meta, "mutated_inp_stream_indices", None) and any(
            x is not None for x in meta.mutated_inp_stream_indices):
        return "an input is updated on a stream of the user's"
    return None


def _write_back(args, mutated, new_values):
    """The graph's updated inputs written into the caller's tensors (for a call that does not write them itself,
    `_writes_back`)."""
    if mutated and len(new_values):
        write_back([args[i] for i in mutated], list(new_values))


def _writes_back(call, mutated):
    """Have `call` write the inputs it updates back itself, where it can (a CompiledGraph); whether it will."""
    if mutated and isinstance(call, CompiledGraph):
        call.write_back = tuple(enumerate(mutated))
        return True
    return False


def _training_shape_reason(capture, meta):
    fw, bw = capture.forward[0], capture.backward[0]
    n_saved = len(_outputs(fw)) - meta.num_forward_returns
    bw_inputs = _placeholders(bw)
    n_tangents = sum(1 for o in meta.output_info if o.requires_grad)
    if len(bw_inputs) != n_saved + n_tangents or not all(p.name.startswith("tangents") for p in bw_inputs[n_saved:]):
        return "the backward's inputs are not the saved tensors and one tangent per differentiable output"
    if not all(isinstance(p.meta.get("val"), torch.Tensor) for p in bw_inputs):
        return "the backward reads something other than tensors"
    if len(_outputs(bw)) != len(_placeholders(fw)):
        return "the backward does not return one gradient per input"
    return None


def _unsafe_view_outputs(meta):
    from torch._functorch._aot_autograd.schemas import OutputType

    return tuple(i for i, o in enumerate(meta.output_info) if o.output_type is OutputType.unsafe_view_alias)


def _regenerate(outs, unsafe_views):
    """Outputs that are views of the graph's intermediates become plain tensors, as AOTAutograd makes them,
    so autograd never treats them as views of memory the caller cannot see."""
    if not unsafe_views:
        return outs
    outs = list(outs)
    for i in unsafe_views:
        outs[i] = torch.ops.aten._unsafe_view(outs[i], outs[i].shape)
    return outs


def _amp_guard():
    """The graph already holds autocast's casts: run it with autocast off, as AOTAutograd does."""
    return torch._C._DisableAutocast() if torch._C._is_any_autocast_enabled() else contextlib.nullcontext()


_FAKE_MODE = torch._C._TorchDispatchModeKey.FAKE


def _fake():
    """Whether this call only propagates metadata: a fake mode is active (one C call; scanning the arguments for
    fake tensors cost ~17 us per call at 200 of them)."""
    return torch._C._get_dispatch_mode(_FAKE_MODE) is not None


def _inference_callable(gm, compiled, unsafe_views, mutated=()):
    n_mut = len(mutated)
    written = _writes_back(compiled, mutated)
    if not n_mut:
        def run(*args):
            with _amp_guard():
                outs = gm(*args) if _fake() else compiled(list(args))
                return tuple(_regenerate(outs, unsafe_views))
    else:
        def run(*args):
            with _amp_guard():
                if _fake():   # metadata only: a data update changes no input's metadata
                    return tuple(_regenerate(gm(*args)[n_mut:], unsafe_views))
                outs = compiled(list(args))
                if not written:
                    _write_back(args, mutated, outs[:n_mut])
                return tuple(_regenerate(outs[n_mut:], unsafe_views))

    run._brrr_lean = "inference"
    return run


def _copy_kept_gradients(bw_call, args):
    """A backward replay gives its gradients out as the graph's memory (cuda_graphs.Given), which its next replay,
    or its forward's, overwrites. Where an input's .grad still holds one (gradients accumulated over several
    steps), that .grad becomes a copy now, so the graphs can replay. The backward's output i is input i's
    gradient."""
    graphed = bw_call.graphed
    if graphed is None or not graphed.given:
        return
    for gift in graphed.held_gifts():
        a = args[gift.position] if gift.position < len(args) else None
        if isinstance(a, torch.Tensor) and a.is_leaf and a.grad is not None \
                and a.grad.untyped_storage().data_ptr() == gift.data_ptr:
            a.grad = a.grad.clone(memory_format=torch.preserve_format)


def _training_callable(spec, fw_gm, fw_call, bw_call):
    n_out, non_diff, diff, n_saved = spec.n_out, spec.non_diff, spec.diff, spec.n_saved
    tangent_strides, unsafe_views, mutated = spec.tangent_strides, spec.unsafe_views, spec.mutated
    n_mut = len(mutated)
    written = _writes_back(fw_call, mutated)
    updates = threading.local()   # the forward's new values of updated inputs, written back after autograd's call
    lending = isinstance(fw_call, CompiledGraph) and isinstance(bw_call, CompiledGraph)
    if isinstance(bw_call, CompiledGraph):
        bw_call.owns_inputs = True   # backward() below hands the saved tensors over
    if lending:
        # with CUDA graphs, a forward replay lends the saved tensors uncopied and the backward reads them there
        fw_call.lend = tuple(range(n_out, n_out + n_saved))
        bw_call.pin = tuple(range(n_saved))
        bw_call.lender = fw_call
        bw_call.give = True   # the gradients: the graph's memory, not copies (cuda_graphs.Given)

    class LeanCompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            fake = _fake()
            with _amp_guard():
                outs = fw_gm(*args) if fake else fw_call(list(args))
            saved = outs[n_out:]
            if lending and not fake:   # the backward replays the CUDA graph that follows this call's
                ctx.recording = fw_call.graphed
            if not fake and getattr(fw_call, "lent", False):
                # the graph's own memory: the replay that would overwrite it copies it first, if this
                # backward may still run then (autograd frees the marker once it no longer can)
                marker = torch.empty(0)
                ctx.loan = Loan(saved, marker)
                fw_call.track(ctx.loan)
                ctx.save_for_backward(marker)
            else:
                # a saved view would keep its base's autograd history alive; the backward needs only values
                ctx.save_for_backward(*[t.detach() if t._is_view() else t for t in saved])
            updates.values = () if fake or written else outs[:n_mut]
            user = _regenerate(outs[n_mut:n_out], unsafe_views)
            if non_diff:
                ctx.mark_non_differentiable(*[user[i] for i in non_diff if isinstance(user[i], torch.Tensor)])
            ctx._materialize_non_diff_grads = False
            return tuple(user)

        @staticmethod
        def backward(ctx, *grads):
            if torch.is_grad_enabled():
                raise RuntimeError("brrr: double backward (create_graph=True) through a compiled graph is not "
                                   "supported; compile only the first derivative, or run this model eagerly")
            tangents = [layout(grads[i], s) for i, s in zip(diff, tangent_strides)]
            # unpacked either way: a second backward after autograd freed this node raises here, as in eager
            saved = list(ctx.saved_tensors)
            # autograd holds the saved tensors until this returns unless they are released here (as AOTAutograd
            # does; kept where the graph is retained): then the list handed over is their last holder, and the
            # call frees each at its last use (Qwen2-0.5B training: ~0.5 GB of peak)
            release = getattr(ctx, "maybe_clear_saved_tensors", None)
            loan = getattr(ctx, "loan", None)
            if loan is not None:
                del saved   # the loan's marker: released, it tells whether the graph is retained
                if release is not None:
                    release()
                kept = release is None or loan.marker() is not None
                # handed over unless another backward reads them again; a replay lent them in the graph's pool
                saved = list(loan.tensors) if kept else loan.take()
                bw_call.saved_kept = kept
            elif release is not None:
                release()
            if lending:
                bw_call.pinned_ready = loan is not None and not loan.copied
                bw_call.lent_from = getattr(ctx, "recording", None)
            args = saved + tangents
            del saved, tangents, loan
            with _amp_guard():
                return tuple(bw_call(args))

    if not n_mut:
        def run(*args):
            if lending:
                _copy_kept_gradients(bw_call, args)
            return LeanCompiledFunction.apply(*args)
    else:
        def run(*args):
            if lending:
                _copy_kept_gradients(bw_call, args)
            out = LeanCompiledFunction.apply(*args)
            _write_back(args, mutated, updates.values)   # outside the Function, as AOTAutograd does
            updates.values = ()
            return out

    run._brrr_lean = "training"
    return run
