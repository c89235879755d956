"""What each fused kernel costs and where it came from (schedule -> codegen -> **pricing**; read by explain and
the kernel registry, so `brrr analyze` can put a brrr-compiled model's kernels on the roofline).

- FLOPs: brrr.cost's count of the ATen ops the kernel computes (`op_flops` on each FX node's fake values: the
  same per-element rules the analyzer applies to eager ops). An FX node lowered to several IR nodes counts in
  proportion to the elements of its IR nodes the kernel computes (a reduction split over two kernels shares its
  FLOPs by the elements each reads); a pointwise node recomputed inside several kernels counts in each, since
  each does the work.
- Bytes: each buffer the kernel stores, written once (`tensor_bytes`), and each buffer it loads, read once, capped
  by what its iteration space can touch (`schedule.load_bytes`): the numbers `brrr explain` reports.
- Modules: the innermost `nn_module_stack` entry of each FX node (`fwd_nn_module_stack` in a backward graph, which
  AOTAutograd copies from the forward node), as Dynamo wrote it: (module key, source path such as
  `L['self'].encoder.layer[0].output`). brrr.analyze resolves them to its own module names.
"""

from dataclasses import dataclass

import torch

from brrr.compile.ir.sizes import hint


@dataclass(frozen=True)
class KernelWork:
    flops: int
    bytes_read: int
    bytes_written: int
    op_class: str              # "normalization" (it reduces) | "elementwise"
    dtype: object              # the first floating tensor it stores (torch.dtype) or None
    ops: tuple                 # ATen ops computed, in graph order: ("aten.gelu.default", ...)
    modules: tuple             # ((module key, source path), ...) distinct, by FLOPs done for each, most first

    @property
    def bytes(self):
        return self.bytes_read + self.bytes_written


def _elements(node):
    """The elements an IR node's work runs over: what a reduction reads, what a pointwise node produces."""
    shape = node.src_shape if node.kind == "reduction" else node.shape
    n = 1
    for s in shape:
        n *= hint(s)   # a price: at the hint sizes
    return n


def fx_flops(fx):
    """brrr.cost's FLOPs of one FX node, on its fake values (0 when the cost model can't price it)."""
    from brrr.cost.ops import op_flops

    if fx.op != "call_function" or not isinstance(fx.target, torch._ops.OpOverload):
        return 0
    args = torch.fx.node.map_arg(fx.args, lambda a: a.meta.get("val"))
    kwargs = torch.fx.node.map_arg(fx.kwargs, lambda a: a.meta.get("val"))
    try:
        return int(hint(op_flops(fx.target, args, kwargs, fx.meta.get("val"))))   # a price: at the hint sizes
    except Exception:
        return 0


def module_of(fx):
    """(key, source path) of the innermost module an FX node ran in, or None."""
    stack = fx.meta.get("nn_module_stack") or fx.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    key, value = list(stack.items())[-1]
    path = value[0] if isinstance(value, tuple) else value
    return str(key), str(path)


def graph_shares(computed):
    """{FX node: the elements of all its IR nodes} over every kernel of a graph, `computed` listing the IR nodes
    each kernel computes; an IR node computed by several kernels counts once. A kernel's share of an FX node's
    FLOPs is the elements of its IR nodes over this total."""
    totals, seen = {}, set()
    for nodes in computed:
        for n in nodes:
            if n.fx is not None and n not in seen:
                seen.add(n)
                totals[n.fx] = totals.get(n.fx, 0) + _elements(n)
    return totals


def kernel_work(kernel, source, totals, flops_of, position):
    """KernelWork of one kernel: `kernel` the schedule.Kernel, `source` its codegen.KernelSource, `totals` from
    graph_shares, `flops_of(fx)` memoized fx_flops, `position` {FX node: its place in the graph}."""
    from brrr.compile.scheduling.schedule import load_bytes
    from brrr.cost.ops import tensor_bytes

    space_numel = kernel.xnumel() * kernel.rnumel()
    read = written = 0
    for a in source.args:
        fake = a.meta.get("fake")
        if not isinstance(fake, torch.Tensor) or a.producer == "seed":
            continue
        if a in source.stores:
            written += tensor_bytes(fake)
        else:
            read += load_bytes(a, space_numel)
    mine = {}
    for n in set(source.nodes) | set(kernel.roots):
        if n.fx is not None:
            mine[n.fx] = mine.get(n.fx, 0) + _elements(n)
    flops, by_module = 0.0, {}
    fxs = sorted(mine, key=lambda fx: position.get(fx, len(position)))
    for fx in fxs:
        total = totals.get(fx) or mine[fx]
        share = flops_of(fx) * min(1.0, mine[fx] / total) if total else 0.0
        flops += share
        module = module_of(fx)
        if module is not None:
            by_module[module] = by_module.get(module, 0.0) + share + 1e-9   # an op without FLOPs still counts
    ops = tuple(dict.fromkeys(str(fx.target) for fx in fxs if fx.op == "call_function"))
    # the module doing most of the kernel's FLOPs first (the analyzer's record takes it), then graph order
    modules = tuple(sorted(by_module, key=lambda m: -by_module[m]))
    dtype = next((a.dtype for a in source.stores if getattr(a.dtype, "is_floating_point", False)), None)
    return KernelWork(int(round(hint(flops))), int(hint(read)), int(hint(written)),
                      "normalization" if kernel.dims else "elementwise", dtype, ops, modules)
