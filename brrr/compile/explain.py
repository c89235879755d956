"""What brrr would do with a model (capture -> lower -> schedule -> codegen, then **explain**; nothing runs).

    print(brrr.explain(model, x))            # or train=True for forward + backward

Captures the graphs with Dynamo + AOTAutograd exactly as the backend does, plans them, generates the Triton
source, and reports: the fused kernels (ATen ops inside, iteration space, bytes moved, source), the Externs
(matmul/conv/attention via ATen), the Fallbacks and why, the fusion refusals, and bytes before/after. Byte
counts come from brrr.cost: unfused = sum of op_cost(...).bytes over every ATen op of the graphs (eager's
traffic); fused = each kernel's buffers read and written (tensor_bytes) plus the ATen calls that remain.
Works on CPU with no GPU and no TRITON_INTERPRET.
"""

from dataclasses import dataclass, field

import torch

from brrr.compile.ir.sizes import hint


@dataclass
class KernelInfo:
    name: str
    graph: str                 # inference | forward | backward
    ops: list                  # ATen op names held by the kernel
    bytes: int                 # bytes it reads + writes
    source: str
    space: str                 # "[512, 1024] reducing [1]"
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)
    flops: int = 0             # brrr.cost's FLOPs of the ATen ops it computes (pricing.py)
    bytes_read: int = 0
    bytes_written: int = 0
    modules: list = field(default_factory=list)   # Dynamo source paths of the modules its ops came from

    @property
    def kernel_name(self):
        """The name the profiler, the Triton function and brrr.analyze know it by (`name` has its graph first)."""
        return self.name.split(".", 1)[1]


@dataclass
class OpInfo:
    op: str
    graph: str
    shapes: str
    bytes: int
    reason: str = ""
    scope: str = "op"          # fallbacks: "op" (no lowering), "kernel" (its kernel failed), "graph"


@dataclass
class MatmulInfo:
    graph: str
    op: str                    # mm | addmm | bmm | baddbmm
    size: str                  # "[B x] M x N x K"
    dtype: str
    runs_as: str               # "cuBLAS" | "[TMA ]template BLOCK_MxBLOCK_NxBLOCK_K"
    epilogue: list = field(default_factory=list)   # ATen ops fused after it
    bytes_saved: int = 0       # the product's write and read (or its read alone, when it is also stored), and
    #                            each operand's write and read where a prologue computes it
    kernel: str = ""
    prologue: list = field(default_factory=list)   # ATen ops computing an operand in its K loop

    def __str__(self):
        text = f"[{self.graph}] {self.op} {self.size} {self.dtype}: {self.runs_as}"
        if self.epilogue or self.prologue:
            fused = [f"{what} {', '.join(ops)}" for what, ops in (("prologue", self.prologue),
                                                                   ("epilogue", self.epilogue)) if ops]
            text += f" in {self.kernel} with {' and '.join(fused)}; saves {_fmt(self.bytes_saved)}"
        return text


