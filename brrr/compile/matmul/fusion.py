"""Matmul epilogues: an mm/bmm/addmm and the pointwise kernel that reads its product become one kernel
(schedule -> codegen -> **this pass over the generated plan** -> runtime).

After each kernel's source is generated (runtime.compiled.generate_all), every matmul Extern is offered to the first
pointwise kernel that reads its product. They fuse when:
- the matmul is `mm`, `bmm` or `addmm` (alpha = beta = 1) of fp32, bf16 or fp16 operands brrr's template takes;
- that kernel walks the product's elements and reads each at its own index (epilogue.py checks
  the rendered index);
- nothing else reads the product before that kernel runs, and no step in between writes an operand.
The fused kernel runs where the consumer ran. It still stores the product when a later step or the graph's
outputs read it (a training forward saves a pre-activation for its backward); otherwise the product never
reaches memory. Each refusal is recorded on the plan (explain lists it).

An operand that only a cheap pointwise kernel makes, and only this matmul reads, is computed in the template's
K loop instead (a prologue: `foldable_producers`, prologue.py); that kernel leaves the plan.

Whether it pays is decided by choice.py (`BRRR_MATMUL_TEMPLATES`: off by default; "1" always fuses, "auto"
times the ways on the GPU per problem, cached on disk; measured in benchmarks/NOTES.md).
"""

import os

import torch

from brrr.compile.fallbacks import recover
from brrr.compile.ir import nodes as ir
from brrr.compile.matmul import choice as matmul_choice
from brrr.compile.matmul.configs import TMA_CONFIGS, candidates, default_config, fits, tma_config, wave_area
from brrr.compile.matmul.epilogue import EpilogueRefused, generate_fused, strides_of, with_config
from brrr.compile.matmul.template import TL
from brrr.compile.scheduling.inplace import root_of, step_reads

_aten = torch.ops.aten
MATMULS = {_aten.mm.default, _aten.bmm.default, _aten.addmm.default}
TIMED_DEVICES = ("cuda",)   # where "auto" times the two ways (tests add "cpu": interpreted kernels run there)


def enabled(option=None):
    return matmul_choice.mode(option) != "off"


def epilogue_pass(option=None):
    """What the backend hands the runtime as its `rewrite_kernels` hook: `fuse_matmul_epilogues` over a plan's
    generated kernels, or None where `option` (else BRRR_MATMUL_TEMPLATES) turns the templates off."""
    if not enabled(option):
        return None

    def fuse(plan, kernels):
        fuse_matmul_epilogues(plan, kernels, interpreted=os.environ.get("TRITON_INTERPRET") == "1", option=option)
    return fuse


class FusedMatmul:
    """A plan step standing where the consumer kernel stood: the matmul and that kernel, one launch. It answers
    what the steps after code generation (runtime, explain, pricing, inplace) ask a schedule.Kernel."""

    dims = ()

    def __init__(self, mm, consumer, name):
        self.mm, self.consumer, self.name = mm, consumer, name
        self.shape, self.roots = consumer.shape, list(consumer.roots)

    def xnumel(self):
        return self.consumer.xnumel()

    def rnumel(self):
        return 1


def _matmul_operands(step, L):
    fx = step.fx
    if fx is None or fx.target not in MATMULS or step.meta.get("out_index") is not None:
        return None
    if fx.target is _aten.addmm.default:
        if fx.kwargs.get("beta", 1) != 1 or fx.kwargs.get("alpha", 1) != 1:
            return None
        bias, a, b = fx.args[:3]
    else:
        bias, (a, b) = None, fx.args[:2]
    nodes = [L.env.get(x) if isinstance(x, torch.fx.Node) else None for x in (a, b)]
    bias_node = L.env.get(bias) if isinstance(bias, torch.fx.Node) else bias
    if not all(isinstance(n, ir.Node) for n in nodes) or (bias is not None and not isinstance(bias_node, ir.Node)):
        return None
    return nodes[0], nodes[1], bias_node


def _writes(kind, step, kernels):
    if kind == "kernel":
        return kernels[step].stores
    if kind == "aten" and ir.is_host_view(step):   # a view writes nothing
        return []
    return [step] if kind in ("aten", "empty") else []


