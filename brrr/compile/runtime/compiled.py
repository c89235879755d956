"""The compiled callable (codegen -> **runtime**): generated Python with every launch written out.

`build(plan, gm, options)` generates each kernel's Triton module, loads them from the on-disk cache (cache.py),
compiling missing ones in a thread pool, and writes one Python function `call(args)` that allocates buffers,
launches kernels with literal grids and calls ATen for Externs/Fallbacks/views - nothing interprets IR at call
time. If anything brrr made fails on the first call, the graph reruns as ATen (its FX module) with one warning.

Passes over the generated kernels that belong to other stages come in as `rewrite_kernels`, a hook the backend
passes (matmul epilogue fusion: brrr.compile.matmul.fusion), so the runtime imports nothing of theirs.
"""

import ast
import concurrent.futures
import os
import weakref
from collections import Counter
from dataclasses import dataclass

import torch

from brrr.compile import fallbacks
from brrr.compile.cache import device_name
from brrr.compile.codegen.triton import generate
from brrr.compile.fallbacks import KernelFailed, debugging, is_out_of_memory, recover, warn_once
from brrr.compile.ir import nodes as ir, sizes
from brrr.compile.runtime import among_ranks, floor, handed_over, kernel_registry
from brrr.compile.runtime.compile_workers import usable_cpus
from brrr.compile.runtime.cuda_graphs import GraphedCall, data_ptrs
from brrr.compile.runtime.launch import Launcher, load_binary, tma_descriptor, warm_all
from brrr.compile.runtime.recordings import Recordings
from brrr.compile.runtime.replay_choice import ReplayTrial
from brrr.compile.runtime.write_back import write_back
from brrr.compile.scheduling.inplace import reused_memory
from brrr.compile.scheduling.naming import function_name

def kernel_fx_nodes(kernel, rendered=()):
    """The FX nodes whose values `kernel` computes: its roots and every node rendered inside it."""
    nodes = list(kernel.roots) + list(rendered)
    return tuple(dict.fromkeys(n.fx for n in nodes if n.fx is not None and n.fx.op == "call_function"))


def generate_all(plan, graph_kind="graph", rewrite_kernels=None):
    """KernelSource per kernel step (reverse order, so a reduction read by a later kernel is stored). Every
    stored node's strides were fixed by the scheduler (scheduling/layout.py). Each kernel takes a name unique in
    the process and is registered with its FLOPs, bytes, ATen ops and modules (kernel_registry.py), for as long
    as the graph lives. Each launches a Triton function named after its source (naming.function_name): kernels
    of one source (a repeated layer's, or one a re-plan left as it was) are one function, compiled once.
    `rewrite_kernels(plan, kernels)`, where given, rewrites the plan's steps and kernels in place before they are
    registered (the backend passes matmul epilogue fusion)."""
    stored = set(plan.stored)
    kernel_of = {r: k for kind, k in plan.steps if kind == "kernel" for r in k.roots}
    out = {}
    for kind, k in reversed(plan.steps):
        if kind != "kernel":
            continue
        load_stored = {n for n in stored if n.kind == "pointwise" and kernel_of.get(n) is not k}
        try:
            src, refs = generate(k, stored, load_stored, kernel_of)
            devices = {str(_device_of(a)) for a in src.args}
            if len(devices) > 1:   # e.g. a CPU scalar tensor read by a CUDA kernel: its ops run as ATen
                raise NotImplementedError(f"kernel {k.name} reads tensors on several devices {sorted(devices)}")
        except Exception as e:
            if debugging() or is_out_of_memory(e):
                raise
            raise KernelFailed(k.name, "generate", e, kernel_fx_nodes(k, getattr(e, "brrr_rendered", ()))) from e
        function = function_name(src.name, floor.source_digest(src.source, src.name))
        src.function, src.source = kernel_registry.claim(function, kernel_registry.renamed(src.source, src.name,
                                                                                            function))
        out[k] = src
        stored |= refs
    plan.stored = stored
    if rewrite_kernels is not None:
        rewrite_kernels(plan, out)
    register_kernels(plan, out, graph_kind)
    return out


def register_kernels(plan, kernels, kind):
    """Price every kernel of the plan (pricing.py) and record it under its name (kernel_registry.py)."""
    from brrr.compile.scheduling.pricing import fx_flops, graph_shares, kernel_work

    gm = plan.lowering.gm
    totals = graph_shares([tuple(src.nodes) + tuple(k.roots) for k, src in kernels.items()])
    position = {fx: i for i, fx in enumerate(gm.graph.nodes)} if gm is not None else {}
    flops = {}

    def flops_of(fx):
        if fx not in flops:
            flops[fx] = fx_flops(fx)
        return flops[fx]

    for k, src in kernels.items():
        work = kernel_work(k, src, totals, flops_of, position)
        src.work = work
        if gm is not None:
            kernel_registry.register(kernel_registry.KernelMeta.of(work, src.function, kind), src.source, gm)