@dataclass
class Explanation:
    kernels: list = field(default_factory=list)
    externs: list = field(default_factory=list)
    fallbacks: list = field(default_factory=list)
    refusals: list = field(default_factory=list)     # (graph, node description, reason)
    bytes_unfused: int = 0
    bytes_fused: int = 0
    graphs: list = field(default_factory=list)       # graph kinds captured
    notes: list = field(default_factory=list)
    seen: list = field(default_factory=list)         # fallbacks.Fallback of kernel/graph scope while compiling
    replays: list = field(default_factory=list)      # replay_choice.Decision of graphs run in this process
    floor: list = field(default_factory=list)        # floor.Verdict: kernels measured against their roofline
    captured: list = field(default_factory=list)     # captured_choice.Decision: compiled against as captured
    layouts: list = field(default_factory=list)      # passes.layouts.Decision: each convolution graph's layout
    paddings: list = field(default_factory=list)     # (graph, pad_matmuls.Padding): unaligned matmuls
    linear_losses: list = field(default_factory=list)  # passes.linear_cross_entropy.Rewrite: losses without logits
    matmuls: list = field(default_factory=list)      # MatmulInfo: each matmul, cuBLAS or a template kernel
    runtimes: list = field(default_factory=list)     # (inference | training, why AOTAutograd's runtime or None)
    guards: list = field(default_factory=list)       # (graph, guard): what planning at symbolic sizes assumed
    graph_breaks: list = field(default_factory=list)  # graph_breaks.GraphBreak: where Dynamo split the program

    def planned(self, kind, gm, plan, kernels):
        """compile_graph's sink: one planned graph."""
        record(self, kind, gm, plan, kernels)

    def fell_back(self, kind, reason):
        """compile_graph's sink: a graph brrr runs as Dynamo captured it."""
        self.graphs.append(kind)
        self.fallbacks.append(OpInfo("whole graph", kind, "", 0, reason, scope="graph"))

    @property
    def saving(self):
        return 1.0 - self.bytes_fused / self.bytes_unfused if self.bytes_unfused else 0.0

    def __str__(self):
        lines = [f"brrr explain: {len(self.kernels)} fused kernel(s), {len(self.externs)} extern(s), "
                 f"{len(self.fallbacks)} fallback(s) over graphs: {', '.join(self.graphs) or 'none'}"]
        lines.append(f"bytes moved: unfused {_fmt(self.bytes_unfused)} -> fused {_fmt(self.bytes_fused)} "
                     f"({self.saving:.0%} less)")
        lines.append("")
        lines.append("fused kernels:")
        for k in self.kernels:
            lines.append(f"  [{k.graph}] {k.name}: {k.space}, {_fmt(k.bytes)}, {k.flops} FLOPs")
            lines.append(f"      ops: {', '.join(k.ops) or '-'}")
            lines.append(f"      reads: {', '.join(k.reads)}")
            lines.append(f"      writes: {', '.join(k.writes)}")
        if self.externs:
            lines.append("externs (ATen library calls):")
            for e in self.externs:
                lines.append(f"  [{e.graph}] {e.op}({e.shapes}) {_fmt(e.bytes)}")
        if self.paddings:
            lines.append("unaligned matmuls (padded to 16-byte leading dimensions where it pays):")
            for g, p in self.paddings:
                lines.append(f"  [{g}] {p}")
        _section(lines, "layouts chosen from the convolutions' measured times (BRRR_LAYOUTS=0 turns it off):",
                 self.layouts)
        _section(lines, "matmuls (cuBLAS, or a brrr template with its epilogue: brrr.compile(matmul_templates=...)):",
                 self.matmuls)
        _section(lines, "linear + cross-entropy computed in chunks of rows, without logits:", self.linear_losses)
        _section(lines, "graph breaks (Dynamo split the program here: the Python between graphs runs as plain "
                        "PyTorch, nothing fuses across):", self.graph_breaks)
        if self.fallbacks:
            lines.append("fallbacks (run as ATen, not fused), by scope:")
            for f in self.fallbacks:
                shapes = f"({f.shapes})" if f.scope != "graph" else ""
                lines.append(f"  [{f.graph}] {f.scope}: {f.op}{shapes}: {f.reason}")
        if self.seen:
            lines.append("fallbacks while compiling in this process (kernel and graph scope):")
            for f in self.seen:
                lines.append(f"  [{f.graph}] {f.scope}: {f.what}: {f.reason}")
        if self.guards:
            lines.append("guards brrr added planning at symbolic sizes (a call breaking one recompiles):")
            for g, guard in self.guards:
                lines.append(f"  [{g}] {guard}")
        if self.runtimes:
            lines.append("runtime around the compiled graphs:")
            for kind, why in self.runtimes:
                lines.append(f"  [{kind}] " + ("brrr's lean runtime" if why is None else
                                               f"AOTAutograd's runtime wrappers (more host time per call): {why}"))
        _section(lines, "CUDA graphs chosen by timing (cuda_graphs=\"auto\") for graphs run in this process:",
                 self.replays)
        _section(lines, "kernels measured against their roofline on their graph's first call (the floor; "
                        "BRRR_FLOOR=0 turns it off), for graphs run in this process:", self.floor)
        _section(lines, "graphs timed compiled against as Dynamo captured them, for graphs run in this process:",
                 self.captured)
        if self.refusals:
            lines.append("not fused, and why:")
            for g, what, why in self.refusals:
                lines.append(f"  [{g}] {what}: {why}")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)

    def source(self):
        return "\n\n".join(k.source for k in self.kernels)