def fuse_matmul_epilogues(plan, kernels, interpreted, option=None):
    """Rewrite `plan.steps` and `kernels` (schedule.Kernel -> KernelSource) in place; returns the fused steps."""
    from brrr.compile.runtime import kernel_registry

    L = plan.lowering
    outputs = {root_of(o) for o in L.outputs if isinstance(o, ir.Node)}
    fused = []
    i = 0
    while i < len(plan.steps):
        kind, mm = plan.steps[i]
        i += 1
        if kind != "aten" or mm.kind != "buffer" or mm.producer != "extern":
            continue
        operands = _matmul_operands(mm, L)
        if operands is None or mm.dtype not in TL:
            continue
        a, b, bias = operands
        if a.dtype != mm.dtype or b.dtype != mm.dtype:
            continue
        # host views of the product read no memory: those before its first reader move after the fused kernel
        views, readers = [], []
        for t, (kind_, s) in enumerate(plan.steps[i:], start=i):
            if kind_ == "aten" and s.view_of is not None and ir.is_host_view(s) and root_of(s) is mm:
                views.append(t)
            elif any(root_of(r) is mm for r in step_reads(kind_, s, kernels, L)):
                readers.append((t, kind_, s))
        if not readers:
            continue
        t, kind_, consumer = readers[0]
        if kind_ != "kernel" or isinstance(consumer, FusedMatmul):
            plan.refusals.append((mm, "matmul epilogue: its first reader is not a pointwise kernel"))
            continue
        if any(r is not mm and root_of(r) is mm for r in step_reads(kind_, consumer, kernels, L)):
            plan.refusals.append((mm, f"matmul epilogue: {consumer.name} reads the product through a view"))
            continue
        between = plan.steps[i:t]
        written = {root_of(w) for k_, s in between for w in _writes(k_, s, kernels)}
        if {root_of(a), root_of(b), root_of(bias)} & written:
            plan.refusals.append((mm, "matmul epilogue: an operand is written before its reader runs"))
            continue
        store_product = len(readers) > 1 or mm in outputs
        name = "brrr_mm_" + consumer.name.removeprefix("brrr_")
        prologues = foldable_producers(plan, kernels, mm, a, b, t, outputs)

        def fused_source(tma, prologues=prologues):
            return generate_fused(name, mm, a, b, bias, consumer, set(plan.stored),
                                  {n for n in plan.stored if n.kind == "pointwise" and n not in consumer.roots},
                                  {r: k for k_, k in plan.steps if k_ == "kernel" for r in k.roots},
                                  store_product, interpreted, tma=tma, prologues=prologues)
        try:
            plain = fused_source(None, {})   # every operand loaded
            folded = None                    # operands computed by their producers' prologues
            if prologues:
                try:
                    folded = fused_source(None)
                except (EpilogueRefused, NotImplementedError) as e:
                    plan.refusals.append((mm, f"matmul prologue: {e}"))
            tma = tma_tile(mm, a, interpreted)
            tma_src = None
            if tma is not None:
                try:
                    tma_src = fused_source(tma, {})
                except EpilogueRefused as e:   # the pointer template serves these operands
                    plan.refusals.append((mm, f"matmul epilogue with {consumer.name}: {e}"))
            if matmul_choice.mode(option) == "auto":
                producers = [kernels[k] for k, _ in prologues.values()] if folded is not None else []
                src, why = _timed(plan, mm, a, b, bias, plain, kernels[consumer], tma_src, producers, folded)
                if src is None:
                    raise EpilogueRefused(why)
                if folded is not None and not getattr(src, "prologues", None):
                    plan.refusals.append((mm, "matmul prologue: loading the operand from its producer timed "
                                              "faster"))
            else:   # "always": every fusion that can be made, in the TMA template where it runs
                src = folded or tma_src or plain
            prologues = {w: p for w, p in prologues.items() if w in getattr(src, "prologues", {})}
        except (EpilogueRefused, NotImplementedError, ValueError) as e:
            plan.refusals.append((mm, f"matmul epilogue with {consumer.name}: {e}"))
            continue
        except Exception as e:   # nothing is rewritten yet: this matmul stays a cuBLAS call
            recover(e, f"fusing {mm.name}'s epilogue failed", "the matmul stays a cuBLAS call")
            continue
        name, text = kernel_registry.claim(name, src.source)
        src.name = src.function = name
        src.source = text
        step = FusedMatmul(mm, consumer, name)
        del kernels[consumer]
        kernels[step] = src
        early_views = [plan.steps[v] for v in views if v < t]
        plan.steps[t] = ("kernel", step)
        plan.steps[t + 1:t + 1] = early_views
        for v in sorted([v for v in views if v < t] + [i - 1], reverse=True):
            del plan.steps[v]
        i -= 1
        if prologues:   # the operands' producers and their views: computed in the template's loop now
            gone = [k for k, _ in prologues.values()] + [
                s for k_, s in plan.steps if k_ == "aten" and any(ir.is_host_view(s) and root_of(s) is root
                                                                  for _, root in prologues.values())]
            dropped = [v for v, (_, s) in enumerate(plan.steps) if any(s is g for g in gone)]
            for v in reversed(dropped):
                del plan.steps[v]
            i -= sum(1 for v in dropped if v < i)
            for k, root in prologues.values():
                del kernels[k]
                plan.stored.discard(root)
        fused.append(step)
    return fused