_aten = torch.ops.aten
# view ops whose Tensor method takes the same positional arguments (`_unsafe_view` as reshape: a view where
# the layout allows, else a copy; never a wrong value)
VIEW_METHODS = {
    _aten.view.default: "view", _aten._unsafe_view.default: "reshape", _aten.reshape.default: "reshape",
    _aten.permute.default: "permute", _aten.expand.default: "expand", _aten.unsqueeze.default: "unsqueeze",
    _aten.squeeze.dim: "squeeze", _aten.t.default: "t", _aten.transpose.int: "transpose",
    _aten.select.int: "select", _aten.as_strided.default: "as_strided",
}


class CompiledGraph:
    """Calls the generated `call`; on the first call, any failure reruns the graph as ATen (once, warned).
    Boxed calling convention (AOTAutograd passes one list of arguments)."""

    def __init__(self, call, gm, source, cuda_graphs=False, device=None, kind="graph", shape_key=None):
        self._boxed_call = True   # in the instance dict: wrappers (functools.wraps) copy it
        self.call, self.gm, self.source, self.kind = call, gm, source, kind
        self.replan = None        # KernelFailed -> a CompiledGraph without that kernel, or None (backend sets it)
        self.alternative = self.adopt = None   # the floor's other forms of this graph (backend sets them)
        self.kernel_choices = []  # floor.KernelChoice per generated kernel
        self.op_fallbacks = []    # (op, why) for each op the plan left to ATen
        self.forget = None        # drops this graph's entry in the graph cache (graph_cache.py), where it has one
        self.verified = False
        self.cuda_graphs = cuda_graphs
        self.device = device  # CUDA index: allocations and launches go to the current device, made this one
        self.lend = ()        # output positions a replay may return uncopied (see cuda_graphs.Loan)
        self.give = False     # whether a replay gives its other outputs out as its memory (cuda_graphs.Given)
        self.lent = False     # whether the last call's outputs at those positions are the graph's own memory
        self.pin, self.pinned_ready = (), True   # inputs lent by another graph, and whether they still are
        self.saved_kept = False   # whether those inputs are kept for another backward (retain_graph)
        self.lender = None    # that graph (a backward's forward): with "auto", its trial leads this one's
        self.lent_from = None   # the lender's GraphedCall this call's saved tensors came through (set per call)
        # the caller hands its list of inputs over (a backward's saved tensors): a launched call empties it, so
        # each input's memory goes back at its last use; a first call, a trial or a replay keeps them
        self.owns_inputs = False
        self.static_inputs = None   # positions of the parameters and buffers among the inputs, where known
        self.host = None   # host_copies.HostCopies: host inputs a replay stages on the device, or why none can run
        # (output position, input position) per input the graph updates: the output is its new value, which the
        # call writes into the input (set by the lean runtime; AOTAutograd's runtime writes back itself)
        self.write_back = ()
        # A graph planned at symbolic sizes: `shape_key(args)` is the call's sizes. A CUDA graph replays the sizes
        # it captured and reads parameters where they were, so each shape and each place of the parameters gets
        # its own graph and trial (recordings.py)
        self.shape_key = shape_key
        self.recordings = Recordings(shape_key)

    @property
    def graphed(self):
        """The current call's GraphedCall (once verified, with cuda_graphs), or None: it launches."""
        return self.recordings.current.graphed

    @property
    def trial(self):
        """With cuda_graphs "auto" or "fastest": the ReplayTrial deciding on `graphed`, until it has."""
        return self.recordings.current.trial

    @property
    def shape(self):
        return self.recordings.key[0] if self.recordings.key is not None else None

    def __call__(self, *args):
        args = args[0] if len(args) == 1 and isinstance(args[0], list) else list(args)
        if self.device is not None and torch._C._cuda_getDevice() != self.device:
            with torch.cuda.device(self.device):
                return self._written_back(args, self._run(args))
        return self._written_back(args, self._run(args))

    def _written_back(self, args, out):
        """The inputs the graph updates (`write_back`), written from their new values; a replay that wrote them
        inside its graph returned the inputs themselves at those positions."""
        pending = [(args[j], out[i]) for i, j in self.write_back if out[i] is not args[j]]
        if pending:
            targets, values = zip(*pending)
            write_back(targets, values)
        return out

    def track(self, loan):
        """Keep `loan` (the lent outputs of the last call) safe from the next replay."""
        if self.lent and self.graphed is not None:   # a graph dropped after this replay never overwrites it
            self.graphed.track(loan)

    def _run(self, args):
        self.lent = False
        if self.verified:
            recordings = self.recordings
            if recordings.keyed and self.cuda_graphs:
                key = recordings.key_of(args, self.lent_from)
                if key != recordings.key and self._switch(key, args):
                    return self.call(args)   # a new key's first call launches; its graph captures on the next
            if self.trial is not None:
                return self._run_trial(args)
            graphed = self.graphed
            if graphed is not None:
                graphed.pinned_ready, graphed.saved_kept = self.pinned_ready, self.saved_kept
                out = graphed(args)
                if out is not None:
                    self.lent = bool(graphed.lend)
                    return out
                if not graphed.usable:
                    self._drop_graph()
            return self.call(args, True) if self.owns_inputs else self.call(args)
        # what a CUDA graph needs of these args, read before the call may free them (owns_inputs)
        if self.cuda_graphs:
            static = [i for i in self.static_inputs or () if i < len(args) and isinstance(args[i], torch.Tensor)]
            self.recordings = Recordings(self.shape_key, static, backward=self.lender is not None)
            key = self.recordings.key_of(args, self.lent_from)
        ptrs = data_ptrs(args) if self.cuda_graphs else None
        out = self._first_call(args)
        self.verified = True
        if self.cuda_graphs and self.call != self._aten_call and self.recordings.select(key):   # bound methods:
            self._new_graph(args, ptrs)                                                          # never identical
        return out

    def _new_graph(self, args, first_ptrs=None):
        """A CUDA graph for these args (or, where the call freed them, their addresses `first_ptrs`), at the
        current key (captured on its next call) and, with "auto", its trial."""
        pool, lent_from = self.recordings.pool(), self.lent_from if self.lender is not None else None
        graphed = GraphedCall(self.call, args, self.lend, self.pin, pool=pool,
                              after=lent_from if pool is None else None, static=self.static_inputs,
                              give=self.give, host=self.host, first_ptrs=first_ptrs, consume=self.owns_inputs,
                              write_back=self.write_back, placed=bool(self.recordings.static))
        trial = None
        if self.cuda_graphs in ("auto", "fastest"):
            leader = self.lender.recordings.trial_of(lent_from) if lent_from is not None else None
            label = among_ranks.signature(self.kind, self.source, self.shape) \
                if leader is None and among_ranks.process_group() is not None else None
            trial = ReplayTrial(self.kind, leader=leader, sizes=self.shape, label=label,
                                memory_bound=self.cuda_graphs == "auto", owner=self,
                                release=_weak_call(self._drop_graph, self.recordings.key))
        self.recordings.keep(graphed, trial)

    def _switch(self, key, args):
        """Make `key`'s CUDA graph and trial the current ones; True when the key is new here (this call then
        launches, as a graph's first call does). Past the recordings' limits, a new one launches always."""
        if not self.recordings.select(key) or self.call == self._aten_call:
            return False
        self._new_graph(args)
        return True

    def _run_trial(self, args):
        """A call while cuda_graphs="auto" times launching against replaying (replay_choice.py)."""
        trial, graphed = self.trial, self.graphed
        if trial.replay is not None:   # decided by its forward, during that graph's call
            self._settle_trial(trial)
            return self._run(args)
        if torch.cuda.is_current_stream_capturing():   # inside the caller's own capture: just launch
            return self.call(args)
        graphed.pinned_ready, graphed.saved_kept = self.pinned_ready, self.saved_kept
        # a launched call frees what it is handed at its last use, as outside the trial: held to the end, a
        # ResNet-18 training step's trial peaked at 1119 MiB against 932 (benchmarks/NOTES.md)
        launch = self._owned_call if self.owns_inputs else self.call
        out, replayed = trial.run(launch, graphed, args)
        self.lent = replayed and bool(graphed.lend)
        if trial.replay is not None:
            self._settle_trial(trial)
        return out

    def _settle_trial(self, trial):
        self.recordings.current.trial = None
        if not trial.replay:
            self._drop_graph()

    def _owned_call(self, args):
        return self.call(args, True)

    def _drop_graph(self, key=None):
        """Launch from now on at `key` (the current call's by default): the CUDA graph, its static inputs and
        outputs, go once no loan holds them. Kept, a graph a trial turned down held its outputs (a training
        forward's saved tensors) while the same key launched beside it."""
        self.recordings.drop(self.recordings.key if key is None else key)

    def _first_call(self, args):
        """The first call checks what brrr made. A kernel that fails to compile or launch has the graph
        re-planned with its ops as ATen calls (`replan`, bounded by the re-plans left); any other failure of
        brrr's, or running out of re-plans, runs the graph's own FX module. The graph never writes into its
        inputs, so a call that failed half-way can simply run again. On a GPU the checked kernels are then
        measured against their rooflines (floor.py), without the checking call's outputs held; where their
        verdicts are cached, they are applied and the checking call's outputs returned. A backward that owns its
        inputs and is measured so keeps them on the host (handed_over.py), and each of these runs frees a fresh
        copy at its last use, as every later call does. Where the verdicts are cached, nothing runs the graph
        again: the one run frees the inputs themselves, and a failure of it (of kernels that ran in the process
        that measured them) is raised."""
        measured = floor.enabled(self)
        settled = measured and floor.known(self)
        # verdicts measured before (by a run of these very kernels): this run is the call itself, and frees a
        # backward's inputs as it goes, as every later call does; nothing needs them again
        owned = self.owns_inputs and settled
        handed = handed_over.HandedOver.of(args) if self.owns_inputs and measured and not settled else None
        while True:
            try:
                out = self.call(args, True) if owned else handed_over.run(self.call, handed if handed is not None
                                                                          else args)
                break
            except Exception as e:
                if self.forget is not None:   # a kept graph that fails is planned afresh next time
                    self.forget()
                if debugging() or is_out_of_memory(e) or owned:   # owned: its inputs are gone, nothing can rerun
                    raise
                replanned = self.replan(e) if isinstance(e, KernelFailed) and self.replan is not None else None
                if replanned is None:
                    fallbacks.log("graph", self.kind, "first call", f"{type(e).__name__}: {str(e)[:200]}")
                    recover(e, "a generated kernel failed", "running this graph as ATen")
                    self.call = self._aten_call
                    return self.call(handed.fresh() if handed is not None else args)
                self.call, self.source = replanned.call, replanned.source
                self.kernel_choices = replanned.kernel_choices
        if not measured:
            return out
        if settled:   # verdicts measured before: applied without a run, so the checked output stands
            floor.settle(self, args)
            return out
        del out
        if handed is not None:
            floor.settle(self, handed)
            return handed_over.run(self.call, handed)
        floor.settle(self, args)
        return self.call(args, True) if self.owns_inputs else self.call(args)

    def _aten_call(self, args, owned=False):
        return self.gm(*args)


