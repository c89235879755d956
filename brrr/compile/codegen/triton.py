"""Kernel -> Triton source (schedule -> **codegen** -> runtime).

Four shapes of kernel: pointwise (1-D `xindex` blocks), a layout change ([YBLOCK, XBLOCK] tiles: stores along
xindex, loads along yindex), persistent reduction (a [XBLOCK, RBLOCK] tile holds whole rows: load once, reduce,
run the epilogue from registers) and looped reduction (one pass over the row per dependency level of its
reductions, then one more for full-size epilogue outputs). `xindex`, `rindex` and `yindex` number the kernel's
dims in memory order (schedule's `Kernel.order`), so a column reduction's tile loads along the kept dims. Sizes
and strides are static and baked into the source, so every index is a constant expression of them. Values are
computed in fp32 for fp16/bf16 and rounded once on store; indices are int32 unless an offset can pass 2**31.
"""

import copy
import math
import os

import torch

from brrr.compile.codegen.shim import prelude
from brrr.compile.ir import mathops, nodes as ir
from brrr.compile.ir.indexing import Ix, Opaque, linear
from brrr.compile.codegen.spread import SpreadRoots
from brrr.compile.codegen.unrolled import UnrolledReductions
from brrr.compile.ir.sizes import cdiv, expr_text, hint, is_symbolic, known_true, next_pow2, symbols_in

PERSISTENT_MAX = 16384      # reduced elements per row held in registers at once
PERSISTENT_TILE = 2048      # elements of a persistent reduction's tile when rows are short
LOOPED_RBLOCK = 2048        # elements per step of a looped (long-row) reduction
COLUMN_PERSISTENT_MAX = 64  # a column reduction holds at most this many reduced elements per column at once
COLUMN_XBLOCK = 64          # columns per program of a column reduction: loads run along them, coalesced
COLUMN_RBLOCK = 32          # rows per step of a looped column reduction
COLUMN_SHORT_RBLOCK = 8     # ... of one over at least COLUMN_SHORT_MIN_X columns, whose grid alone keeps loads in
COLUMN_SHORT_MIN_X = 65536  # flight: channels_last BN statistics 29.5 us against 32.3 at 32 rows (1024 programs),
                            # while LLaMA's RMSNorm weight gradient (512 programs) took 65 us against 28 (NOTES)
COLUMN_MIN_RBLOCK = 8       # the fewest rows a looped column reduction steps; a shorter step that tiles the rows
                            # exactly is taken over a longer one that would mask every load
FEW_COLUMNS = 4096          # a column reduction over at most this many columns and ...
FEW_COLUMNS_RMAX = 1024     # ... at most this many rows holds its columns whole: more, shorter programs
UNROLL_MAX = 32             # a column reduction over at most this many elements (a pooling window) is unrolled
ACROSS_TILE = (32, 64)      # [XBLOCK, RBLOCK] of a row reduction that also reads an input across its rows
FEW_PROGRAMS = 512          # a looped column reduction with fewer [COLUMN_XBLOCK, 32] programs than this ...
FEW_PROGRAMS_TILE = (16, 64)  # ... walks [16, 64] tiles instead
ACROSS_MIN_X = 32 * 256     # ... given rows enough for 256 such tiles (fewer: lowering splits the reduction)
TILE_SIDE = 64              # a layout change's tile: 64 x 64 (longer on one side when the other is short)
TILE_ELEMENTS = 4096
TL = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
      torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
      torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}


def compute_dtype(dt):
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


def reciprocal_sqrt(v):
    """Op `v`, with 1 / sqrt(x) in fp32 as rsqrt(x): inference batch norm's decomposition divides per element
    (`1 / torch.sqrt(var + eps)`), and on an H200 that division held BN+ReLU at 85% of copy against 95% with
    rsqrt, which also lands closer to eager's kernel (benchmarks/NOTES.md). fp64 keeps the division."""
    if v.name == "reciprocal":
        inner = v.args[0]
    elif v.name == "div" and isinstance(v.args[0], ir.Const) and v.args[0].value == 1:
        inner = v.args[1]
    else:
        return v
    if not (isinstance(inner, ir.Op) and inner.name == "sqrt") or compute_dtype(v.dtype) != torch.float32 \
            or compute_dtype(inner.dtype) != torch.float32:
        return v
    return ir.Op("rsqrt", inner.args, v.dtype)


def op_names(nodes):
    """The ATen ops IR `nodes` compute, sorted, less the views that move no data (what explain lists)."""
    return sorted({o for n in nodes for o in n.ops if o not in ("view", "_unsafe_view", "alias")})


def exact_step(rows, rblock):
    """`rblock`, or the longest shorter step down to COLUMN_MIN_RBLOCK that divides a static `rows`: a loop whose
    steps tile its rows loads unmasked, and ptxas keeps several of those loads in flight."""
    if is_symbolic(rows):
        return rblock
    step = rblock
    while step > COLUMN_MIN_RBLOCK and rows % step:
        step //= 2
    return step if rows % step == 0 else rblock


class KernelSource:
    """the generated module for one kernel and what the runtime needs to launch it."""

    def __init__(self, name, source, args, grid, meta, ops, bytes_moved, stores, nodes=()):
        self.name, self.source, self.args, self.grid, self.meta = name, source, args, grid, meta
        self.ops, self.bytes, self.stores = ops, bytes_moved, stores
        self.nodes = tuple(nodes)   # the IR nodes computed inside the kernel (roots and inlined producers)
        self.symbols = []           # size symbols passed after the pointers (sizes.py), in the source's order
        self.work = None            # pricing.KernelWork: FLOPs, bytes, ATen ops, modules (compiled.generate_all)
        self.function = name        # the Triton function `source` defines: named after it (compiled.generate_all)


