"""A matmul and the pointwise kernel that reads its product, as one Triton kernel (matmul fusion -> **codegen** ->
runtime).

The matmul template (template.py) computes a [BLOCK_M, BLOCK_N] tile of `A @ B` (plus addmm's bias) in
fp32. Here brrr's own pointwise codegen renders the consumer kernel's roots on that tile: `xindex`, the flat
index the consumer walks, is the product's element offset `b * M * N + rm * N + rn` (the product is dense
row-major, and the consumer reads it at exactly its own flat index, else this refuses), `xmask` is the tile's
mask, and the consumer's load of the product becomes the tile itself, rounded to the product's dtype as the
unfused product would have been stored. Every other load and store is the consumer's own, so the fused kernel
writes what the two kernels wrote, less the product when nothing else reads it.

Pointer names follow the runtime's convention (`in_ptr<i>` / `out_ptr<j>` by argument position: A, B, the bias,
the consumer's inputs; the product if kept, the consumer's outputs), which inplace.py reads; sizes and strides
are baked in as constants, as in every brrr kernel.
"""

import torch

from brrr.compile.codegen.triton import Codegen, KernelSource, Scope, needs_int64, op_names
from brrr.compile.ir import nodes as ir
from brrr.compile.matmul.configs import default_config
from brrr.compile.matmul.prologue import operand_views, render as render_prologue
from brrr.compile.matmul.template import Epilogue, Tile, generate
from brrr.compile.matmul.template_tma import DTYPES as TMA_DTYPES, descriptor_layout, generate_tma


class EpilogueRefused(Exception):
    """The consumer cannot run on the matmul's tile; the message says why (explain lists it)."""


class _TileCodegen(Codegen):
    """Pointwise codegen whose load of the product reads the tile in registers."""

    product = None
    product_value = "acc_out"

    def value(self, scope, v):
        if isinstance(v, ir.Load) and v.buf is self.product:
            idx, _ = self.index(scope, v.index)
            if idx != "xindex" or v.mask is not None:
                raise EpilogueRefused(f"reads the product at {idx}, not element for element")
            return self.product_value, False
        return super().value(scope, v)


class _Rendered(Epilogue):
    """Lines already rendered by _TileCodegen, with their pointer parameters."""

    def __init__(self, name, params, lines):
        self.name, self.params, self.lines = name, tuple(params), list(lines)

    def code(self, tile):
        return self.lines