def _weak_call(method, *args):
    """`method(*args)` called through a weak reference to its object (a trial must not keep its graph alive)."""
    ref = weakref.WeakMethod(method)

    def call():
        bound = ref()
        if bound is not None:
            bound(*args)
    return call


def build(plan, gm, cuda_graphs=False, kind="graph", rewrite_kernels=None):
    kernels = generate_all(plan, kind, rewrite_kernels)
    reused = reused_memory(plan, kernels)
    names, glb = {}, _globals()
    L = plan.lowering

    def var(node):
        if node not in names:
            names[node] = node.name if node.producer == "input" and node.fx is not None else f"buf_{node.name}"
        return names[node]

    def const(x):
        if isinstance(x, ir.Node):
            return var(x)
        if isinstance(x, torch.SymInt):   # a size known at call time: its expression over the bound symbols
            return f"({sizes.expr_text(x)})"
        if x is None or isinstance(x, (bool, int, str)):
            return repr(x)
        if isinstance(x, float):
            return repr(x) if x == x and abs(x) != float("inf") else f"float('{x}')"
        if isinstance(x, (list, tuple)):
            inner = ", ".join(const(a) for a in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
        cname = f"c{len(glb)}"
        glb[cname] = x
        return cname

    lines = ["def call(args, owned=False):"]
    inputs = [n for n in L.nodes if n is not None and n.kind == "buffer" and n.producer == "input"]
    placeholders = [fx for fx in gm.graph.nodes if fx.op == "placeholder"]
    lines.append(f"    {', '.join(fx.name for fx in placeholders)}{',' if len(placeholders) == 1 else ''} = args"
                 if placeholders else "    pass")
    # a caller that hands its inputs over (a backward's saved tensors): each goes at its last use, as buffers do
    lines.append("    if owned: args.clear()")
    bindings_at = len(lines)   # symbol bindings go here once the call's lines say which symbols they name
    for n in L.nodes:
        if n is not None and n.kind == "buffer" and n.producer == "constant":
            names[n] = const(n.meta["tensor"])
    for n in inputs:
        names[n] = n.fx.name
        if len(n.shape) > 1:
            lines.append(f"    {n.fx.name} = layout({n.fx.name}, {tuple(n.stride)})")
    for index, low, size, op in L.index_checks:
        lines.append(f"    check_index({var(index)}, {low}, {size}, {op!r})")
    for seed in L.seeds.values():
        dev = seed.meta["device"]
        lines.append(f"    {var(seed)} = torch.randint(0, 2**31 - 1, (1,), device={const(torch.device(dev))})")
    done_fx = {}
    launches, kernel_steps = [], {}
    allocated, fresh = set(), set()   # fresh: allocated by this call (aligned), not memory reused from another
    for step_kind, step in plan.steps:
        if step_kind == "aten":
            n = step
            fx = n.fx
            if n.kind == "pointwise":   # a view of a materialized tensor: run it as the ATen view it is
                i = n.meta.get("out_index")
                folded = _folded_view(n)
                if folded is not None:   # one as_strided on the materialized tensor for a chain of views
                    root, size, stride, delta = folded
                    offset = f", {var(root)}.storage_offset() + {delta}" if delta else ""
                    lines.append(f"    {var(n)} = {var(root)}.as_strided({size}, {stride}{offset})  # view {fx.target}")
                    continue
                method = VIEW_METHODS.get(fx.target) if not fx.kwargs and i is None else None
                # sizes computed in the graph (`s0 * 768`) are FX nodes: their values, expressions of the sizes
                view_args = torch.fx.node.map_arg(fx.args[1:], lambda a: _fx_var(L, a, var))
                if method is not None:   # the Tensor method: the same view without OpOverload's Python
                    rest = ", ".join(const(a) for a in view_args)
                    lines.append(f"    {var(n)} = {var(n.view_of)}.{method}({rest})  # view {fx.target}")
                    continue
                fn = const(fx.target)
                args = ", ".join([var(n.view_of)] + [const(a) for a in view_args])
                kw = "".join(f", {k}={const(v)}" for k, v in fx.kwargs.items())
                lines.append(f"    {var(n)} = {fn}({args}{kw}){'' if i is None else f'[{i}]'}  # view {fx.target}")
                continue
            if fx not in done_fx:
                rv = f"res_{fx.name}"
                args = torch.fx.node.map_arg(fx.args, lambda a: _fx_var(L, a, var))
                kwargs = torch.fx.node.map_arg(fx.kwargs, lambda a: _fx_var(L, a, var))
                a = ", ".join(const(x) for x in args)
                kw = "".join(f", {k}={const(v)}" for k, v in kwargs.items())
                # a comment of one line: a reason may quote a multi-line compiler error
                tag = "extern" if n.producer == "extern" else f"fallback: {' '.join(str(n.reason).split())}"
                # an OpOverload's C++ entry point: the same call without OpOverload.__call__'s Python frame
                target = getattr(fx.target, "_op", fx.target) if isinstance(fx.target, torch._ops.OpOverload) \
                    else fx.target
                lines.append(f"    {rv} = {const(target)}({a}{kw})  # {tag} {fx.target}")
                done_fx[fx] = rv
            i = n.meta.get("out_index")
            got = f"{done_fx[fx]}{'' if i is None else f'[{i}]'}"
            if n.meta.get("not_tensor"):
                lines.append(f"    {var(n)} = {got}")
            else:   # kernels bake in the layout the meta function promised: hold ATen to it
                lines.append(f"    {var(n)} = layout({got}, {tuple(n.stride)})")
        elif step_kind == "empty":
            lines.append(f"    {var(step)} = {_alloc(step, const)}")
            fresh.add(step)
        else:
            ks = kernels[step]
            for o in ks.stores:
                if o not in allocated:   # an accumulating scatter adds into the buffer its init kernel wrote
                    allocated.add(o)
                    if o in reused:   # the memory of a tensor this kernel or an earlier step read for the last time
                        source, in_place = reused[o]
                        why = f"in place: last read by {ks.name}" if in_place else "its memory: no longer read"
                        lines.append(f"    {var(o)} = {var(source)}  # {why}")
                    else:
                        lines.append(f"    {var(o)} = {_alloc(o, const)}")
                        fresh.add(o)
            numel = step.xnumel() * (step.rnumel() if step.dims else 1)
            if step.xnumel() == 0 or (not step.dims and numel == 0):
                lines.append(f"    # {ks.name}: zero-size, nothing to launch")
                continue
            glb[ks.name] = None
            launches.append(ks)
            kernel_steps[ks.name] = step
            descriptors = getattr(ks, "descriptors", {})
            writes = getattr(ks, "stored_through", None)
            args = [f"tma_descriptor({var(a)}, {descriptors[i][0]}, {descriptors[i][1]}"
                    f"{', writes=True' if i == writes else ''})" if i in descriptors else var(a)
                    for i, a in enumerate(ks.args)] + list(ks.symbols)
            if any(isinstance(g, torch.SymInt) for g in ks.grid):   # the grid too is known at call time
                args.append(f"grid={const(tuple(ks.grid))}")
            lines.append(f"    {ks.name}({', '.join(args)})  # grid {ks.grid}, {ks.meta}")
    outs = [var(o) if isinstance(o, ir.Node) else const(o) for o in L.outputs]
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    named = sizes.symbols_in("\n".join(line.split("  #")[0] for line in lines[bindings_at:]))
    lines[bindings_at:bindings_at] = [f"    {line}" for line in symbol_bindings(placeholders, named)]
    source = "\n".join(free_dead_buffers(drop_unused_views(lines), [fx.name for fx in placeholders])) + "\n"
    specs = [KernelSpec(ks.name, ks.source, tuple(ks.grid), dict(ks.meta),
                        kernel_fx_nodes(kernel_steps[ks.name], ks.nodes),
                        tuple(i for i, a in enumerate(ks.args) if a in fresh), len(ks.symbols),
                        None if getattr(ks, "descriptors", None) else tuple(a.dtype for a in ks.args),
                        function=ks.function)
             for ks in launches]
    builtin = set(_globals())
    constants = {k: v for k, v in glb.items() if k not in builtin and k not in kernel_steps}
    compiled = assemble(source, constants, specs, gm, cuda_graphs, kind, device_name(plan), _cuda_device(plan))
    compiled.kernel_choices = floor.describe(plan, kernels, lambda step, src: kernel_fx_nodes(step, src.nodes))
    return compiled, kernels


@dataclass
class KernelSpec:
    """One kernel launch of a generated call (`name`: the call's name for it), all the call needs to load and
    launch it: its Triton module's source, its grid and meta (num_warps, ...), the FX nodes it computes (what a
    re-plan forces to ATen when it fails), the arguments the call allocates just before, its trailing size
    arguments, and the dtypes its arguments warm it up with (None for a kernel reading TMA descriptors, compiled
    at its first launch)."""
    name: str
    source: str
    grid: tuple
    meta: dict
    fx_nodes: tuple
    fresh_slots: tuple
    symbols: int
    warm_dtypes: tuple = None
    binary: bytes = None   # the compiled kernel as launch.load_binary loads it (no JIT), where there is one
    function: str = None   # the Triton function `source` defines, named after it (generate_all); default `name`

    def __post_init__(self):
        self.function = self.function or self.name


def _globals():
    return {"torch": torch, "empty_strided": torch.empty_strided, "empty_cuda": _EMPTY_CUDA, "layout": layout,
            "check_index": check_index, "tma_descriptor": tma_descriptor}


def assemble(source, constants, specs, gm, cuda_graphs, kind, device, device_index):
    """The CompiledGraph running `source` (a generated `call`) with `constants` and `specs`' kernels, on device
    `device` (its name): each from the binary its spec keeps (a graph cache hit: no JIT), else from the kernel
    cache and compiled where missing, one thread per function. A function that fails to compile raises
    KernelFailed with the FX nodes of its launches. `build` calls it on a fresh plan, the graph cache
    (graph_cache.py) on a saved one: planning ends here."""
    glb = {**_globals(), **constants}
    # Triton compiles kernels mostly outside the GIL (MLIR passes, ptxas): one thread per core
    # launches of one function go to one thread, in turn: the first compiles it, the others find it compiled
    # (and a Triton function is never compiled from two threads at once)
    by_function = {}
    for spec in specs:
        by_function.setdefault((spec.function, spec.source), []).append(spec)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(usable_cpus(), max(1, len(by_function)))) as pool:
        futs = [(group, pool.submit(_launchers, group, device, device_index)) for group in by_function.values()]
        for group, fut in futs:
            try:
                glb.update(fut.result())
            except Exception as e:
                if debugging() or is_out_of_memory(e):
                    raise
                # every launch of the function fails as its first did: a re-plan runs all their ops as ATen
                fx_nodes = tuple(dict.fromkeys(fx for spec in group for fx in spec.fx_nodes))
                raise KernelFailed(group[0].function, "compile", e, fx_nodes) from e
    filename = f"<brrr call {hash(source) & 0xffffff:x}>"
    dump_dir = os.environ.get("BRRR_DUMP_DIR")
    if dump_dir:  # the generated call, to read beside a traceback that points into it
        os.makedirs(dump_dir, exist_ok=True)
        with open(os.path.join(dump_dir, f"call-{hash(source) & 0xffffff:x}.py"), "w") as f:
            f.write(source)
    exec(compile(source, filename, "exec"), glb)
    placeholders = [fx for fx in gm.graph.nodes if fx.op == "placeholder"]
    compiled = CompiledGraph(glb["call"], gm, source, cuda_graphs=cuda_graphs, device=device_index, kind=kind,
                             shape_key=shape_key_function(placeholders))
    compiled.recipe = (constants, specs)
    return compiled