def _section(lines, title, items):
    """`title` and one indented line per item, where there are items."""
    if items:
        lines.append(title)
        lines.extend(f"  {item}" for item in items)


def _fmt(b):
    for unit in ("B", "KB", "MB", "GB"):
        if abs(b) < 1024 or unit == "GB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024


def _desc(t):
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
    return repr(t)


def _node_desc(n):
    """`add_1: float32[512, 1024]` - named after its FX node, so it can be found in the captured graph."""
    name = n.fx.name if n.fx is not None else n.name
    if n.kind == "reduction" and n.fx is not None and n.meta.get("fake") is not None and \
            tuple(n.meta["fake"].shape) != tuple(getattr(n.fx.meta.get("val"), "shape", ())):
        name += " (partial)"
    return f"{name}: {str(n.dtype).replace('torch.', '')}{list(n.shape)}"


def _fx_cost(fx):
    from brrr.cost.ops import op_cost
    args = torch.fx.node.map_arg(fx.args, lambda a: a.meta.get("val"))
    kwargs = torch.fx.node.map_arg(fx.kwargs, lambda a: a.meta.get("val"))
    try:   # at the hint sizes where they are symbolic: a report's number
        return hint(op_cost(fx.target, args, kwargs, fx.meta.get("val")).bytes)
    except Exception:
        return 0


def _shapes(fx):
    out = []
    torch.fx.node.map_arg(fx.args, lambda a: out.append(_desc(a.meta.get("val"))))
    return ", ".join(out)


def record(ex, kind, gm, plan, kernels):
    """add one planned graph to the Explanation."""
    from brrr.compile.passes.pad_matmuls import DECISIONS
    ex.graphs.append(kind)
    ex.paddings.extend((kind, p) for p in gm.meta.get(DECISIONS, []))
    for fx in gm.graph.nodes:
        if fx.op == "call_function" and getattr(fx.target, "__name__", "") != "getitem":
            ex.bytes_unfused += _fx_cost(fx)
    seen_fx = set()
    for step_kind, step in plan.steps:
        if step_kind == "kernel":
            ks = kernels[step]
            if getattr(step, "mm", None) is not None:   # fusion.FusedMatmul
                ex.matmuls.append(_matmul_info(kind, step.mm, ks))
            reads = [a for a in ks.args if a not in ks.stores]
            work = ks.work   # pricing.KernelWork, from runtime.compiled.generate_all
            nbytes = work.bytes
            space = f"{list(step.shape)}" + (f" reducing dims {list(step.dims)}" if step.dims else "")
            ex.kernels.append(KernelInfo(f"{kind}.{ks.function}", kind, ks.ops, nbytes, ks.source, space,
                                         [_node_desc(a) for a in reads], [_node_desc(a) for a in ks.stores],
                                         work.flops, work.bytes_read, work.bytes_written,
                                         [path for _, path in work.modules]))
            ex.bytes_fused += nbytes
        elif step_kind == "aten" and step.kind == "buffer" and step.fx not in seen_fx:
            seen_fx.add(step.fx)
            fx = step.fx
            b = _fx_cost(fx)
            name = f"{getattr(fx.target, 'namespace', 'aten')}.{getattr(fx.target, '__name__', fx.target)}"
            info = OpInfo(name, kind, _shapes(fx), b, step.reason, scope=step.meta.get("scope", "op"))
            (ex.externs if step.producer == "extern" else ex.fallbacks).append(info)
            if step.producer == "extern" and _matmul_sizes(fx) is not None:
                ex.matmuls.append(_matmul_info(kind, step, None))
            ex.bytes_fused += b
    for node, why in plan.refusals:
        ex.refusals.append((kind, _node_desc(node), str(why).replace(" kernel ", f" {kind}.")))