def foldable_producers(plan, kernels, mm, a, b, fused_at, outputs):
    """{"a" | "b": (the pointwise kernel whose only output is that operand's memory, that memory's node)} for
    operands of the 2-D product `mm` cheap enough to compute in the template's K loop instead of loading them
    (prologue.py): nothing else reads the operand, the graph does not return it, and no step
    before `fused_at` (where the fused kernel will run) writes what its producer reads. Each operand refused
    for another reason than having no such producer is recorded on the plan."""
    from brrr.compile.matmul.prologue import operand_value, operand_views, refusal

    if len(mm.shape) != 2:
        return {}
    found = {}
    producer_of = {r: (v, s) for v, (k_, s) in enumerate(plan.steps) if k_ == "kernel"
                   and not isinstance(s, FusedMatmul) for r in kernels[s].stores}
    for which, x in (("a", a), ("b", b)):
        root = root_of(x)
        if root not in producer_of or root_of(a) is root_of(b):
            continue
        at, producer = producer_of[root]
        why = None
        others = [n.name for n in kernels[producer].stores if n is not root]
        if others:
            why = f"{producer.name}, its producer, also stores {', '.join(others)}"
        elif producer.dims or producer.closed:
            why = f"{producer.name}, its producer, reduces or accumulates"
        elif root in outputs:
            why = f"{root.name} leaves the graph"
        elif any(root_of(r) is root for k_, s in plan.steps
                 if k_ != "kernel" or s is not producer
                 if not (k_ == "aten" and (s is mm or (ir.is_host_view(s) and root_of(s) is root)))
                 for r in step_reads(k_, s, kernels, plan.lowering)):
            why = f"another step reads {root.name}"
        else:
            load_stored = {n for n in plan.stored if n.kind == "pointwise"} - operand_views(x, root)
            value, _ = operand_value(which, x, load_stored)
            why = refusal(value)
            if why is None:
                sources = {root_of(v.buf) for v in ir.walk(value) if isinstance(v, ir.Load)}
                written = {root_of(w) for k_, s in plan.steps[at + 1:fused_at] for w in _writes(k_, s, kernels)}
                if sources & written:
                    why = "a step between its producer and the matmul writes what the producer read"
        if why is not None:
            plan.refusals.append((mm, f"matmul prologue of {x.name}: {why}"))
            continue
        found[which] = (producer, root)
    return found


TMA_INTERPRETED = False   # tests: fuse into the TMA template under the interpreter too