def shape_key_function(placeholders):
    """`shape_key(args)` -> the values of the size symbols the graph's inputs carry, in a call with `args`; None
    for a graph of static sizes."""
    bindings = symbol_bindings(placeholders)
    if not bindings:
        return None
    names = [line.split(" = ")[0] for line in bindings]
    unpack = f"    {', '.join(fx.name for fx in placeholders)}{',' if len(placeholders) == 1 else ''} = args"
    source = "\n".join(["def shape_key(args):", unpack] + [f"    {line}" for line in bindings] +
                       [f"    return ({', '.join(names)},)"]) + "\n"
    glb = {}
    exec(compile(source, "<brrr shape key>", "exec"), glb)
    return glb["shape_key"]


def _fake_of(node):
    fake = node.meta.get("fake")
    if fake is None and node.fx is not None:
        fake = node.fx.meta.get("val")
    return fake if isinstance(fake, torch.Tensor) else None


def _static_ints(values):
    return all(type(v) is int for v in values)


def _folded_view(node):
    """(root, size, stride, storage-offset delta) to build `node` as one as_strided view of the materialized
    tensor its chain of views starts from, or None. Only when the root's real layout is the traced one (its
    strides are what kernels and layout() hold it to), so the traced view's strides are the real ones."""
    root = node.view_of
    while isinstance(root, ir.Node) and ir.is_host_view(root):
        root = root.view_of
    if not isinstance(root, ir.Node) or root is node.view_of:
        return None   # a single view: its own call is as cheap
    fake, root_fake = _fake_of(node), _fake_of(root)
    real_stride = getattr(root, "stride", None)
    if fake is None or root_fake is None or real_stride is None:
        return None
    size, stride = tuple(fake.shape), tuple(fake.stride())
    if not (_static_ints(size) and _static_ints(stride) and _static_ints(root_fake.stride())):
        return None
    if tuple(root_fake.shape) != tuple(root.shape) or tuple(root_fake.stride()) != tuple(real_stride):
        return None
    delta = fake.storage_offset() - root_fake.storage_offset()
    return (root, size, stride, delta) if type(delta) is int else None