def generate_fused(name, mm, a, b, bias, consumer, stored, load_stored, kernel_of, store_product, interpreted,
                   tma=None, prologues=None):
    """KernelSource of `consumer` (a pointwise Kernel) fused after the matmul `mm` (an Extern buffer node computing
    a @ b, plus `bias` for addmm: an IR node or None). Raises EpilogueRefused. `tma`: a TileConfig to run the
    TMA persistent template with (template_tma.py), when `tma_operands` takes the operands; else the
    pointer template at `default_config`'s tile. `prologues`: {"a" | "b": (the pointwise Kernel that stored the
    operand's memory, that memory's node)} for operands computed in the K loop instead (prologue.py; the
    pointer template only)."""
    prologues = dict(prologues or {})
    if prologues and tma is not None:
        raise EpilogueRefused("TMA: an operand is computed by a prologue")
    batched = len(mm.shape) == 3
    batch, m, n = (mm.shape if batched else (1, *mm.shape))
    k = a.shape[-1]
    if tuple(mm.stride) != ((m * n,) if batched else ()) + (n, 1):
        raise EpilogueRefused(f"the product's strides {tuple(mm.stride)} are not row-major")
    if consumer.dims or consumer.tile or consumer.closed or consumer.xnumel() != batch * m * n:
        raise EpilogueRefused("it is not pointwise over the product's elements")
    if any(r.meta.get("atomic_into") is not None for r in consumer.roots):
        raise EpilogueRefused("the consumer accumulates into another tensor")
    cg = _TileCodegen(consumer, stored, load_stored, kernel_of, interpreted=interpreted)
    cg.product = mm
    cg.ops_nodes = set()
    rendered, prologue_nodes = {}, set()
    if not prologues:
        cg.inputs = {a: "in_ptr0", b: "in_ptr1"}
    for which, operand in (("a", a), ("b", b)) if prologues else ():
        if which not in prologues:
            cg.ptr(operand, cg.inputs, "in_ptr")
            continue
        producer, root = prologues[which]
        rendered[which], helpers, nodes, cg.counter = render_prologue(
            which, operand, producer, stored, load_stored - operand_views(operand, root), kernel_of, cg.inputs,
            interpreted, cg.counter)
        cg.helpers |= helpers
        prologue_nodes |= nodes
    a_name = None if "a" in rendered else cg.inputs[a]
    b_name = None if "b" in rendered else cg.inputs[b]
    if bias is not None:
        cg.ptr(bias, cg.inputs, "in_ptr")
    if store_product:
        cg.outputs = {mm: "out_ptr0"}
    tile = Tile(mm.dtype, interpreted)
    scope = Scope(indent="")
    ir._RECORD.append(cg.ops_nodes)
    prev, ir.LOAD_STORED = ir.LOAD_STORED, load_stored
    try:
        cg.store_roots(scope, consumer.roots)
    finally:
        ir.LOAD_STORED = prev
        ir._RECORD.pop()
    # the consumer's tensors as every kernel checks them; a host view's strides only its traced value knows
    wide = needs_int64(consumer, cg) or _spans_int32(a) or _spans_int32(b)
    i64 = ".to(tl.int64)" if wide else ""
    head = [f"xindex = (pid_b * {m * n} + rm * {n} + rn){i64}", "xmask = mask"]
    if bias is not None:
        bias_index = _broadcast_index(bias, batched)
        head.append(f"acc = acc + {tile.load_fp32(f'in_ptr2 + ({bias_index})', bias.dtype)}")
    head.append(f"acc_out = {tile.widen(tile.narrow('acc', mm.dtype), mm.dtype)}" if mm.dtype != torch.float32
                else "acc_out = acc")
    cg.helpers |= tile.helpers
    pointers = [p for p in list(cg.inputs.values()) + list(cg.outputs.values()) if p not in (a_name, b_name)
                and not (store_product and p == "out_ptr0")]
    epilogue = _Rendered(consumer.name, pointers, head + scope.lines)
    order = list(cg.inputs.values()) + list(cg.outputs.values())
    args = list(cg.inputs) + list(cg.outputs)
    computed = cg.ops_nodes | {mm} | prologue_nodes
    ops = op_names(computed)
    fused_ops = dict(prologues={which: root for which, (_, root) in prologues.items()},
                     prologue_ops=op_names(prologue_nodes),
                     epilogue_ops=sorted(set(op_names(cg.ops_nodes)) - set(mm.ops)))
    if tma is not None:
        a_t, b_t = tma_operands(mm, a, b)
        # the product (a fresh row-major buffer) leaves through a descriptor where its rows are 16-byte multiples
        store_descriptor = store_product and descriptor_layout((m, n), (n, 1), 0, mm.dtype.itemsize)
        source = generate_tma(mm.dtype, epilogue, wide=wide, interpreted=interpreted,
                              baked=dict(M=m, N=n, K=k, stride_om=n, stride_on=1),
                              pointers=(a_name, b_name, "out_ptr0"), store_product=store_product, name=name,
                              order=order, helpers=cg.helpers, store_descriptor=store_descriptor)
        src = KernelSource(name, source.source, args, (), {}, ops, 0, list(cg.outputs),
                           sorted(cg.ops_nodes | {mm}, key=lambda nd: nd.name))
        src.tma = dict(A_T=a_t, B_T=b_t, NUM_SMS=_sms(mm))
        vars(src).update(fused_ops)
        src.stored_through = args.index(mm) if store_descriptor else None
        return with_config(src, tma, mm, k)
    config = default_config(m, n, k, mm.dtype, batch)
    sa, sb = strides_of(a), strides_of(b)
    baked = dict(M=m, N=n, K=k, stride_ab=_batch_stride(a, sa, batched), stride_am=sa[-2], stride_ak=sa[-1],
                 stride_bb=_batch_stride(b, sb, batched), stride_bk=sb[-2], stride_bn=sb[-1], stride_ob=m * n,
                 stride_om=n, stride_on=1)
    tf32 = mm.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    source = generate(mm.dtype, epilogue, tf32=tf32, wide=wide, interpreted=interpreted, baked=baked,
                      pointers=(a_name, b_name, "out_ptr0"), store_product=store_product, name=name,
                      order=order, helpers=cg.helpers, prologues=rendered)
    meta = config.meta(k)
    src = KernelSource(name, source.source, args, (config.tiles(m, n), batch), meta, ops, 0, list(cg.outputs),
                       sorted(computed, key=lambda nd: nd.name))
    vars(src).update(fused_ops)
    return src


INTERPRETED_SMS = 3   # programs of a persistent kernel under the interpreter: each walks several tiles


def _sms(mm):
    device = mm.meta["fake"].device
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETED_SMS


