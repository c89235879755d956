"""Core-ATen FX graph -> brrr IR nodes (capture -> **lower** -> schedule -> codegen -> runtime).

One small function per op family, registered in `LOWERINGS`. Each takes the FX node and its arguments (FX nodes
replaced by IR nodes) and returns an IR node. Anything without a lowering, or whose lowering refuses
(`NotLowered(reason)`), becomes a Fallback: a buffer produced by calling the ATen op, with its reason recorded.

This module is the driver, the tables and the helpers the families share; the families (pointwise.py, views.py,
scatter.py, reductions.py, windows.py) import it and fill its tables, and the package imports them
(lowering/__init__.py), so whoever imports any part of the lowering gets every family registered.
"""

import operator

import torch

from brrr.compile.codegen.triton import (COLUMN_MIN_RBLOCK, COLUMN_PERSISTENT_MAX, COLUMN_XBLOCK, FEW_PROGRAMS_TILE,
                                         PERSISTENT_MAX)
from brrr.compile.ir import mathops, nodes as ir
from brrr.compile.ir.indexing import Ix, Term, unflatten
from brrr.compile.ir.nodes import Const, IndexValue, Op
from brrr.compile.ir.sizes import hint, is_symbolic, known_true, same
from brrr.compile.scheduling import layout

aten = torch.ops.aten
LOWERINGS = {}
# the last three are brrr's own ops (matmul/linear_cross_entropy.py): matmuls and row kernels per chunk
EXTERN_OPS = {"mm", "bmm", "addmm", "baddbmm", "convolution", "convolution_backward",
              "fused_linear_cross_entropy", "fused_linear_cross_entropy_backward",
              "fused_linear_cross_entropy_with_grads"}


def is_extern(name):
    return name in EXTERN_OPS or "scaled_dot_product" in name
KERNEL_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.bool, torch.int8,
                 torch.uint8, torch.int16, torch.int32, torch.int64}


class NotLowered(Exception):
    """A lowering refuses this node; the message is the reason shown by explain."""


def _registrar(table):
    """A decorator factory: `@reg("name", ...)` files the function under each name in `table`."""
    def register_names(*names):
        def deco(fn):
            for n in names:
                table[n] = fn
            return fn
        return deco
    return register_names


register = _registrar(LOWERINGS)


def op_name(target):
    return getattr(target, "__name__", str(target)).split(".")[0] if target is not operator.getitem else "getitem"


def meta(fx):
    return fx.meta.get("val")


PRIMS = {}
register_prim = _registrar(PRIMS)


# ------------------------------------------------------------------------------------------- helpers

def cast(v, dtype):
    return v if v.dtype == dtype else Op("cast", [v], dtype)


def const(x, dtype):
    return Const(x, dtype)


def value_of(a, idx, out_shape):
    """`a` (node or Python scalar) at the broadcast output index `idx`."""
    if not isinstance(a, ir.Node):
        return None
    nd = len(a.shape)
    sub = list(idx[len(idx) - nd:]) if nd else []
    sub = [Ix() if s == 1 else i for s, i in zip(a.shape, sub)]
    return a(sub)


def fake(a):
    return a.meta["fake"] if isinstance(a, ir.Node) else a


def operands(L, fx, args, compute_dtype):
    """fn(idx) -> list of Values, each cast to compute_dtype (scalars become constants)."""
    shape = tuple(meta(fx).shape)

    def get(idx):
        out = []
        for a in args:
            if isinstance(a, ir.Node):
                out.append(cast(value_of(a, idx, shape), compute_dtype))
            else:
                out.append(const(a, compute_dtype))
        return out
    return get


def pw(L, fx, fn, ops=None, **kw):
    m = meta(fx)
    return ir.pointwise(L.fresh("pw"), tuple(m.shape), m.dtype, fn, fx=fx, ops=ops or (op_name(fx.target),), **kw)


def elementwise(L, fx, name, args, compute=None):
    """the common case: promote args to `compute` (default: the output dtype), apply op `name`."""
    out_dtype = meta(fx).dtype
    cdt = compute or out_dtype
    get = operands(L, fx, args, cdt)

    def fn(idx):
        return Op(name, get(idx), cdt if compute is None else out_dtype)
    return pw(L, fx, fn)