def drop_unused_views(lines):
    """`lines` without view lines (tagged `# view`) whose result nothing reads: after folding, the middle
    of a chain of views. Walked backwards, so a dropped view releases the view it read in the same pass."""
    uses = _uses(lines)
    readers = Counter(name for read, _ in uses for name in read)
    keep = [True] * len(lines)
    for i in range(len(lines) - 1, 0, -1):
        read, written = uses[i]
        if "  # view" in lines[i] and not any(readers[name] for name in written):
            keep[i] = False
            readers.subtract(read)
    return [line for line, kept in zip(lines, keep) if kept]


def _uses(lines):
    """(read, written) names per line of a generated call; nothing for the `def` line and comments."""
    return [_names(line) if line.startswith("    ") and not line.lstrip().startswith("#") else (set(), set())
            for line in lines]


def _names(line):
    """(read, written) local names of one generated statement."""
    tree = ast.parse(line.strip())
    read, written = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (written if isinstance(node.ctx, ast.Store) else read).add(node.id)
    return read, written


def free_dead_buffers(lines, inputs=()):
    """`lines` of the generated call with `del` after each intermediate's last use, so a buffer's memory
    goes back to the caching allocator as soon as the graph is done with it, not when the call returns
    (BERT-base inference held 1.8 GB instead of 0.4). The names of `inputs` are dropped the same way: an input
    stays alive through its caller's reference, unless the caller handed it over (`call(args, owned=True)`)."""
    uses = _uses(lines)
    last = {}
    inputs = set(inputs)
    for i, (read, written) in enumerate(uses):
        for name in read | written:
            if name.startswith(("buf_", "res_")) or name in inputs:
                last[name] = i
    returned = uses[-1][0]
    dead_after = {}
    for name, i in last.items():
        if name not in returned:
            dead_after.setdefault(i, []).append(name)
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if i in dead_after:
            out.append(f"    del {', '.join(sorted(dead_after[i]))}")
    return out