class Scope:
    def __init__(self, parent=None, indent="    "):
        self.lines, self.indent, self.parent = [], indent, parent
        self.cache = dict(parent.cache) if parent else {}
        self.rdep = dict(parent.rdep) if parent else {}


class Codegen(UnrolledReductions, SpreadRoots):
    def __init__(self, kernel, stored, load_stored, kernel_of, interpreted=False):
        self.k = kernel
        self.interpreted = interpreted       # kernels run in the Triton interpreter (TRITON_INTERPRET=1)
        self.stored = stored                 # nodes written to memory (by any kernel)
        self.load_stored = load_stored       # stored nodes produced by earlier kernels: load, don't recompute
        self.kernel_of = kernel_of
        self.inputs, self.outputs = {}, {}   # node -> pointer arg name
        self.helpers = set()
        self.counter = 0
        self.red_result = {}                 # in-kernel reduction -> tmp name (row-level)
        self.nan_aware = set()               # float max/min/argmax/argmin reductions: NaN wins, as in torch
        self.external_reduce_refs = set()    # reductions of other kernels this one loads
        self.ops = set()
        self.int64 = False

    def new_scope(self, indent="    "):
        return Scope(indent=indent)

    def tl_type(self, dtype):
        return TL[dtype]

    def aside(self):
        """A copy that writes source without touching this codegen's state (what unrolled.py counts)."""
        c = copy.copy(self)
        c.inputs, c.outputs, c.helpers, c.ops = dict(self.inputs), dict(self.outputs), set(self.helpers), set(self.ops)
        c.red_result, c.nan_aware = dict(self.red_result), set(self.nan_aware)
        c.external_reduce_refs = set(self.external_reduce_refs)
        return c

    # ------------------------------------------------------------------ values
    def tmp(self, scope, expr, rdep):
        if expr in scope.cache:
            return scope.cache[expr]
        self.counter += 1
        name = f"tmp{self.counter}"
        # a value the same for every reduced element (a shift, a per-row scale) is computed once per program,
        # before the loop: in the loop it cost channels_last batch-norm statistics a load per iteration
        home = scope.parent if scope.parent is not None and not rdep else scope
        home.lines.append(f"{home.indent}{name} = {expr}")
        for sc in (scope,) if home is scope else (scope, home):
            sc.cache[expr] = name
            sc.rdep[name] = rdep
        return name

    def ptr(self, node, table, prefix):
        if node not in table:
            table[node] = f"{prefix}{len(table)}"
        return table[node]

    def index(self, scope, ix):
        """rendered index and whether it depends on rindex."""
        rdep = [False]

        def name_of(b):
            if isinstance(b, Opaque):
                return "(" + b.ix.render(name_of) + ")"
            n, r = self.value(scope, b)
            rdep[0] |= r
            return n
        s = ix.render(name_of)
        rdep[0] |= any(isinstance(b, str) and "rindex" in b for b in ix.bases())
        return s, rdep[0]

    # Set per kernel once its block sizes are known: a mask that is true in every lane is left out, as when
    # rows of 1024 fill RBLOCK exactly (the loads and stores then need no predicate and no `other`).
    x_full = r_full = y_full = False

    def mask_for(self, rdep, xdep=True):
        """The mask of an access: xmask unless it does not depend on the row (`xdep`) or every row is in
        range, rmask when it depends on rindex and the last block is partial, ymask in a tiled kernel unless
        its tiles fit exactly. None when no lane is masked."""
        parts = []
        if xdep and not self.x_full:
            parts.append("xmask")
        if self.k.tile and not self.y_full:
            parts.append("ymask")
        if self.k.dims and rdep and not self.r_full:
            parts.append("rmask")
        return " & ".join(parts) or None

    def value(self, scope, v):
        """(name or literal, depends-on-rindex) of Value v, emitting lines into scope."""
        if isinstance(v, ir.Const):
            return literal(v.value, v.dtype), False
        if isinstance(v, ir.ReduceRef):
            r = v.node
            if r in self.red_result and self.k.is_current_row(v.idx, r.shape):
                return self.red_result[r], False
            if r not in self.kernel_of:
                raise RuntimeError(f"reduction {r.name} is read but never scheduled")
            self.external_reduce_refs.add(r)
            return self.value(scope, ir.Load(r, linear(v.idx, r.stride), r.dtype, v.mask))
        if isinstance(v, ir.Load):
            # a constant offset is added to the pointer last, so loads that differ only by it (a window's, a
            # shifted slice's) share one address and ptxas folds each offset into its load
            shift = v.index.const if v.index.terms and type(v.index.const) is int else 0
            idx, rdep = self.index(scope, Ix(v.index.terms) if shift else v.index)
            # an index of rindex and constants alone (weights of a norm) is the same for every row: one [1, RBLOCK]
            # load, broadcast, instead of one per row
            xdep = not self.k.dims or "xindex" in idx or "tmp" in idx
            mask = self.mask_for(rdep, xdep)
            if v.mask is not None and not self.is_row_bound(v.mask):
                m, mr = self.value(scope, v.mask)
                rdep |= mr
                base = self.mask_for(rdep)
                mask = f"{base} & ({m})" if base else f"({m})"
            p = self.ptr(v.buf, self.inputs, "in_ptr")
            if "xindex" not in idx and "rindex" not in idx and not any(not isinstance(b, str) for b in v.index.bases()):
                idx = f"{idx} + xindex * 0"   # a scalar: broadcast it to the block so the mask applies
            at = f"{self.tmp(scope, f'{p} + ({idx})', rdep)} + {shift}" if shift else f"{p} + ({idx})"
            expr = f"tl.load({at}, {mask}, other=0)" if mask else f"tl.load({at})"
            cdt = compute_dtype(v.dtype)
            if cdt != v.dtype:
                expr = self.widen(expr, v.dtype)
            return self.tmp(scope, expr, rdep), rdep
        if isinstance(v, ir.IndexValue):
            idx, rdep = self.index(scope, v.index)
            if "xindex" not in idx and "rindex" not in idx and all(isinstance(b, str) for b in v.index.bases()):
                idx = f"{idx} + xindex * 0"   # a constant index: a block, so masks built from it are blocks of int1
            return self.tmp(scope, f"({idx})", rdep), rdep
        if isinstance(v, ir.Rand):
            seed = self.ptr(v.seed_buf, self.inputs, "in_ptr")
            off, rdep = self.index(scope, v.offset)
            if "xindex" not in off and "rindex" not in off:
                off = f"{off} + xindex * 0"   # a 0-d output: one offset, in the block's shape
            s = self.tmp(scope, f"tl.load({seed})", False)
            return self.tmp(scope, f"tl.rand({s}.to(tl.uint32), ({off}).to(tl.uint32))", rdep), rdep
        if isinstance(v, ir.Op):
            if self.is_row_bound(v):
                return "True", False
            if v.name == "where" and self.is_row_bound(v.args[0]):
                return self.value(scope, v.args[1])
            v = reciprocal_sqrt(v)
            args = [self.value(scope, a) for a in v.args]
            rdep = any(r for _, r in args)
            expr = self.op(v, [a for a, _ in args], [a.dtype for a in v.args])
            if any(expr == a for a, _ in args):   # a cast that changes nothing in registers
                return expr, rdep
            return self.tmp(scope, expr, rdep), rdep
        raise TypeError(f"cannot render {v!r}")

    def op(self, v, a, dts):
        """Triton source for Op `v` over rendered operands `a` (dtypes `dts`), from brrr.compile.ir.mathops."""
        why = mathops.refusal(v)
        if why is not None:
            raise NotImplementedError(why)
        cdt = compute_dtype(v.dtype)
        n = v.name
        if n == "pow_scalar":
            return self.pow_scalar(a[0], float(v.args[1].value), cdt.is_floating_point)
        if n == "cast":
            src = compute_dtype(dts[0])
            if cdt == torch.bool:
                return f"{a[0]} != 0"
            return a[0] if src == cdt else f"tl.cast({a[0]}, {TL[cdt]})"
        if n == "round_to":
            return self.widen(self.narrow(a[0], v.dtype), v.dtype)
        template, helpers = mathops.template(n, mathops.operand_kind(dts))
        self.helpers.update(helpers)
        if helpers:   # shim helpers take tensors (shape, tl.where): a constant operand (2.0 ** x) becomes a
            # one-element one (0-d tensors break `&` with blocks in the interpreter)
            a = [f"tl.full([1], {x}, {TL[compute_dtype(c.dtype)]})" if isinstance(c, ir.Const) else x
                 for x, c in zip(a, v.args)]
        return template.format(*a)

    def narrow(self, x, dtype):
        """fp32 (or fp64) registers `x` as half type `dtype`, rounded to nearest even as eager and the GPU do.
        The Triton interpreter's own cast to bfloat16 truncates (and reads fp64 as an integer): under it the
        rounding is spelled out (shim.py), so CI checks what users run."""
        if dtype == torch.bfloat16 and self.interpreted:
            self.helpers.add("bf16_rne")
            return f"bf16_rne({x})"
        return f"tl.cast({x}, {TL[dtype]})"

    def widen(self, x, dtype):
        """The call expression `x` (a value of half type `dtype`) as fp32, exactly: the interpreter's own bf16
        conversion loses subnormals."""
        if dtype == torch.bfloat16 and self.interpreted:
            self.helpers.add("bf16_to_fp32")
            return f"bf16_to_fp32({x})"
        return f"{x}.to(tl.float32)"

    def pow_scalar(self, x, e, is_float):
        if e == int(e) and 0 <= e <= 4:
            return " * ".join([x] * int(e)) if e else ("1.0" if is_float else "1")
        if e == 0.5:
            return f"tl.sqrt({x})"
        if e == -0.5:
            return f"tl.rsqrt({x})"
        if e == -1:
            return f"1.0 / {x}"
        if e == -2:
            return f"1.0 / ({x} * {x})"
        self.helpers.add("pow")
        return f"pow({x}, {literal(e, torch.float32)})"

    # ------------------------------------------------------------------ kernel
    def store(self, scope, node, idx, value):
        name, rdep = value
        nan = node.meta.get("nan_wins")
        if nan:   # atomic max/min compare floats' bits: a NaN with the sign that wins, as torch's NaN does
            name = self.tmp(scope, f"tl.where({name} != {name}, {_nan_bits(nan, node.dtype)}, {name})", rdep)
        target = node.meta.get("atomic_into")
        if target is not None:   # a scatter (lowering/scatter.py): combine into the target buffer at a computed index
            p = self.ptr(target, self.outputs, "out_ptr")
            at = node.meta["atomic_index"](idx)
            off, ordep = self.index(scope, linear(at, target.stride, 0))
            mask = self.mask_for(ordep or rdep)   # in a reduction kernel, the lanes past the row's end add nothing
            if node.meta.get("atomic_mask") is not None:   # an index outside the target writes nothing
                inside, _ = self.value(scope, node.meta["atomic_mask"](idx))
                mask = f"{mask} & ({inside})" if mask else inside
            op = node.meta.get("atomic_op", "add")
            val = self.narrow(name, node.dtype) if node.dtype != compute_dtype(node.dtype) else name
            if op == "store":
                scope.lines.append(f"{scope.indent}tl.store({p} + ({off}), {val}{_mask_arg(mask)})")
            else:   # a half-type sum adds in its own type (lowering/scatter.py's accumulator)
                scope.lines.append(f"{scope.indent}tl.atomic_{op}({p} + ({off}), {val}{_mask_arg(mask)}, "
                                   f"sem='relaxed')")
            return
        p = self.ptr(node, self.outputs, "out_ptr")
        off, ordep = self.index(scope, linear(idx, node.stride, 0))
        if "xindex" not in off and "rindex" not in off:
            off = f"{off} + xindex * 0"   # a 0-d output: give the pointer the block's shape
        val = name
        if node.dtype != compute_dtype(node.dtype) or node.dtype == torch.bool:
            val = self.narrow(name, node.dtype) if node.dtype != torch.bool else f"({name}) != 0"
            if name in ("True", "False"):
                val = name
        scope.lines.append(f"{scope.indent}tl.store({p} + ({off}), {val}{_mask_arg(self.mask_for(ordep))})")

    def reduce_expr(self, r, acc, final):
        """the tl reduction of an [XBLOCK, RBLOCK] tile; `final` keeps a [XBLOCK, 1] result."""
        if r.rtype == "sum":
            e = f"tl.sum({acc}, 1)"
        elif r.rtype in ("max", "min"):
            if r in self.nan_aware:   # torch's max/min propagate NaN; tl.max/tl.min would skip it
                self.helpers.add(f"{r.rtype}_nan")
                e = f"tl.reduce({acc}, 1, {r.rtype}_nan)"
            else:
                e = f"tl.{r.rtype}({acc}, 1)"
        elif r.rtype == "prod":
            self.helpers.add("prod_combine")
            e = f"tl.reduce({acc}, 1, prod_combine)"
        elif r in self.nan_aware:   # argmax/argmin: torch picks the first NaN of a row that has one
            nan = f"({acc} != {acc}).to(tl.int32)"
            e = f"tl.where(tl.max({nan}, 1) > 0, tl.argmax({nan}, 1), tl.{r.rtype}({acc}, 1))"
        else:
            e = f"tl.{r.rtype}({acc}, 1)"
        return f"{e}[:, None]"

    def identity(self, r):
        acc = r.meta.get("acc_dtype", r.dtype)
        acc = compute_dtype(acc)
        if r.rtype in ("sum",):
            return "0"
        if r.rtype == "prod":
            return "1"
        big = "float('inf')" if acc.is_floating_point or r.rtype.startswith("arg") else str(
            torch.iinfo(acc).max if acc != torch.bool else 1)
        small = "float('-inf')" if acc.is_floating_point or r.rtype.startswith("arg") else str(
            torch.iinfo(acc).min if acc != torch.bool else 0)
        return big if r.rtype in ("min", "argmin") else small

    def acc_dtype(self, r):
        """The dtype reduction `r` accumulates in, in registers (bool as int32)."""
        cdt = compute_dtype(r.meta.get("acc_dtype", r.dtype))
        return torch.int32 if cdt == torch.bool else cdt

    def reduction_head(self, X, R):
        """The lines every reduction kernel opens with: its sizes and this program's rows."""
        i64 = ".to(tl.int64)" if self.int64 else ""
        return [f"    xnumel = {X}", f"    rnumel = {R}",
                f"    xoffset = tl.program_id(0){i64} * XBLOCK",
                "    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
                "    xmask = xindex < xnumel"]

    def pointwise_roots(self, roots):
        """A reduction kernel's pointwise roots: (per row, full size)."""
        rows = [r for r in roots if r.kind == "pointwise" and self.k.is_row(r)]
        return rows, [r for r in roots if r.kind == "pointwise" and not self.k.is_row(r)]

    def reduction_value(self, scope, r, idx):
        """The value reduction `r` reduces, at index `idx` of the space, in its accumulator's type."""
        value = r.body(idx)
        if value.dtype.is_floating_point and r.rtype in ("max", "min", "argmax", "argmin"):
            self.nan_aware.add(r)
        name, _ = self.value(scope, value)
        acc = compute_dtype(r.meta.get("acc_dtype", r.dtype))
        if acc == torch.bool:
            name = self.tmp(scope, f"tl.cast({name}, tl.int32)", True)
        elif not acc.is_floating_point and not r.rtype.startswith("arg"):
            # an index value is int32 in registers: reduce it in the IR's type (arg-reductions keep their values)
            name = self.tmp(scope, f"tl.cast({name}, {TL[acc]})", True)
        return name

    def reduction_input(self, scope, r):
        name = self.reduction_value(scope, r, self.k.full_index())
        mask = self.mask_for(True)
        if mask:
            return self.tmp(scope, f"tl.where({mask}, {name}, {self.identity(r)})", True)
        # no lane is masked, but a value that does not vary over the tile (a scalar) still needs the tile's shape
        return self.tmp(scope, f"tl.broadcast_to({name}, [XBLOCK, RBLOCK])", True)

    def finish_reduction(self, scope, r, reduced):
        acc = compute_dtype(r.meta.get("acc_dtype", r.dtype))
        if acc == torch.bool:
            reduced = f"({reduced}) != 0"
        self.red_result[r] = self.tmp(scope, reduced, False)

    def generate(self):
        k = self.k
        roots = list(k.roots)
        reds = [r for r in roots if r.kind == "reduction"]
        self.ops_nodes.update(reds)
        ir._RECORD.append(self.ops_nodes)
        try:
            body, meta = (self.gen_pointwise(roots) if not k.dims else self.gen_reduction(roots, reds))
        finally:
            ir._RECORD.pop()
        return body, meta

    ops_nodes = None

    def store_roots(self, scope, roots):
        """Each pointwise root computed at the kernel's flat index and stored (`xindex` and `xmask` named by the
        caller's head: a block of a pointwise kernel, or a matmul template's tile)."""
        idx = self.k.full_index()
        for r in roots:
            self.store(scope, r, idx, self.value(scope, r(idx)))

    def gen_pointwise(self, roots):
        k = self.k
        if k.tile:
            return self.gen_tiled(roots)
        n = k.xnumel()
        xblock = min(1024 if hint(n) < (1 << 22) else 2048, next_pow2(hint(n)))
        warps = 4 if xblock <= 1024 else 8
        self.x_full = known_true(n % xblock == 0)
        blocks = cdiv(n, xblock)
        members, body = self.root_lines(roots, blocks)
        pid = f"tl.program_id(0){'.to(tl.int64)' if self.int64 else ''}"
        head = [f"    xnumel = {n}"]
        if members > 1:
            head += [f"    pid = {pid}", f"    member = pid // {blocks}", f"    pid = pid % {blocks}"]
            pid = "pid"
        head += [f"    xoffset = {pid} * XBLOCK", "    xindex = xoffset + tl.arange(0, XBLOCK)",
                 "    xmask = xindex < xnumel"]
        return head + body, dict(XBLOCK=xblock, num_warps=warps, grid=(members * blocks,))

    def gen_tiled(self, roots):
        """A layout change: [YBLOCK, XBLOCK] tiles, xindex over the kernel's inner dims (the stores' contiguous
        side), yindex over the rest (where the main input is contiguous); Triton turns the tile around in
        shared memory so both sides coalesce."""
        k = self.k
        xn, yn = k.tile_numels()
        xblock = min(next_pow2(hint(xn)), TILE_SIDE)
        yblock = min(next_pow2(hint(yn)), max(TILE_SIDE, TILE_ELEMENTS // xblock))
        xblock = min(next_pow2(hint(xn)), max(xblock, TILE_ELEMENTS // yblock))
        self.x_full, self.y_full = known_true(xn % xblock == 0), known_true(yn % yblock == 0)
        xblocks = cdiv(xn, xblock)
        blocks = xblocks * cdiv(yn, yblock)
        members, body = self.root_lines(roots, blocks)
        i64 = ".to(tl.int64)" if self.int64 else ""
        head = [f"    xnumel = {xn}", f"    ynumel = {yn}", f"    pid = tl.program_id(0){i64}"]
        if members > 1:
            head += [f"    member = pid // {blocks}", f"    pid = pid % {blocks}"]
        head += [f"    xoffset = (pid % {xblocks}) * XBLOCK",
                 f"    yoffset = (pid // {xblocks}) * YBLOCK",
                 "    xindex = xoffset + tl.arange(0, XBLOCK)[None, :]",
                 "    yindex = yoffset + tl.arange(0, YBLOCK)[:, None]",
                 "    xmask = xindex < xnumel",
                 "    ymask = yindex < ynumel"]
        warps = 4 if xblock * yblock <= TILE_ELEMENTS else 8
        return head + body, dict(XBLOCK=xblock, YBLOCK=yblock, num_warps=warps, grid=(members * blocks,))

    def gen_reduction(self, roots, reds):
        k = self.k
        X, R = k.xnumel(), k.rnumel()
        # unrolled: a column reduction over a few elements, or a row one over a window a tile holds badly (several
        # reduced dims, recovered by div/mod of rindex, or a length not a power of two: NCHW 3x3 pooling)
        if not is_symbolic(R) and 0 < R <= UNROLL_MAX and not any(r.rtype.startswith("arg") for r in reds) \
                and (k.is_column() or len(k.dims) > 1 or R & (R - 1)):
            return self.gen_unrolled(roots, reds)
        # a row of symbolic length is looped: a block holding it whole would hold only rows up to its size
        rblock = next_pow2(max(hint(R), 1))
        inner_kept = k.is_column()
        persistent = not is_symbolic(R) and rblock <= (COLUMN_PERSISTENT_MAX if inner_kept else PERSISTENT_MAX)
        arg = any(r.rtype.startswith("arg") for r in reds)
        if arg and is_symbolic(R):
            raise NotImplementedError("an arg-reduction over a row of symbolic length")
        if arg or (inner_kept and hint(X) <= FEW_COLUMNS and rblock <= FEW_COLUMNS_RMAX and not is_symbolic(R)):
            # few columns (a split reduction's partials): looped, a handful of programs would each wait on one
            # load per step (the second kernel of channels_last batch-norm statistics: 4 programs, ~10 us)
            persistent = True
        # rows held whole leave a program 1-2 rows; an input read across them (a transposed gradient) would
        # then fetch a 32-byte sector per 2-byte element. Looped [32, 64] tiles read 64 bytes along the rows
        # for that input and 128 along them for the others, at the cost of a second pass over the rows.
        across = k.across and not inner_kept and persistent and not arg and hint(X) >= ACROSS_MIN_X \
            and hint(R) > ACROSS_TILE[1]
        if across:
            persistent = False
        if persistent:
            # tiles of ~2048 elements: the seed MLP's layer norm (rows of 1024, written over the matmul's output)
            # took 18.6 us as 2 rows x 4 warps, 21.4 as 4 rows x 8 warps (results/probes/...-66852fc-layer-norm-in-context.log)
            xblock = max(1, min(next_pow2(hint(X)), max(1, PERSISTENT_TILE // rblock),
                                COLUMN_XBLOCK if inner_kept else 4096))
        else:
            rblock = LOOPED_RBLOCK
            if inner_kept:   # an input also read along the rows (`across`) keeps 64-byte runs of it a step
                short = not k.across and hint(X) >= COLUMN_SHORT_MIN_X
                rblock = exact_step(R, COLUMN_SHORT_RBLOCK if short else COLUMN_RBLOCK)
            xblock = COLUMN_XBLOCK if inner_kept else 1
            if across:
                xblock, rblock = ACROSS_TILE if hint(X) >= ACROSS_TILE[0] * FEW_PROGRAMS else FEW_PROGRAMS_TILE
            elif inner_kept and hint(X) < COLUMN_XBLOCK * FEW_PROGRAMS:
                # columns enough for only a few hundred [64, 32] programs (a layer norm's backward over a
                # transposed gradient: 196 programs for 12544 rows) leave each SM a program or two waiting on
                # its loads; narrower, longer tiles give four times the programs, still a sector per load
                xblock, rblock = FEW_PROGRAMS_TILE
        tile = xblock * rblock
        warps = 2 if tile <= 256 else 4 if tile <= 2048 else 8 if tile <= 8192 else 16
        self.x_full, self.r_full = known_true(X % xblock == 0), known_true(R % rblock == 0) and known_true(R > 0)
        head = self.reduction_head(X, R)
        full_idx = k.full_index()
        rows, fulls = self.pointwise_roots(roots)
        s = Scope()
        if R == 0:   # empty rows: every reduction is its identity, and full-size outputs are empty
            for r in reds:
                cdt = compute_dtype(r.meta.get("acc_dtype", r.dtype))
                ident = self.identity(r) if cdt != torch.bool else ("1" if r.rtype == "min" else "0")
                self.finish_reduction(s, r, f"tl.full([XBLOCK, 1], {ident}, {TL[self.acc_dtype(r)]})")
            self.store_rows_and_reductions(s, reds, rows)
            return head + s.lines, dict(XBLOCK=xblock, RBLOCK=1, num_warps=warps, grid=(cdiv(X, xblock),))
        if persistent:
            s.lines.append("    rindex = tl.arange(0, RBLOCK)[None, :]")
            s.lines.append("    rmask = rindex < rnumel")
            for r in reds:
                t = self.reduction_input(s, r)
                self.finish_reduction(s, r, self.reduce_expr(r, t, True))
            self.store_rows_and_reductions(s, reds, rows)
            for r in fulls:
                self.store(s, r, full_idx, self.value(s, r(full_idx)))
            return head + s.lines, dict(XBLOCK=xblock, RBLOCK=rblock, num_warps=warps,
                                        grid=(cdiv(X, xblock),))
        levels = self.levels(reds)
        online = self.online_softmax_pairs(s, reds, levels)   # max reduction -> the sum of exp it feeds
        peel = None if online else self.peeled_rows(reds, xblock)
        if peel is not None:
            s.lines += [f"    chunk_rows = tl.maximum(tl.minimum(rnumel, {literal(peel[0], torch.int64)} - "
                        f"(xoffset // {k.shape[-1]}) * rnumel), 0)",
                        "    rfull = chunk_rows // RBLOCK * RBLOCK"]
        for lvl in sorted(set(levels.values())):
            group = [r for r in reds if levels[r] == lvl and r not in online.values()]
            if not group:
                continue
            accs = []
            for r in group:
                self.counter += 1
                acc = f"acc{self.counter}"
                s.lines.append(f"    {acc} = tl.full([XBLOCK, RBLOCK], {self.identity(r)}, {TL[self.acc_dtype(r)]})")
                accs.append(acc)
                if r in online:
                    s.lines.append(f"    {acc}_sum = tl.full([XBLOCK, RBLOCK], 0, tl.float32)")
            def accumulate(loop):
                for r, acc in zip(group, accs):
                    t = self.reduction_input(loop, r)
                    nan = ", propagate_nan=tl.PropagateNan.ALL" if r in self.nan_aware else ""
                    comb = {"sum": f"{acc} + {t}", "prod": f"{acc} * {t}",
                            "max": f"tl.maximum({acc}, {t}{nan})", "min": f"tl.minimum({acc}, {t}{nan})"}[r.rtype]
                    if r in online:   # running sum of exp(x - running max), rescaled whenever the max grows
                        loop.lines += [f"        {acc}_new = {comb}",
                                       f"        {acc}_sum = {acc}_sum * tl.where({acc}_new == float('-inf'), 1.0, "
                                       f"tl.exp({acc} - {acc}_new)) + tl.where({acc}_new == float('-inf'), 0.0, "
                                       f"tl.exp({t} - {acc}_new))"]
                        comb = f"{acc}_new"
                    loop.lines.append(f"        {acc} = {comb}")
                s.lines.extend(loop.lines)
            if peel is None:
                accumulate(self.loop(s))
            else:   # the chunk's whole steps with no mask, then at most one masked step
                full_rows, self.r_full, self.row_bound = self.r_full, True, peel
                try:
                    accumulate(self.loop(s, "0", "rfull", masked=False))
                finally:
                    self.r_full, self.row_bound = full_rows, None
                accumulate(self.loop(s, "rfull", "chunk_rows"))
            for r, acc in zip(group, accs):
                self.finish_reduction(s, r, self.reduce_expr(r, acc, True))
                if r in online:
                    row_max = self.red_result[r]
                    self.finish_reduction(s, online[r], f"tl.sum(tl.where({row_max} == float('-inf'), 0.0, "
                                                        f"{acc}_sum * tl.exp({acc} - {row_max})), 1)[:, None]")
        self.store_rows_and_reductions(s, reds, rows)
        if fulls:
            loop = self.loop(s)
            for r in fulls:
                self.store(loop, r, full_idx, self.value(loop, r(full_idx)))
            s.lines.extend(loop.lines)
        return head + s.lines, dict(XBLOCK=xblock, RBLOCK=rblock, num_warps=warps, grid=(cdiv(X, xblock),))

    def combine(self, r, a, b):
        """Source combining two partial results of reduction `r` (sum, prod, max, min)."""
        if r.rtype in ("max", "min"):
            nan = ", propagate_nan=tl.PropagateNan.ALL" if r in self.nan_aware else ""
            return f"tl.{'maximum' if r.rtype == 'max' else 'minimum'}({a}, {b}{nan})"
        return f"{a} {'+' if r.rtype == 'sum' else '*'} {b}"

    def online_softmax_pairs(self, s, reds, levels):
        """{max reduction M: sum reduction S} where S sums exp(x - M) over the same x (softmax, log_softmax,
        logsumexp). A looped kernel then keeps a running max and a running sum of exp in one pass (rescaling
        the sum when the max grows) instead of one pass for the max and another for the sum: rows too long
        for registers are read twice instead of three times."""
        full = self.k.full_index()
        pairs, scratch = {}, Scope(s)
        for r in reds:
            if r.rtype != "sum" or levels[r] != 1 or compute_dtype(r.meta.get("acc_dtype", r.dtype)) != torch.float32:
                continue
            e = _strip_casts(r.body(full))
            if not (isinstance(e, ir.Op) and e.name == "exp"):
                continue
            d = _strip_casts(e.args[0])
            if not (isinstance(d, ir.Op) and d.name == "sub"):
                continue
            ref = _strip_casts(d.args[1])
            m = ref.node if isinstance(ref, ir.ReduceRef) else None
            if m is None or m not in reds or m in pairs or m.rtype != "max" or levels[m] != 0 \
                    or compute_dtype(m.meta.get("acc_dtype", m.dtype)) != torch.float32 \
                    or not self.k.is_current_row(ref.idx, m.shape):
                continue
            # the same x: both render to the same temporary (a scope caches identical expressions)
            if self.value(scratch, d.args[0])[0] == self.value(scratch, m.body(full))[0]:
                pairs[m] = r
        return pairs

    def loop(self, s, start="0", stop="rnumel", masked=True):
        loop = Scope(s, "        ")
        loop.lines += [f"    for roffset in range({start}, {stop}, RBLOCK):",
                       "        rindex = roffset + tl.arange(0, RBLOCK)[None, :]"]
        if masked:
            loop.lines.append("        rmask = rindex < rnumel")
        return loop

    # A column split's partial whose last chunk ends early (static rows that no chunk count near the target
    # tiles) masks every load with `row < rows`; its loop of a constant trip count then compiles to one 8-byte
    # load in flight per thread (sm_90 SASS). Where a program's columns lie in one chunk, the loop instead walks
    # the chunk's own whole steps unmasked and at most one masked step after them: [12608, 3072] bf16 column sums
    # 39.7 -> 26.4 us on an H200. Symbolic rows keep the masked loop: its runtime trip count already kept three
    # loads in flight, and the walk measured slower there (17.9 -> 25.5 us at 8192 rows; NOTES).
    row_bound = None   # (rows, the row's index) while the unmasked steps render: `row < rows` is known true

    def peeled_rows(self, reds, xblock):
        """(rows, the row's index) of a looped column split's partial whose static chunks do not tile its rows,
        when each program's columns lie in one chunk; else None."""
        marks = {r.meta.get("chunk_rows") for r in reds}
        kept = self.k.shape[-1] if len(self.k.shape) == 3 else None
        if len(marks) != 1 or None in marks or not self.k.is_column() or self.r_full or kept is None \
                or is_symbolic(kept) or kept % xblock:
            return None
        rows, chunk = next(iter(marks))
        if is_symbolic(rows) or is_symbolic(chunk):
            return None
        c, b = self.k.full_index()[:2]
        return rows, Ix.of(c) * chunk + b   # the row lowering.core.split_reduction bounds, at this kernel's index

    def is_row_bound(self, v):
        """Whether `v` is the split's `row < rows` (lowering.core.split_reduction) while the unmasked steps render."""
        if self.row_bound is None or not isinstance(v, ir.Op) or v.name != "lt":
            return False
        rows, row_index = self.row_bound
        row, bound = v.args
        return isinstance(bound, ir.Const) and bound.value == rows and isinstance(row, ir.IndexValue) \
            and row.index == row_index

    def store_rows_and_reductions(self, s, reds, rows):
        row_idx = None
        for r in reds:
            if r in self.stored:
                ridx = self.k.row_index(r.shape)
                self.store(s, r, ridx, (self.red_result[r], False))
        for r in rows:
            row_idx = self.k.row_index(r.shape)
            self.store(s, r, row_idx, self.value(s, r(row_idx)))

    def levels(self, reds):
        out = {}
        full = self.k.full_index()
        for r in reds:
            lvl = 0
            for v in ir.walk(r.body(full)):
                if isinstance(v, ir.ReduceRef) and v.node in out:
                    lvl = max(lvl, out[v.node] + 1)
            out[r] = lvl
        return out


def _strip_casts(v):
    while isinstance(v, ir.Op) and v.name == "cast" and v.dtype.is_floating_point:
        v = v.args[0]
    return v


def _nan_bits(op, dtype):
    """A quiet NaN of `dtype` that atomic `op` (max or min, on floats' bits as integers) always keeps: positive for
    max, negative for min."""
    bits = {(torch.float32, "max"): 0x7fc00000, (torch.float32, "min"): -0x400000,
            (torch.float64, "max"): 0x7ff8000000000000, (torch.float64, "min"): -0x8000000000000}[(dtype, op)]
    ints = "tl.int32" if dtype == torch.float32 else "tl.int64"
    return f"tl.full([1], {bits}, {ints}).to({TL[dtype]}, bitcast=True)"


def _mask_arg(mask):
    return f", {mask}" if mask else ""


def literal(x, dtype):
    """Python source for constant `x` as a value of `dtype` (a bool filling a float tensor is 1.0, not True:
    stored as True into bfloat16 it was the bit pattern 1)."""
    if dtype == torch.bool:
        return "True" if x else "False"
    if dtype.is_floating_point:
        x = float(x)
        if math.isnan(x):
            return "float('nan')"
        if math.isinf(x):
            return "float('inf')" if x > 0 else "float('-inf')"
        return repr(x)
    return expr_text(x)


def generate(kernel, stored, load_stored, kernel_of):
    """Triton source for `kernel`; returns KernelSource (args: nodes in pointer order)."""
    cg = Codegen(kernel, stored, load_stored, kernel_of, interpreted=os.environ.get("TRITON_INTERPRET") == "1")
    cg.ops_nodes = set()
    prev = ir.LOAD_STORED
    ir.LOAD_STORED = load_stored
    try:
        for attempt in (0, 1):
            cg.int64 = attempt == 1
            cg.inputs, cg.outputs, cg.helpers, cg.counter, cg.red_result = {}, {}, set(), 0, {}
            cg.external_reduce_refs = set()
            body, meta = cg.generate()
            if not cg.int64 and needs_int64(kernel, cg):
                continue
            break
    except Exception as e:
        e.brrr_rendered = tuple(cg.ops_nodes)   # what a re-plan must run as ATen (fallbacks.KernelFailed)
        raise
    finally:
        ir.LOAD_STORED = prev
    args = list(cg.inputs) + list(cg.outputs)
    names = [cg.inputs[a] for a in cg.inputs] + [cg.outputs[a] for a in cg.outputs]
    # size symbols the body names are arguments after the pointers; never specialized (a value of 1, or
    # divisible by 16, must not pick a kernel the next call's sizes would break)
    symbols = symbols_in("\n".join(body))
    consts = ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if kernel.dims else []) + \
        (["YBLOCK: tl.constexpr"] if kernel.tile else [])
    sig = ", ".join(names + symbols + consts)
    comment = f"# kernel {kernel.name}: iteration space {list(kernel.shape)}"
    if kernel.dims:
        comment += f", reducing dims {list(kernel.dims)}"
    if kernel.loop_order() != tuple(reversed(range(len(kernel.shape)))):
        comment += f", dims walked innermost first {list(kernel.loop_order())}"
    if kernel.tile:
        comment += f", tiles of dims {list(kernel.loop_order()[:kernel.tile])} (x) by the rest (y)"
    src = "\n".join(["import triton", "import triton.language as tl", "", comment, prelude(cg.helpers), "",
                     f"@triton.jit{f'(do_not_specialize={symbols})' if symbols else ''}",
                     f"def {kernel.name}({sig}):"] + body) + "\n"
    out = KernelSource(kernel.name, src, args, meta.pop("grid"), meta, op_names(cg.ops_nodes), 0,
                       list(cg.outputs), sorted(cg.ops_nodes, key=lambda n: n.name))
    out.symbols = symbols
    return out, cg.external_reduce_refs


def needs_int64(kernel, cg):
    limit = 2 ** 31 - 1
    if kernel.xnumel() * max(kernel.rnumel(), 1) >= limit // 2:
        return True
    for node in list(cg.inputs) + list(cg.outputs):
        if node.kind == "buffer" and node.producer == "seed":
            continue
        extent = node.offset + sum((s - 1) * st for s, st in zip(node.shape, node.stride) if s > 0)
        if extent >= limit // 2:
            return True
    return False