def tma_tile(mm, a, interpreted):
    """The TMA template's tile for the product `mm` = a @ b where it runs (a Hopper GPU, or the interpreter when
    tests ask), else None: `configs.tma_config`'s rule (2-D, 16-bit, at least one tile each way)."""
    from brrr.compile.matmul.template_mm import _tensor_descriptor

    device = mm.meta["fake"].device
    if interpreted:
        if not TMA_INTERPRETED:
            return None
    elif device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return None
    if _tensor_descriptor() is None:
        return None
    batch, m, n = mm.shape if len(mm.shape) == 3 else (1, *mm.shape)
    return tma_config(m, n, a.shape[-1], mm.dtype, batch)


def _timed(plan, mm, a, b, bias, fused, consumer_src, tma_fused=None, producers=(), folded=None):
    """(the fused KernelSource at its fastest tile, None) when it beats cuBLAS + the consumer's kernel on this
    GPU, else (None, why). `folded`: the fused kernel with operand prologues, timed against the others with
    `producers` (the kernels those prologues replace) run before each of them. Timed once per problem
    (choice.py), on real tensors: outside the fake and functional modes AOTAutograd compiles under."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return _timed_here(plan, mm, a, b, bias, fused, consumer_src, tma_fused, producers, folded)


def _timed_here(plan, mm, a, b, bias, fused, consumer_src, tma_fused, producers, folded):
    from brrr.compile.cache import device_name, load_kernel
    from brrr.compile.runtime.launch import tma_descriptor

    device = mm.meta["fake"].device
    if device.type not in TIMED_DEVICES:
        return None, "no GPU to time it on (BRRR_MATMUL_TEMPLATES=auto)"
    batch, m, n = mm.shape if len(mm.shape) == 3 else (1, *mm.shape)
    k = a.shape[-1]
    first = default_config(m, n, k, mm.dtype, batch)
    others = sorted((c for c in candidates(m, n, k, mm.dtype, batch) if c != first),
                    key=lambda c: wave_area(c, m, n, batch))
    tiles = [first] + others[:matmul_choice.MAX_TILES - 1]
    tma_tiles = [t for t in TMA_CONFIGS if fits(t, mm.dtype)][:2] if tma_fused is not None else []
    name = device_name(plan)
    key = matmul_choice.problem_key(name, fused.source, consumer_src.source, repr(tiles),
                                    tma_fused.source if tma_fused is not None else "", repr(tma_tiles),
                                    *[p.source for p in producers],
                                    *([folded.source] if folded is not None else []))
    tensors = {}

    def tensor(node):
        if node not in tensors:   # zeros: any index a kernel loads from them stays in bounds
            tensors[node] = torch.empty_strided(node.shape, strides_of(node), dtype=node.dtype,
                                                device=device).zero_()
        return tensors[node]

    def launch(src):
        fn = load_kernel(src.source, src.function, name)
        args = [tensor(x) for x in src.args]
        descriptors = getattr(src, "descriptors", {})
        args = [tma_descriptor(x, *descriptors[i]) if i in descriptors else x for i, x in enumerate(args)]
        return lambda: fn[src.grid](*args, **src.meta)

    operands = [tensor(x) for x in ((bias, a, b) if bias is not None else (a, b))]
    consumer = launch(consumer_src)
    made = [launch(p) for p in producers]   # kernels every way but the folded one still runs

    def after_producers(run):
        if not made:
            return run

        def way():
            for producer in made:
                producer()
            run()
        return way

    def unfused():   # the consumer reads zeros where cuBLAS's product would be: the same work
        mm.fx.target(*operands)
        consumer()

    ways = {"cublas": after_producers(unfused)}
    by_name = {}
    for label, source, tile_list, run_producers in (("template", fused, tiles, True),
                                                    ("TMA template", tma_fused, tma_tiles, True),
                                                    ("prologue template", folded, tiles, False)):
        for tile in tile_list if source is not None else ():
            src = with_config(source, tile, mm, k)
            by_name[f"{label} {tile}"] = src
            ways[f"{label} {tile}"] = after_producers(launch(src)) if run_producers else launch(src)
    best = matmul_choice.choose(key, ways)
    tensors.clear()
    if best is None or best == "cublas":
        return None, "cuBLAS and the epilogue's own kernel timed faster"
    return by_name[best], None