def check_index(index, low, size, op):
    """Raise (CPU) or assert on the device without a sync (CUDA), as eager does, when an index tensor holds a
    value outside [low, size): the kernels would read outside the tensor it indexes. An expanded index (a
    scatter's `index[:, None, None].expand_as(src)`) is reduced over its distinct elements only."""
    if 0 in index.stride():
        index = index.as_strided([n if st else 1 for n, st in zip(index.shape, index.stride())], index.stride(),
                                 index.storage_offset())
    lo, hi = torch.aminmax(index)
    torch._assert_async((lo >= low) & (hi < size), f"brrr: {op} index out of range [{low}, {size})")


def symbol_bindings(placeholders, named=()):
    """Lines binding each size symbol of a graph's inputs to its value in this call: a size input that is the
    symbol itself, else the first tensor input with the symbol as a size (or stride). A symbol the call names
    (`named`) that a guard fixed after kernels naming it were generated is bound to what the guard fixed."""
    bound, lines = set(), []
    for fx in placeholders:
        v = fx.meta.get("val")
        if isinstance(v, torch.SymInt):
            name = sizes.expr_text(v)
            if name.isidentifier() and name not in bound:
                bound.add(name)
                lines.append(f"{name} = {fx.name}")
    for fx in placeholders:
        v = fx.meta.get("val")
        if not isinstance(v, torch.Tensor):
            continue
        for what, values in (("shape", v.shape), ("stride()", v.stride())):
            for d, x in enumerate(values):
                name = sizes.expr_text(x) if isinstance(x, torch.SymInt) else ""
                if name.isidentifier() and name not in bound:
                    bound.add(name)
                    lines.append(f"{name} = {fx.name}.{what}[{d}]")
    for name in named:
        if name not in bound:
            lines.append(f"{name} = {sizes.fixed_value(name, placeholders)}")
    return lines