def _matmul_sizes(fx):
    """(op, "[B x] M x N x K") of an mm/addmm/bmm/baddbmm FX node, else None."""
    op = getattr(fx.target, "__name__", "").split(".")[0]
    if op not in ("mm", "addmm", "bmm", "baddbmm"):
        return None
    a, b = (fx.args[1], fx.args[2]) if op in ("addmm", "baddbmm") else fx.args[:2]
    sa, sb = a.meta["val"].shape, b.meta["val"].shape
    size = f"{sa[-2]} x {sb[-1]} x {sa[-1]}"
    return op, (f"{sa[0]} x " + size) if len(sa) == 3 else size


def _matmul_info(kind, mm, ks):
    from brrr.cost.ops import tensor_bytes

    op, size = _matmul_sizes(mm.fx)
    dtype = str(mm.dtype).replace("torch.", "")
    if ks is None:
        return MatmulInfo(kind, op, size, dtype, "cuBLAS")
    kind_of = "TMA template" if getattr(ks, "tma", None) else "template"
    tile = f"{kind_of} {ks.meta['BLOCK_M']}x{ks.meta['BLOCK_N']}x{ks.meta['BLOCK_K']}"
    product = hint(tensor_bytes(mm.meta["fake"]))
    saved = product if mm in ks.stores else 2 * product
    # each prologue's operand: written once, read at least once
    saved += sum(2 * hint(root.numel) * root.dtype.itemsize for root in ks.prologues.values())
    return MatmulInfo(kind, op, size, dtype, tile, list(ks.epilogue_ops), saved, ks.name, list(ks.prologue_ops))


def explain(fn_or_model, *inputs, train=False, dynamic=False):
    """Plan (never run kernels) what brrr does with `fn_or_model(*inputs)`; returns an Explanation.
    `dynamic` is torch.compile's: True plans the graph Dynamo captures with symbolic sizes."""
    from brrr.compile import fallbacks
    from brrr.compile.backend import make_backend
    from brrr.compile.passes import graph_breaks, layouts
    from brrr.compile.runtime import captured_choice, floor, replay_choice

    ex = Explanation()
    graph_breaks.resync()
    logged = len(fallbacks.LOG)
    ex.seen = [f for f in fallbacks.LOG if f.scope != "op"]   # op scope: each plan lists its own
    ex.replays = list(replay_choice.DECISIONS)
    ex.floor = list(floor.DECISIONS)
    ex.captured = list(captured_choice.DECISIONS)
    backend = make_backend(_sink=ex)
    compiled = torch.compile(fn_or_model, backend=backend, dynamic=dynamic)
    decided = len(layouts.DECISIONS)
    with torch.set_grad_enabled(train):
        out = compiled(*inputs)
        if train:
            outs = [o for o in _flatten(out) if isinstance(o, torch.Tensor) and o.requires_grad]
            if not outs:
                ex.notes.append("train=True but no output requires grad: forward only")
            else:
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    ex.layouts = layouts.DECISIONS[decided:]   # this plan's own: a layout is chosen while compiling
    del fallbacks.LOG[logged:]   # explain's own planning is not a compile: keep it out of the process log
    if not ex.graphs:
        ex.notes.append("Dynamo produced no graph (nothing to compile, or this function was compiled before)")
    return ex


def _flatten(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for a in x for t in _flatten(a)]
    if isinstance(x, dict):
        return [t for a in x.values() for t in _flatten(a)]
    if hasattr(x, "to_tuple"):
        return _flatten(x.to_tuple())
    return []