def tma_operands(mm, a, b):
    """(A_T, B_T): how TMA descriptors read the operands of the 2-D product `mm` = a @ b, each along its unit
    stride ([M, K] or, transposed, [K, M]; [K, N] or [N, K]). Raises EpilogueRefused where TMA cannot: a batched
    or non-16-bit product, no unit stride, another stride not a multiple of 16 bytes, or an offset that leaves
    the data off 16-byte alignment (the runtime copies a graph input that arrives unaligned)."""
    if len(mm.shape) != 2 or mm.dtype not in TMA_DTYPES:
        raise EpilogueRefused("TMA: a batched or non-16-bit product")
    if a is b:
        raise EpilogueRefused("TMA: one tensor is both operands")
    transposed = []
    for x in (a, b):
        strides = strides_of(x)
        size = x.dtype.itemsize
        if len(strides) != 2 or _offset(x) * size % 16:
            raise EpilogueRefused(f"TMA: {x.name} is not a 16-byte aligned matrix")
        if strides[1] == 1 and strides[0] * size % 16 == 0:
            transposed.append(False)
        elif strides[0] == 1 and strides[1] * size % 16 == 0:
            transposed.append(True)
        else:
            raise EpilogueRefused(f"TMA: {x.name}'s strides {strides} have no unit stride and 16-byte rows")
    return tuple(transposed)


def _offset(node):
    if node.kind == "buffer" and node.producer != "view":
        return node.offset
    fake = node.meta.get("fake")
    if fake is None and node.fx is not None:
        fake = node.fx.meta.get("val")
    return fake.storage_offset() if fake is not None else 1   # unknown: not taken as aligned


def with_config(src, config, mm, k):
    """`src` (a fused kernel) launched with another tile: the same source, other constexprs and grid. A TMA
    kernel's grid is one program per SM (or per tile, when there are fewer), and its operands go in as
    descriptors of the tile's blocks (`descriptors`: argument position -> (block shape, transposed)), and so does
    the product where the kernel stores it through one (`stored_through`: its argument position)."""
    batch, m, n = mm.shape if len(mm.shape) == 3 else (1, *mm.shape)
    tma = getattr(src, "tma", None)
    if tma is None:
        out = KernelSource(src.name, src.source, src.args, (config.tiles(m, n), batch), config.meta(k), src.ops,
                           src.bytes, src.stores, src.nodes)
        _keep_fused_ops(src, out)
        return out
    meta = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
                num_warps=config.num_warps, num_stages=config.num_stages, **tma)
    out = KernelSource(src.name, src.source, src.args, (max(1, min(tma["NUM_SMS"], config.tiles(m, n))),), meta,
                       src.ops, src.bytes, src.stores, src.nodes)
    out.tma = tma
    out.stored_through = getattr(src, "stored_through", None)
    _keep_fused_ops(src, out)
    a_block = (config.block_k, config.block_m) if tma["A_T"] else (config.block_m, config.block_k)
    b_block = (config.block_n, config.block_k) if tma["B_T"] else (config.block_k, config.block_n)
    out.descriptors = {0: (a_block, tma["A_T"]), 1: (b_block, tma["B_T"])}
    if out.stored_through is not None:
        out.descriptors[out.stored_through] = ((config.block_m, config.block_n // 2), False)
    return out


FUSED_OPS = ("prologues", "prologue_ops", "epilogue_ops")   # what generate_fused records of a fused kernel


def _keep_fused_ops(src, out):
    for attr in FUSED_OPS:
        setattr(out, attr, getattr(src, attr))


def strides_of(node):
    """A tensor's strides as the call will see them: a host view's come from its traced value."""
    if node.stride or not node.shape:
        return tuple(node.stride)
    fake = node.meta.get("fake")
    if fake is None and node.fx is not None:
        fake = node.fx.meta.get("val")
    if fake is None:
        raise EpilogueRefused(f"the strides of {node.name} are not known")
    return tuple(fake.stride())


def _spans_int32(node):
    limit = 2 ** 31 - 1
    return sum((s - 1) * st for s, st in zip(node.shape, strides_of(node)) if s > 0) >= limit // 2


def _batch_stride(x, strides, batched):
    return strides[0] if batched and len(x.shape) == 3 and x.shape[0] != 1 else 0


def _broadcast_index(bias, batched):
    """The bias element of the tile's (pid_b, rm, rn), bias broadcast to the product's shape as addmm does."""
    dims = ("pid_b", "rm", "rn")[-len(bias.shape):] if bias.shape else ()
    terms = [f"{d} * {st}" for d, size, st in zip(dims, bias.shape, strides_of(bias)) if size != 1 and st != 0]
    return " + ".join(terms) + (" + rm * 0 + rn * 0" if terms else "rm * 0 + rn * 0")