def layout(t, stride):
    """t itself when its strides are the ones kernels were generated for, else a copy with those strides.
    None (an output an ATen op left out, e.g. attention's logsumexp in inference) passes through."""
    if t is None or t.stride() == stride or t.numel() <= 1:
        return t
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def _fx_var(L, a, var):
    v = L.env.get(a)
    return v if not isinstance(v, tuple) else v


def _device_of(node):
    fake = node.meta.get("fake")
    if isinstance(fake, torch.Tensor) and fake.device.type != "meta":
        return fake.device
    return node.meta.get("device") or "meta"


# allocation on the current CUDA device without torch.empty_strided's argument parsing (~4 us -> ~1 us on the
# H100 host); CompiledGraph makes the graph's device current first
_EMPTY_CUDA = getattr(getattr(torch._C, "_dynamo", None) and torch._C._dynamo.guards, "_empty_strided_cuda", None)


def _alloc(node, const):
    fake = node.meta["fake"]
    device = torch.device(fake.device if str(fake.device) != "meta" else node.meta.get("device", "cpu"))
    if device.type == "cuda" and _EMPTY_CUDA is not None:
        return f"empty_cuda({tuple(node.shape)}, {tuple(node.stride)}, {const(node.dtype)})"
    return (f"empty_strided({tuple(node.shape)}, {tuple(node.stride)}, dtype={const(node.dtype)}, "
            f"device={const(device)})")