def view_node(L, fx, src, fn):
    m = meta(fx)
    return ir.pointwise(L.fresh("view"), tuple(m.shape), m.dtype, fn, fx=fx, ops=(op_name(fx.target),),
                        view_of=src)


def masked(cond, fn):
    ir.MASKS.append(cond if not ir.MASKS else Op("and", [ir.MASKS[-1], cond], torch.bool))
    try:
        return fn()
    finally:
        ir.MASKS.pop()


def lt(ix, k):
    return Op("lt", [IndexValue(ix), Const(k, torch.int64)], torch.bool)


def ge(ix, k):
    return Op("ge", [IndexValue(ix), Const(k, torch.int64)], torch.bool)


def indirect(v, coeff=1):
    return Ix([Term(v, None, 1, None, coeff)])


def check_index_input(L, index, size, op, negative_ok=False):
    """Have the runtime check an index tensor that comes in as a graph input (input_ids, targets) against
    the size it indexes: eager raises on such an index, a kernel would read outside the tensor."""
    if isinstance(index, ir.Node) and index.kind == "buffer" and index.producer == "input" and \
            all(isinstance(d, int) for d in index.shape) and 0 not in tuple(index.shape):
        # one check per index tensor, the strictest range asked: a GAT layer's backward indexes by its two
        # edge lists seven times, and each check is a reduction over the index and three launches after it
        low = -size if negative_ok else 0
        for k, (other, other_low, other_size, _) in enumerate(L.index_checks):
            if other is not index:
                continue
            if other_low >= low and other_size <= size:
                return
            if low >= other_low and size <= other_size:
                L.index_checks[k] = (index, low, size, op)
                return
        L.index_checks.append((index, low, size, op))


def wrap_negative(v, size):
    """index values may be negative (index_select/gather forbid it; index allows): wrap like ATen."""
    return Op("where", [Op("lt", [v, Const(0, v.dtype)], torch.bool), Op("add", [v, Const(size, v.dtype)], v.dtype),
                        v], v.dtype)


def norm_dims(dims, ndim):
    if ndim == 0:
        return ()
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted(d % max(ndim, 1) for d in dims))


def device_of(x):
    """The device of node x's tensor: its own note (a helper node's), else its FakeTensor's."""
    device = x.meta.get("device")
    return device if device is not None else fake(x).device


def make_reduction(L, fx, x, dims, rtype, out_shape, out_dtype, body=None, acc_dtype=None):
    src_shape = tuple(x.shape)
    if any(src_shape[d] == 0 for d in dims) and rtype in ("max", "min", "argmax", "argmin"):
        raise NotLowered(f"{rtype} over an empty dim")
    rsize = 1
    for d in dims:
        rsize *= src_shape[d]
    if rtype.startswith("arg") and rsize > 16384:
        raise NotLowered(f"{rtype} over {rsize} elements (only single-pass arg-reductions are generated)")
    if acc_dtype is None:
        acc_dtype = out_dtype
        if out_dtype in (torch.float16, torch.bfloat16):
            acc_dtype = torch.float32
    body = body or (lambda idx: cast(x(idx), acc_dtype) if rtype not in ("argmax", "argmin", "max", "min")
                    else x(idx))
    if not dims:   # nothing to reduce (a 0-d input): the value itself (index 0 for arg*)
        node = ir.pointwise(L.fresh("pw"), out_shape, out_dtype,
                            lambda idx: Const(0, out_dtype) if rtype.startswith("arg") else cast(body(idx), out_dtype),
                            fx=fx, ops=(op_name(fx.target),) if fx is not None else ())
        node.meta["acc_dtype"] = out_dtype
        node.meta["fake"] = torch.empty(out_shape, dtype=out_dtype, device="meta")
        node.meta["device"] = device_of(x)
        return node
    wide = fx is not None and fx in L.wider
    split = None if rtype.startswith("arg") else reduction_split(x, dims, wide)
    if split is not None:
        return split_reduction(L, fx, x, dims, rtype, out_shape, out_dtype, body, acc_dtype, column=split == "column",
                               wide=wide)
    node = ir.reduction(L.fresh("red"), out_shape, out_dtype, body, src_shape, dims, rtype, fx=fx,
                        ops=(op_name(fx.target),) if fx is not None else ())
    node.meta["acc_dtype"] = acc_dtype
    # the floor's "wider" alternative (runtime/floor.py) would split it: an arg-reduction never splits
    node.meta["widenable"] = fx is not None and not rtype.startswith("arg") and _widens(rsize_hint(src_shape, dims))
    node.meta["fake"] = torch.empty(out_shape, dtype=out_dtype, device="meta")
    node.meta["device"] = device_of(x)
    L.add(node)
    return node