def _cuda_device(plan):
    """Index of the CUDA device the graph's tensors live on, or None."""
    for n in plan.lowering.nodes:
        fake = n.meta.get("fake") if n is not None else None
        if isinstance(fake, torch.Tensor) and fake.device.type == "cuda":
            return fake.device.index if fake.device.index is not None else torch.cuda.current_device()
    return None


def _launchers(group, device, device_index):
    """{name: Launcher} for the launches `group` of one function: each from its kept binary where that loads (a
    graph cache hit: no JIT), else compiled now, once per distinct dtypes and meta (`launch.warm_all`; `spec.binary`
    is then what was compiled, for the graph cache to keep) and launched from that binary too: a first launch
    through the JIT would build Triton's own launcher for the kernel, a compile of its own. A kernel that fails to
    compile raises (build re-plans without it)."""
    made = {spec.name: _launcher(spec, device, device_index) for spec in group}
    cold = [spec for spec in group if made[spec.name].binary is None]
    blobs = warm_all([made[spec.name] for spec in cold], device_index, strict=True)
    for spec in cold:
        launcher = made[spec.name]
        spec.binary = blobs[launcher]
        if launcher.binary is None:
            launcher.jit_fn   # loaded now (its calls go through the JIT): a source that fails to load fails the build
    return made


def _launcher(spec, device, device_index):
    """A Launcher for `spec`, given its kept binary where that loads."""
    grid = tuple(1 if isinstance(g, torch.SymInt) else g for g in spec.grid)   # given per call instead
    loaded = None
    if spec.binary is not None and device_index is not None and os.environ.get("TRITON_INTERPRET") != "1":
        loaded = load_binary(spec.binary, device_index)
    return Launcher(None, grid, spec.meta, name=spec.function, fx_nodes=spec.fx_nodes, fresh_slots=spec.fresh_slots,
                    symbols=spec.symbols, warm_dtypes=spec.warm_dtypes, binary=loaded,
                    origin=(spec.source, spec.function, device))