SPLIT_MIN_R = 32768    # a few rows this long would leave most of a GPU idle: reduce them in two kernels
SPLIT_MAX_X = 256     # ... up to this many (two per SM of an H100): an NCHW batch norm's statistics over 64 channels
                      # of 128x112x112 ran as 64 programs, 1.3 ms forward and 1.9 ms backward, 21-24% of the roof
SPLIT_COLUMN_MIN_R = 1024      # columns this long, over a tensor of at least SPLIT_COLUMN_MIN_NUMEL, split
SPLIT_COLUMN_MIN_NUMEL = 1 << 20
SPLIT_COLUMN_PROGRAMS = 1024   # the split aims at this many [columns, chunk] programs: many per SM
SPLIT_ACROSS_MAX_X = 32 * 256  # fewer kept elements than this read across rows: too few tiles unsplit
SPLIT_COLUMN_FEW_X = FEW_PROGRAMS_TILE[0] * 132   # columns too few for an unsplit reduction's [16, 64] tiles to
                                                   # give each of an H100's 132 SMs a program: these split ...
SPLIT_COLUMN_FEW_X_MIN_NUMEL = 1 << 17            # ... from this many elements (DenseNet121's batch-norm backward
                                                   # over [32, 128, 14, 14], 803K, ran as 8 programs: 69 us, 2% of
                                                   # its roofline, a whole call's time each way the floor tried)
SPLIT_COLUMN_MIN_CHUNK = 256   # rows a column split's chunk holds at least where the last one is masked, ...
SPLIT_COLUMN_MIN_EXACT_CHUNK = 64   # ... and where the chunks tile the rows exactly (column_chunks)
WIDE_FACTOR = 4        # the floor's "wider" alternative: this many times the programs a split would give ...
WIDE_MIN_CHUNK = 256   # ... a row split in chunks of at least this many elements


def memory_order(x):
    """x's dims innermost first in the memory a kernel reads for it: the largest tensor its value loads (x
    itself when it is a buffer; through a `.contiguous()` brrr never makes, the tensor before it), else eager's
    strides of x, else row-major."""
    if "memory_order" in x.meta:   # several reductions of one x ask (var: the sum, the squares)
        return x.meta["memory_order"]
    shape = tuple(x.shape)
    order = layout.largest_input_order(x(layout.dim_vars(shape)), shape)
    f = x.meta.get("fake")
    if order is None and isinstance(f, torch.Tensor) and same(f.shape, shape):
        order = layout.order_of(tuple(f.stride()), shape)
    x.meta["memory_order"] = order or layout.row_major(len(shape))
    return x.meta["memory_order"]


def is_column(x, dims):
    """A column reduction: x's innermost dim in memory is kept (channels_last statistics over N, H, W)."""
    inner = layout.innermost(tuple(x.shape), memory_order(x))
    return inner is not None and inner not in dims


def reduction_split(x, dims, wide=False):
    """'row' or 'column' when reducing x over `dims` in one kernel would leave the GPU idle, else None:
    a few long rows (a row's program loops alone), or long columns over few kept elements (a column
    reduction's program covers COLUMN_XBLOCK columns, so 256 channels would be 4 programs), from
    SPLIT_COLUMN_MIN_NUMEL elements, or from SPLIT_COLUMN_FEW_X_MIN_NUMEL where the columns are fewer still.
    `wide` (the floor's "wider" alternative for a slow kernel's reductions): split whatever these rules say,
    where its rows are long enough to cut in two."""
    if wide and _widens(rsize_hint(x.shape, dims)):
        return "column" if is_column(x, dims) else "row"
    shape = tuple(x.shape)
    rsize = xnumel = 1
    for d, s in enumerate(shape):   # a heuristic: symbolic sizes are read at their hints, adding no guard
        if d in dims:
            rsize *= hint(s)
        else:
            xnumel *= hint(s)
    long_columns = rsize >= SPLIT_COLUMN_MIN_R and xnumel * rsize >= SPLIT_COLUMN_MIN_NUMEL
    if is_column(x, dims):
        few_columns = rsize >= SPLIT_COLUMN_MIN_R and xnumel < SPLIT_COLUMN_FEW_X \
            and xnumel * rsize >= SPLIT_COLUMN_FEW_X_MIN_NUMEL
        return "column" if long_columns or few_columns else None
    if long_columns and xnumel < SPLIT_ACROSS_MAX_X \
            and layout.reads_across_rows(x(layout.dim_vars(shape)), shape, dims):
        # rows that also read a large input along the kept dims (a layer norm's weight gradient over a
        # transposed gradient): the column split's [kept, chunk] tiles run along both inputs, coalesced
        return "column"
    return "row" if SPLIT_MIN_R <= rsize and xnumel <= SPLIT_MAX_X else None


def rsize_hint(shape, dims):
    out = 1
    for d in dims:
        out *= hint(shape[d])
    return out


def _widens(rows):
    """Whether rows this long split wider: into two chunks at least."""
    return rows >= 2 * WIDE_MIN_CHUNK


def reads_in_one_tile(x, dims, wide=False):
    """Whether codegen holds each row of this reduction in registers at once (a persistent reduction): then a
    second reduction over the same row (variance around the mean) reads registers, not memory again."""
    rsize = 1
    for d in dims:
        rsize *= x.shape[d]
    if reduction_split(x, dims, wide) is not None or is_symbolic(rsize):   # codegen loops rows of symbolic length
        return False
    return rsize <= (COLUMN_PERSISTENT_MAX if is_column(x, dims) else PERSISTENT_MAX)


def identity(rtype, dtype):
    if rtype == "sum":
        return Const(0, dtype)
    if rtype == "prod":
        return Const(1, dtype)
    if dtype == torch.bool:
        return Const(rtype == "min", dtype)
    if dtype.is_floating_point:
        return Const(float("-inf") if rtype == "max" else float("inf"), dtype)
    info = torch.iinfo(dtype)
    return Const(info.min if rtype == "max" else info.max, dtype)


def column_chunks(rsize, xnumel, exact=True, programs=None):
    """Chunks a column split cuts `rsize` rows into: about SPLIT_COLUMN_PROGRAMS programs of COLUMN_XBLOCK kept
    elements. With `exact` (static sizes), the count within a factor of two of that whose chunks tile the rows
    exactly in steps of COLUMN_MIN_RBLOCK rows, chunks of at least SPLIT_COLUMN_MIN_EXACT_CHUNK rows, where
    there is one. Otherwise chunks of at least SPLIT_COLUMN_MIN_CHUNK rows, the last one masked where it runs
    past the rows' end: every load then carries a mask and ptxas keeps one load in flight where it kept ten (a
    bias gradient's [8192, 3072] sum read at 46% of copy in 22 masked chunks, at 83% in 16 exact ones; a layer
    norm's weight and bias gradients over [8192, 768] took 17.8 us in 32 chunks, 10.0 in 64: NOTES, "Column sums
    in chunks that tile their rows")."""
    wanted = -(-(programs or SPLIT_COLUMN_PROGRAMS) * COLUMN_XBLOCK // max(xnumel, 1))
    if exact:
        target = max(2, min(wanted, rsize // SPLIT_COLUMN_MIN_EXACT_CHUNK))
        tiling = [c for c in range(max(2, target // 2), 2 * target + 1) if rsize % c == 0
                  and (rsize // c) % COLUMN_MIN_RBLOCK == 0 and rsize // c >= SPLIT_COLUMN_MIN_EXACT_CHUNK]
        if tiling:
            return min(tiling, key=lambda c: max(c / target, target / c))
    return max(2, min(wanted, rsize // SPLIT_COLUMN_MIN_CHUNK))


def split_reduction(L, fx, x, dims, rtype, out_shape, out_dtype, body, acc_dtype, column=False, wide=False):
    """Reduce each row's R elements as C chunks of B (one kernel), then the C partials (a second kernel). The
    kept elements are numbered X in x's memory order, and so are the reduced ones, so both kernels read
    memory in order. Few long rows: partial space (X, C, B) reducing B. Columns (the innermost dim in memory is
    kept, e.g. bias grads, channels_last statistics): (C, B, X) reducing B, so consecutive x stay contiguous
    and X * C / COLUMN_XBLOCK programs share the work. `wide`: WIDE_FACTOR times the programs (rows: in chunks
    of at least WIDE_MIN_CHUNK)."""
    src_shape = tuple(x.shape)
    order = memory_order(x)
    kept_dims = [d for d in order if d not in dims]       # innermost first
    reduced_dims = [d for d in order if d in dims]
    kept_sizes, reduced_sizes = [src_shape[d] for d in kept_dims], [src_shape[d] for d in reduced_dims]
    xnumel = rsize = 1
    for s in kept_sizes:
        xnumel *= s
    for s in reduced_sizes:
        rsize *= s
    # the number of chunks is fixed at the hint sizes (the final kernel reduces that many partials); with
    # symbolic sizes the chunk length is an expression, and chunks past a shorter row's end add the identity
    x_hint, r_hint = hint(xnumel), hint(rsize)
    factor, least = (WIDE_FACTOR, WIDE_MIN_CHUNK) if wide else (1, 1024)
    chunks = max(2, min(-(-r_hint // least), max(1, factor * 2048 // max(x_hint, 1))))
    if column:
        chunks = column_chunks(r_hint, x_hint, exact=not is_symbolic(rsize), programs=factor * SPLIT_COLUMN_PROGRAMS)
    block = (rsize + chunks - 1) // chunks

    def partial_body(idx):
        c, b, xi = idx if column else (idx[1], idx[2], idx[0])
        r = Ix.of(c) * block + b
        cond = Op("lt", [IndexValue(r), Const(rsize, torch.int64)], torch.bool)
        full = [Ix()] * len(src_shape)
        for d, i in zip(kept_dims, unflatten(Ix.of(xi), kept_sizes, tuple(range(len(kept_dims))))):
            full[d] = i
        for d, i in zip(reduced_dims, unflatten(r, reduced_sizes, tuple(range(len(reduced_dims))))):
            full[d] = i
        if known_true(chunks * block == rsize):   # the chunks tile the row exactly: no lane is past its end
            return body(full)
        v = masked(cond, lambda: body(full))
        return Op("where", [cond, v, identity(rtype, v.dtype)], v.dtype)
    part_dtype = acc_dtype if acc_dtype != torch.bool else torch.bool
    pshape, pspace, pdims = ((chunks, xnumel), (chunks, block, xnumel), (1,)) if column else \
        ((xnumel, chunks), (xnumel, chunks, block), (2,))
    ops = (op_name(fx.target),) if fx is not None else ()
    part = ir.reduction(L.fresh("red"), pshape, part_dtype, partial_body, pspace, pdims, rtype, fx=fx, ops=ops)
    part.meta.update(acc_dtype=acc_dtype, device=device_of(x), order=layout.row_major(3), widenable=_widens(r_hint),
                     fake=torch.empty(pshape, dtype=part_dtype, device="meta"))
    if column:   # seen here, in x's own dims: the partial's rows unflatten through a division the layout check skips
        part.meta["reads_along_rows"] = layout.reads_along_rows(x(layout.dim_vars(src_shape)), src_shape, dims)
        if not known_true(chunks * block == rsize):
            # the last chunk ends early: codegen may walk each chunk's whole steps unmasked (Codegen.peeled_rows)
            part.meta["chunk_rows"] = (rsize, block)
    L.add(part)

    # the final kernel: space out_shape + (C,), reducing C; an output's index numbers its kept element xi
    # as the partial kernel did (kept dims dense in memory order)
    kept_stride = dict(zip(kept_dims, layout.dense_strides(kept_sizes, tuple(range(len(kept_dims))))))
    kept_nonunit = [d for d in range(len(src_shape)) if d not in dims and src_shape[d] != 1]
    out_nonunit = [j for j, s in enumerate(out_shape) if s != 1]
    out_stride = {j: kept_stride[d] for d, j in zip(kept_nonunit, out_nonunit)}
    n_out = len(out_shape)

    def final_body(idx):
        xi = Ix()
        for j, st in out_stride.items():
            xi = xi + Ix.of(idx[j]) * st
        return part([idx[n_out], xi] if column else [xi, idx[n_out]])
    by_memory = sorted(out_stride, key=out_stride.get) + [j for j in range(n_out) if j not in out_stride]
    final = ir.reduction(L.fresh("red"), out_shape, out_dtype, final_body, tuple(out_shape) + (chunks,), (n_out,),
                         rtype, fx=fx, ops=ops)
    final.meta.update(acc_dtype=acc_dtype, device=device_of(x), widenable=_widens(r_hint),
                      order=tuple(by_memory + [n_out]) if column else tuple([n_out] + by_memory),
                      fake=torch.empty(out_shape, dtype=out_dtype, device="meta"))
    L.add(final)
    return final


def kept_index(src_idx, dims, out_shape):
    """output index (keepdim or not) from the full source index."""
    if len(out_shape) == len(src_idx):
        return [Ix() if d in dims else i for d, i in enumerate(src_idx)]
    return [i for d, i in enumerate(src_idx) if d not in dims]


# ----------------------------------------------------------------------------------------------- lower

class Lowering:
    """Walks an FX graph and builds IR nodes; `nodes` keeps creation order (a valid topological order)."""

    def __init__(self, gm, forced=None, wider=()):
        self.gm = gm
        self.forced = dict(forced or {})   # fx node -> reason: ops of a kernel that failed, run as ATen
        self.wider = frozenset(wider)      # fx nodes whose reductions split across more programs (the floor's)
        self.env = {}
        self.nodes = []
        self.outputs = []
        self.counter = 0
        self.fallbacks = []     # (fx node, reason, scope): scope "op" (refused here) or "kernel" (forced)
        self.externs = []
        self.seeds = {}
        self.index_checks = []  # (graph-input index buffer, lowest valid value, size, op): checked per call
        self.shifted_sums = {}  # (input up to float casts, dims, output shape) -> one-pass moments (var, sum)
        self.added = set()

    def fresh(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def add(self, node):
        if node not in self.added:
            self.added.add(node)
            self.nodes.append(node)

    def seed_buffer(self, device):
        key = str(device)
        if key not in self.seeds:
            node = ir.buffer(f"seed{len(self.seeds)}", (1,), (1,), torch.int64, "seed")
            node.meta["fake"] = torch.empty((1,), dtype=torch.int64, device="meta")
            node.meta["device"] = device
            self.seeds[key] = node
            self.nodes.append(node)
        return self.seeds[key]

    def run(self):
        for fx in self.gm.graph.nodes:
            if fx.op == "placeholder":
                self.env[fx] = self.input_buffer(fx)
            elif fx.op == "call_function":
                self.env[fx] = self.lower_node(fx)
            elif fx.op == "get_attr":
                self.env[fx] = self.constant_buffer(fx)
            elif fx.op == "output":
                self.outputs = [self.env.get(a) if isinstance(a, torch.fx.Node) else a
                                for a in torch.fx.node.map_arg(fx.args[0], lambda n: n) or []]
            else:
                raise NotLowered(f"FX op {fx.op}")
        return self

    def input_buffer(self, fx):
        v = meta(fx)
        if not isinstance(v, torch.Tensor):
            self.nodes.append(None)
            return v
        node = ir.buffer(fx.name, v.shape, v.stride(), v.dtype, "input", fx=fx, offset=v.storage_offset())
        node.meta["fake"] = v
        self.nodes.append(node)
        return node

    def constant_buffer(self, fx):
        v = getattr(self.gm, fx.target)
        if not isinstance(v, torch.Tensor):
            raise NotLowered(f"get_attr of {type(v).__name__}")
        node = ir.buffer(fx.name, v.shape, v.stride(), v.dtype, "constant", fx=fx)
        node.meta["fake"] = v
        node.meta["tensor"] = v
        self.nodes.append(node)
        return node

    def lower_node(self, fx):
        if fx.target is operator.getitem:
            src, i = fx.args
            return self.env[src][i]
        if isinstance(meta(fx), (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return meta(fx)   # size arithmetic (`s0 * 768`, `sym_size`): the value, an expression of the sizes
        args = torch.fx.node.map_arg(fx.args, lambda n: self.env[n])
        kwargs = torch.fx.node.map_arg(fx.kwargs, lambda n: self.env[n])
        name = op_name(fx.target)
        val = meta(fx)
        reason = None
        if is_extern(name):
            return self.buffer_op(fx, "extern", "")
        if fx in self.forced:
            return self.buffer_op(fx, "fallback", self.forced[fx], scope="kernel")
        prim = getattr(fx.target, "namespace", "aten") == "prims"
        fn = PRIMS.get(name) if prim else LOWERINGS.get(name)
        if prim and fn is None and name in LOWERINGS and name not in ("sum", "var", "amax", "amin", "prod", "div"):
            fn = LOWERINGS[name]   # elementwise prims share aten's signature
        if fn is None:
            reason = f"no brrr lowering for aten.{name}"
        elif not all(t.dtype in KERNEL_DTYPES for t in _tensors(val)):
            reason = f"dtype {[t.dtype for t in _tensors(val)]} not generated"
        elif not all(a.dtype in KERNEL_DTYPES for a in _nodes(args, kwargs)):
            reason = "input dtype not generated"
        else:
            try:
                out = fn(self, fx, *args, **kwargs)
                for o in out if isinstance(out, tuple) else (out,):
                    why = unrenderable(o, self.added)
                    if why:
                        raise NotLowered(why)
                for i, o in enumerate(out if isinstance(out, tuple) else (out,)):
                    if isinstance(o, ir.Node):
                        v = val[i] if isinstance(out, tuple) else val
                        if isinstance(v, torch.Tensor) and same(v.shape, o.shape) and v.dtype == o.dtype:
                            o.meta["fake"] = v
                        o.meta.setdefault("device", v.device if isinstance(v, torch.Tensor) else None)
                        self.add(o)
                return out
            except NotLowered as e:
                reason = str(e)
            except (TypeError, ValueError, KeyError, IndexError, AttributeError, NotImplementedError) as e:
                reason = f"lowering failed: {type(e).__name__}: {e}"
        return self.buffer_op(fx, "fallback", reason)

    def buffer_op(self, fx, producer, reason, scope="op"):
        val = meta(fx)
        if producer == "fallback":
            self.fallbacks.append((fx, reason, scope))
        else:
            self.externs.append(fx)

        def buf(t, i):
            node = ir.buffer(f"{fx.name}_{i}" if isinstance(val, (tuple, list)) else fx.name, t.shape, t.stride(),
                             t.dtype, producer, fx=fx, offset=t.storage_offset(), reason=reason,
                             ops=(op_name(fx.target),))
            node.meta["fake"] = t
            node.meta["out_index"] = i
            node.meta["scope"] = scope
            self.nodes.append(node)
            return node
        if isinstance(val, torch.Tensor):
            return buf(val, None)
        if isinstance(val, (tuple, list)):
            return tuple(buf(t, i) if isinstance(t, torch.Tensor) else t for i, t in enumerate(val))
        node = ir.buffer(fx.name, (), (), torch.float32, producer, fx=fx, reason=reason, ops=(op_name(fx.target),))
        node.meta["fake"] = val
        node.meta["not_tensor"] = True
        node.meta["scope"] = scope
        self.nodes.append(node)
        return node


def unrenderable(node, lowered):
    """Why codegen could not render `node`'s math (brrr.compile.ir.mathops), or None. Checked while lowering, so
    such an op runs as ATen on its own instead of failing its kernel later. The nodes already `lowered` were
    checked: they are read as loads here rather than inlined, so each node's own math is walked once."""
    if not isinstance(node, ir.Node) or node.kind == "buffer":
        return None
    shape = node.src_shape if node.kind == "reduction" else node.shape
    if _numel(shape) == 0:   # nothing to compute: no kernel is launched
        return None
    index = unflatten(Ix.var("xindex", _numel(shape)), shape)
    previous, ir.LOAD_STORED = ir.LOAD_STORED, lowered
    try:
        value = node.body(index) if node.kind == "reduction" else node.fn(index)
    finally:
        ir.LOAD_STORED = previous
    for v in ir.walk(value):
        if isinstance(v, ir.Op):
            why = mathops.refusal(v)
            if why:
                return why
    return None


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _tensors(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for t in v if isinstance(t, torch.Tensor)]
    return []


def _nodes(args, kwargs):
    out = []
    torch.fx.node.map_aggregate((args, kwargs), lambda a: out.append(a) if isinstance(a, ir.Node) else None)
    return out


def lower(gm, forced=None, wider=()):
    """`gm` as IR; `forced` maps FX nodes to the reason they must run as ATen calls (a failed kernel's ops);
    the reductions of the FX nodes `wider` split across more programs than the plan's rules give."""
    return Lowering(gm, forced, wider).run()

