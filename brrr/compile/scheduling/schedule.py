"""Fusion: which IR nodes share a kernel and which are stored (lower -> **schedule** -> codegen -> runtime).

Pointwise nodes are functions, so they are inlined into whoever reads them (vertical fusion for free); a node
gets a buffer only when it must: graph output, input to an Extern/Fallback (views of a stored tensor stay ATen
views), or several consumers in different iteration spaces where recomputing costs more bytes than storing it
(brrr.cost decides). The "roots" - stored pointwise nodes and every reduction - are then packed, in order, into
kernels that share an iteration space: a pointwise space `S`, or a reduction space `(S, dims)` that also takes
pointwise prologues/epilogues of shape `S` and per-row outputs (softmax, layer norm: one kernel). Each refusal
is recorded with its reason for explain.

Each kernel walks its space in memory order (`Kernel.order`, chosen by brrr.compile.scheduling.layout when the kernel
is made), and every buffer's strides are fixed as its kernel takes it, so later kernels read it as it will be.
Kernels are named after what they fuse (brrr.compile.scheduling.naming) once packing is done.
"""

from dataclasses import dataclass, field

from brrr.compile.ir import mathops, nodes as ir
from brrr.compile.ir.indexing import Ix, contiguous_strides, linear, unflatten
from brrr.compile.ir.sizes import hint, same
from brrr.compile.scheduling import layout
from brrr.compile.scheduling.naming import kernel_name


@dataclass(eq=False)
class Kernel:
    name: str
    shape: tuple                       # the iteration space S
    dims: tuple = ()                   # reduced dims of S (empty: pointwise kernel)
    roots: list = field(default_factory=list)
    closed: bool = False               # takes no other roots (an accumulating scatter and its init)
    alone: bool = False                # takes no other roots: a value the floor split out (runtime/floor.py)
    order: tuple = ()                  # dims of S innermost first: the memory order the flat index walks
    tile: int = 0                      # pointwise layout change: order[:tile] walk xindex, the rest yindex
    across: bool = False               # a reduction that also reads a large input against its memory order:
    #                                    along the kept dims (a row reduction), or the reduced ones (a column one)
    members: list = field(default_factory=list)   # every IR node it computes (roots and what they inline)

    @property
    def is_reduction(self):
        return bool(self.dims)

    def loop_order(self):
        return self.order or layout.row_major(len(self.shape))

    def kept(self):
        return tuple(s for d, s in enumerate(self.shape) if d not in self.dims)

    def reduced(self):
        return tuple(s for d, s in enumerate(self.shape) if d in self.dims)

    def xnumel(self):
        return _prod(self.kept())

    def rnumel(self):
        return _prod(self.reduced()) if self.dims else 1

    def is_column(self):
        """A reduction whose innermost dim in memory is kept: neighbouring rows sit side by side in memory,
        so a tile loads along the kept dims (xindex) and reduces along rindex."""
        inner = layout.innermost(self.shape, self.loop_order())
        return bool(self.dims) and inner is not None and inner not in self.dims

    def tile_numels(self):
        """(x extent, y extent) of a tiled kernel's [YBLOCK, XBLOCK] tiles."""
        order = self.loop_order()
        return _prod(self.shape[d] for d in order[:self.tile]), _prod(self.shape[d] for d in order[self.tile:])

    def groups(self):
        """(index variable, its extent, the dims it unflattens over, innermost first)."""
        order = self.loop_order()
        if self.tile:
            (xn, yn) = self.tile_numels()
            return (("xindex", xn, order[:self.tile]), ("yindex", yn, order[self.tile:]))
        return (("xindex", self.xnumel(), [d for d in order if d not in self.dims]),
                ("rindex", self.rnumel(), [d for d in order if d in self.dims]))

    def full_index(self, reduced_at=None):
        """Ix per dim of S: the kept dims unflatten xindex, the reduced dims rindex (a tiled layout change:
        the inner dims xindex, the outer yindex), each in memory order. `reduced_at`, an int, puts the reduced
        dims at that one flat position instead of rindex (a reduction unrolled in the source)."""
        idx = [Ix()] * len(self.shape)
        for var, numel, group in self.groups():
            if not group:
                continue
            flat = Ix.of(reduced_at) if var == "rindex" and reduced_at is not None else Ix.var(var, numel)
            sub = unflatten(flat, [self.shape[d] for d in group], tuple(range(len(group))))
            for d, i in zip(group, sub):
                idx[d] = i
        return idx

    def _row_dims(self, shape):
        """{dim of S: dim of `shape`} for a per-row node: its sizes > 1 are the kept sizes > 1, in order."""
        kept = [d for d in range(len(self.shape)) if d not in self.dims and self.shape[d] != 1]
        return dict(zip(kept, [j for j, s in enumerate(shape) if s != 1]))

    def row_index(self, shape, full=None):
        """Ix per dim of a per-row node of `shape` (same non-1 sizes as the kept dims), taken from `full`, an Ix
        per dim of S (default: `full_index`)."""
        full, idx = self.full_index() if full is None else full, [Ix()] * len(shape)
        for d, j in self._row_dims(shape).items():
            idx[j] = full[d]
        return idx

    def row_strides(self, shape):
        """Strides of a dense per-row node of `shape` laid out as this kernel walks its rows: its row index
        times these strides is the plain xindex (a stored reduction writes contiguously)."""
        rows = self._row_dims(shape)
        order = [rows[d] for d in self.loop_order() if d in rows]
        return layout.dense_strides(shape, order + [j for j in range(len(shape)) if j not in order])

    def probe(self, node):
        """The index at which to evaluate root `node` for layout's probes: layout.dim_vars of S, a per-row
        pointwise root taking those of the kept dims at its own dims (its rank may differ from S's)."""
        space = layout.dim_vars(self.shape)
        return self.row_index(node.shape, space) if node.kind == "pointwise" and self.is_row(node) else space

    def is_current_row(self, idx, shape):
        """Whether per-row index `idx` (into `shape`) is the row this kernel's program is computing."""
        return linear(idx, self.row_strides(shape)) == Ix.var("xindex", self.xnumel())

    def index_for(self, node):
        """the index at which `node` is computed in this kernel, or None when it does not fit."""
        if node.kind == "reduction":
            return self.full_index() if same(node.src_shape, self.shape) and node.dims == self.dims else None
        if same(node.shape, self.shape):
            return self.full_index()
        if self.dims and same(_squeeze(node.shape), _squeeze(self.kept())):
            return self.row_index(node.shape)
        return None

    def is_row(self, node):
        return node.kind == "reduction" or (self.dims and not same(node.shape, self.shape))


def _prod(xs):
    n = 1
    for x in xs:
        n *= x
    return n


def _squeeze(shape):
    return tuple(s for s in shape if s != 1)


def load_bytes(node, accessed):
    """bytes a kernel reading `accessed` elements of `node` moves: brrr.cost's touched bytes of the buffer,
    capped by what the kernel can touch (a gather reads a few rows of a large table). A price, so at the hint
    sizes: a comparison of symbolic sizes would add a guard."""
    from brrr.cost.ops import nbytes_touched, tensor_bytes
    fake = node.meta["fake"]
    return min(hint(tensor_bytes(fake)), hint(nbytes_touched((accessed,), (1,), fake.element_size())))


class Reason:
    """A refusal's text, rendered once kernels carry their final names (`{}` stands for each kernel's)."""

    def __init__(self, text, *kernels):
        self.text, self.kernels = text, kernels

    def __str__(self):
        return self.text.format(*(k.name for k in self.kernels))

    def naming(self, stand_in, kernel):
        """The same reason about `kernel` where it spoke of `stand_in` (a pointwise kernel tried as a prologue)."""
        return Reason(self.text, *(kernel if k is stand_in else k for k in self.kernels))


@dataclass
class Plan:
    steps: list                  # ("kernel", Kernel) | ("aten", Node)
    stored: set                  # nodes that get a buffer written by a kernel
    refusals: list               # (node, reason: str or Reason, rendered with the kernels' final names)
    lowering: object


class Scheduler:
    def __init__(self, L, split=()):
        self.L = L
        self.split = frozenset(split)   # FX nodes whose values start kernels of their own (runtime/floor.py)
        self.nodes = [n for n in L.nodes if n is not None]
        self.steps = []
        self.position = {}         # node -> index of the step that produces it
        self.kernel_of = {}        # root -> Kernel
        self.stored = set()
        self.visible = set()       # stored nodes something outside the kernels sees: they keep eager's strides
        self.host_views = set()
        self.refusals = []

    # ------------------------------------------------------------------ what must have memory
    def require(self, node):
        if not isinstance(node, ir.Node) or node.kind == "buffer" or node in self.host_views:
            return
        if ir.is_host_view(node):
            self.host_views.add(node)
            self.require(node.view_of)
            return
        self.stored.add(node)
        self.visible.add(node)

    def required(self):
        for o in self.L.outputs:
            self.require(o)
        for n in self.nodes:
            if n.kind == "buffer" and n.producer in ("extern", "fallback"):
                for a in _fx_inputs(n, self.L):
                    self.require(a)
            elif n.fx in self.split and n.kind == "pointwise" and n.view_of is None:
                self.stored.add(n)
                self.refusals.append((n, "stored: the fused kernel reading it measured slower than this split"))
        self.recompute_or_store()

    def recompute_or_store(self):
        """Which pointwise nodes read by several kernels get a buffer instead of being recomputed by each.

        Bytes: a node read by consumers in k different iteration spaces (or stages, `extern_stages`) is stored
        when in_bytes + out_bytes * k <= k * in_bytes (brrr.cost's tensor_bytes for each side). Stored, it is
        computed in one of those spaces (whose read is then free), written once and read by the k - 1 others.
        Nodes are decided in graph order and a node's reads count what is already stored as one load, so a
        chain such as a residual stream (x1 = x0 + a, x2 = x1 + b, ...) is not re-derived from its start in
        every layer: each layer would read one more tensor than the last. A tie stores: the same bytes, and the
        kernels that read it stay short.

        Compute: a node whose value takes a long math routine (mathops.is_long: a sine, an exponential) and that
        a consumer reads through a broadcast is evaluated once per element of the consumer, not of the node. A
        rotary embedding's cos and sin of [positions, dims] angles, inlined into the backward over [batch,
        positions, heads, 3 x head dim], were evaluated 1152 times each (194 us a layer in GPT-NeoX's backward
        on an H100, against ~36 us for the bytes). Such a node is stored once the consumers' extra evaluations
        reach BROADCAST_EVALS, enough to pay for the small kernel that computes it."""
        from brrr.cost.ops import tensor_bytes
        stage = self.extern_stages()
        users = {}
        for n in self.nodes:
            if n.kind == "buffer" or n.fx is None:
                continue
            for u in n.fx.users:
                for un in _ir_of(self.L, u):
                    users.setdefault(n, set()).add((_space(un), stage.get(u, 0)))
        prev, ir.LOAD_STORED = ir.LOAD_STORED, self.stored   # grows as nodes are decided
        try:
            for n, spaces in users.items():
                if n.kind != "pointwise" or n.view_of is not None or n in self.stored:
                    continue
                extra = max(_numel(space) for space, _ in spaces) - hint(n.numel)
                if extra < BROADCAST_EVALS and len(spaces) < 2:
                    continue
                values = list(ir.walk(n(unflatten(Ix.var("xindex", max(n.numel, 1)), n.shape))))
                long_ops = sorted({v.name for v in values if isinstance(v, ir.Op) and mathops.is_long(v.name)}) \
                    if extra >= BROADCAST_EVALS else ()
                if long_ops:
                    self.stored.add(n)
                    self.refusals.append((n, f"stored: a consumer would evaluate its {', '.join(long_ops)} "
                                             f"{extra} more times than it has elements"))
                    continue
                if len(spaces) < 2:
                    continue
                reads = {v.buf: load_bytes(v.buf, n.numel) for v in values if isinstance(v, ir.Load)}
                in_b, out_b, k = sum(reads.values()), hint(tensor_bytes(n.meta["fake"])), len(spaces)
                if in_b + out_b * k <= k * in_b:
                    self.stored.add(n)
                    self.refusals.append((n, f"stored: read by {k} iteration spaces; recomputing would move "
                                             f"{k * in_b} bytes, storing {in_b + out_b * k}"))
        finally:
            ir.LOAD_STORED = prev

    def extern_stages(self):
        """{FX node: how many ATen calls (Extern/Fallback) lie on its longest path from the inputs}. Two readers
        of one space at different stages sit in different kernels (one reads what an ATen call made after the
        other's kernel), so for recompute_or_store they count as two spaces: a residual stream's add and the
        layer norm of the same tensor are split by the layer's matmuls."""
        stage = {}
        for fx in self.L.gm.graph.nodes:
            s = max((stage.get(a, 0) for a in fx.all_input_nodes), default=0)
            if any(v.kind == "buffer" and v.producer in ("extern", "fallback") for v in _ir_of(self.L, fx)):
                s += 1
            stage[fx] = s
        return stage

    # ------------------------------------------------------------------ packing roots into kernels
    def evaluate(self, kernel, node, idx):
        """(value, nodes it inlines): `node` at `idx` as `kernel` would compute it, loading what other kernels
        store instead of recomputing it."""
        ident = self.kernel_of.get(next(iter(kernel.roots), None)) or kernel
        prev = ir.LOAD_STORED
        ir.LOAD_STORED = {n for n, k in self.kernel_of.items() if n.kind == "pointwise" and k is not ident}
        ir._RECORD.append(set())
        try:
            value = node.body(idx) if node.kind == "reduction" else node.fn(list(idx))
        finally:
            inlined = ir._RECORD.pop()
            ir.LOAD_STORED = prev
        return value, inlined

    def deps(self, kernel, node, idx):
        """(ok, reason, nodes inlined): can `node`, computed at `idx`, live in `kernel` (at its step position)?"""
        pos = self.position.get(kernel, len(self.steps))
        value, inlined = self.evaluate(kernel, node, idx)
        for v in ir.walk(value):
            if isinstance(v, ir.Load):
                if self.position.get(v.buf, -1) >= pos and v.buf.producer not in ("input", "seed", "constant"):
                    return False, Reason(f"reads {v.buf.name}, produced after kernel {{}}", kernel), inlined
            elif isinstance(v, ir.ReduceRef):
                r = v.node
                if self.kernel_of.get(r) is kernel:
                    if not kernel.is_row(node) and node.kind == "reduction" and r is node:
                        continue
                    if not kernel.is_current_row(v.idx, r.shape):
                        return False, Reason(f"reads reduction {r.name} of kernel {{}} at another row", kernel), \
                            inlined
                elif self.kernel_of.get(r) is None or self.position[self.kernel_of[r]] >= pos:
                    return False, Reason(f"reads reduction {r.name} not computed before kernel {{}}", kernel), \
                        inlined
        return True, "", inlined

    # ------------------------------------------------------------------ memory order and strides
    def open_kernel(self, kernel, node):
        """Give a new kernel its first root: its order (`order_for`), then the root."""
        value, inlined = self.evaluate(kernel, node, layout.dim_vars(kernel.shape))
        kernel.order = self.order_for(node, kernel, value)
        self.add_root(kernel, node, inlined)

    def order_for(self, node, kernel, value):
        """The order a new kernel walks its space in, from its first root (`value`: the root built at
        layout.dim_vars): eager's layout of a stored node something outside sees, else the layout of the
        largest tensor it reads, else eager's layout of the node, else row-major; a reduction something outside
        sees walks its kept dims in its output's layout. Split reductions name the order of their synthetic
        spaces themselves."""
        shape = kernel.shape
        if node.meta.get("order") is not None:
            return tuple(node.meta["order"])
        order = self.scatter_order(node, shape)
        if order is not None:
            return order
        if node.kind == "pointwise" and node in self.visible:
            order = layout.fake_order(node, shape)
            if order is not None:
                return order
        order = layout.largest_input_order(value, shape)
        if order is None and node.kind == "pointwise":
            order = layout.fake_order(node, shape)
        order = order or layout.row_major(len(shape))
        if node.kind == "reduction" and node in self.visible:   # the kept dims as eager stores the result
            stored = layout.fake_order(node, node.shape)
            if stored is not None:
                order = layout.with_kept_order(order, shape, node.dims, node.shape, stored)
        return order

    @staticmethod
    def scatter_order(node, shape):
        """The order of a scatter's values (lowering/scatter.py) where one of their dims runs along the target's
        contiguous dim: the target's layout along its rows, the rows themselves (the index list) outermost, so
        neighbouring lanes combine into neighbouring addresses of one row. By its largest input, a GAT layer's messages
        ([550000 edges, 40]) walked the edges innermost, each lane's atomic add and gather in another row."""
        target = node.meta.get("atomic_into")
        if target is None:
            return None
        strides = target.stride or contiguous_strides(target.shape)
        address = linear(node.meta["atomic_index"](layout.dim_vars(shape)), strides, 0)
        along = layout.access_strides(address, len(shape))
        inner = min((hint(s) for s, n in zip(strides, target.shape) if s and hint(n) > 1), default=None)
        if inner is None or not any(s is not None and hint(s) == inner for s, n in zip(along, shape) if hint(n) > 1):
            return None   # the index picks positions along the target's contiguous dim (scatter along dim -1)
        return layout.order_of([s if s is not None else 0 for s in along], shape)

    def assign_strides(self, node, kernel):
        """Strides of a root's buffer, fixed here so later kernels read it as it will be: eager's where
        something outside the kernels sees it, else dense in the order its kernel writes it."""
        fake = node.meta.get("fake")
        if node in self.visible and hasattr(fake, "stride") and same(fake.shape, node.shape):
            node.stride = tuple(fake.stride())
        elif kernel.is_row(node):
            node.stride = kernel.row_strides(node.shape)
        else:
            node.stride = layout.dense_strides(node.shape, kernel.loop_order())

    def place(self, node):
        kernels = [s for kind, s in self.steps if kind == "kernel"]
        last_reason = None
        for k in reversed(kernels):
            if k.closed or k.alone or node.fx in self.split:
                continue
            idx = k.index_for(node)
            upgrade = None
            if idx is None and node.kind == "reduction" and not k.dims and same(k.shape, node.src_shape):
                # a pointwise kernel becomes its prologue
                upgrade = Kernel(k.name, k.shape, node.dims, k.roots, order=k.order)
                idx = upgrade.full_index()
            if idx is None:
                last_reason = last_reason or Reason(
                    f"iteration space {_space(node)} differs from kernel {{}}'s "
                    f"{list(k.shape)}{' over ' + str(list(k.dims)) if k.dims else ''}", k)
                continue
            target = upgrade or k
            why = self.walks_across(k, node) if upgrade is None else None
            if why is not None:
                last_reason = why
                continue
            if upgrade is not None:
                self.position[upgrade] = self.position[k]
                ok = all(self.deps(upgrade, r, upgrade.index_for(r))[0] for r in k.roots)
                if not ok:
                    continue
            ok, why, inlined = self.deps(target, node, idx)
            if not ok:
                last_reason = why.naming(upgrade, k) if upgrade is not None and isinstance(why, Reason) else why
                continue
            if upgrade is not None:
                k.dims = node.dims
                self.position.pop(upgrade, None)
            self.add_root(k, node, inlined)
            self.position[node] = self.position[k]
            return
        k = Kernel(f"k{len(kernels)}", tuple(node.src_shape if node.kind == "reduction" else node.shape),
                   node.dims if node.kind == "reduction" else ())
        if kernels and last_reason:
            self.refusals.append((node, last_reason))
        k.alone = node.kind == "pointwise" and node.fx in self.split
        self.position[k] = len(self.steps)
        self.position[node] = len(self.steps)
        self.steps.append(("kernel", k))
        self.open_kernel(k, node)

    def walks_across(self, kernel, node):
        """Why a full-size pointwise node should not join reduction `kernel`, or None. A reduction kernel's
        lanes walk its own innermost dim; a node stored or read mostly along another kept dim (a layer norm's
        input gradient beside a bias gradient over a transposed gradient) would then touch a 32-byte sector per
        element. Alone, it is a pointwise kernel whose tiles run along both layouts."""
        if not kernel.dims or node.kind != "pointwise" or not same(node.shape, kernel.shape):
            return None
        order = layout.fake_order(node, node.shape) if node in self.visible else None
        if order is None:
            order = layout.largest_input_order(self.evaluate(kernel, node, layout.dim_vars(kernel.shape))[0],
                                               kernel.shape)
        mine = layout.innermost(kernel.shape, kernel.loop_order())
        theirs = layout.innermost(kernel.shape, order) if order is not None else None
        if theirs is None or mine is None or mine == theirs or theirs in kernel.dims:
            return None
        return Reason(f"walks dim {theirs} innermost; kernel {{}} walks dim {mine}", kernel)

    def add_root(self, kernel, node, inlined):
        kernel.roots.append(node)
        kernel.members.extend([node] + sorted(inlined - set(kernel.members), key=lambda n: n.name))
        self.kernel_of[node] = kernel
        self.assign_strides(node, kernel)

    def choose_tiles(self):
        """A pointwise kernel with a large input (touching at least half its elements) whose innermost dim is not
        the kernel's loads and stores through [YBLOCK, XBLOCK] tiles (layout.tile_split), even beside a larger
        input walked in order: the stem's ReLU backward read its channels_last input at a stride of 64 elements
        beside an NCHW gradient, 0.79 ms for 925 MB, where a tile moves it at the copy roof. A
        reduction that reads a large input against its own order (`Kernel.across`) gets tiles wide both ways."""
        for kind, k in self.steps:
            if kind == "kernel" and k.dims and not k.closed:
                against = layout.reads_along_rows if k.is_column() else layout.reads_across_rows
                k.across = any(root.meta.get("reads_along_rows") or
                               against(self.evaluate(k, root, k.probe(root))[0], k.shape, k.dims)
                               for root in k.roots)
            if kind != "kernel" or k.dims or k.closed or len(k.shape) < 2:
                continue
            main = None
            for root in k.roots:
                found = layout.largest_input(self.evaluate(k, root, k.probe(root))[0], k.shape, k.loop_order())
                if found and (main is None or hint(found[1]) > hint(main[1])):
                    main = found
            if main is not None and 2 * hint(main[1]) >= hint(k.xnumel()):   # a heuristic: at the hint sizes
                k.tile = layout.tile_split(k.shape, k.loop_order(), main[0])

    def place_scatter(self, n):
        """index_put(accumulate=True): a kernel writes the initial tensor into n's buffer, then a kernel over the
        values adds them in with atomics. Both are closed; every reader loads n's buffer after them."""
        self.stored.add(n)
        for root in (n, n.meta["scatter"]):
            k = Kernel(f"k{sum(1 for kind, _ in self.steps if kind == 'kernel')}", tuple(root.shape), (), [], True)
            self.position[k] = len(self.steps)
            self.steps.append(("kernel", k))
            self.open_kernel(k, root)
        self.position[n] = self.position[n.meta["scatter"]] = self.position[k]

    def absorb_into_scatters(self):
        """A scatter's values that read, element for element, a value stored for something else (a training
        forward saves GAT's gathered features `h[src]` for its backward, and its messages `h[src] * alpha` are
        scattered) compute and store that value in the scatter's own kernel, instead of a kernel of its own
        storing it and the scatter reading it back: one pass over [edges, heads, channels] less (282 MB in the
        first layer of the floor's GAT pattern). Only a kernel that stores that value alone, walks the same
        space in the same order, and whose value no step between the two reads."""
        steps = self.steps
        for j, step in enumerate(steps):
            kind, values_kernel = step if step is not None else (None, None)
            if kind != "kernel" or not values_kernel.closed or len(values_kernel.roots) != 1:
                continue
            values = values_kernel.roots[0]
            if values.meta.get("atomic_into") is None or values.fx in self.split:   # the floor split it off
                continue
            idx = values_kernel.full_index()
            for p in self._stored_reads(values_kernel, values, idx):
                i = next((i for i, st in enumerate(steps[:j]) if st is not None and st[0] == "kernel"
                          and st[1].roots == [p]), None)
                if i is None or not self._absorbable(steps[i][1], values_kernel, p, steps[i + 1:j]):
                    continue
                self._join(values_kernel, p, first=True)
                steps[i] = None
                self.refusals.append((p, "stored by the scatter reading it, in the scatter's kernel"))
        self.steps = [s for s in steps if s is not None]

    def scatters_into_reductions(self):
        """A scatter whose values walk the space of an earlier reduction kernel, in its order, adds them in from
        that kernel, and its initial values are written before it: GAT's backward reduced grad[dst] * h[src] over
        the channels (the attention's gradient) and, in a kernel of its own, gathered grad[dst] again to add
        grad[dst] * alpha into the features' gradient by source. Only where the values read nothing the steps
        between produce."""
        made = self._made_at()
        j = 0
        while j < len(self.steps):
            kind, values_kernel = self.steps[j]
            init = self.steps[j - 1][1] if j and self.steps[j - 1][0] == "kernel" else None
            values = values_kernel.roots[0] if kind == "kernel" and values_kernel.closed else None
            if values is None or len(values_kernel.roots) != 1 or values.meta.get("atomic_into") is None \
                    or init is None or init.roots != [values.meta["atomic_into"]] or values.fx in self.split:
                j += 1
                continue
            i = self._reduction_for(values_kernel, values, init, j - 1, made)
            if i is None:
                j += 1
                continue
            self._join(self.steps[i][1], values)
            self.steps = self.steps[:i] + [self.steps[j - 1]] + self.steps[i:j - 1] + self.steps[j + 1:]
            self.refusals.append((values, "scattered from the reduction kernel walking its values' space"))
            made = self._made_at()
            j = i + 1

    def _join(self, kernel, node, first=False):
        """`node` becomes a root of `kernel` (its first with `first`), computed there at the kernel's full index;
        its buffer's strides stay as they were fixed."""
        self.kernel_of[node] = kernel
        inlined = self.evaluate(kernel, node, kernel.full_index())[1]
        joined = [node] + sorted(inlined - set(kernel.members), key=lambda n: n.name)
        if first:
            kernel.roots.insert(0, node)
            kernel.members[:0] = joined
        else:
            kernel.roots.append(node)
            kernel.members.extend(joined)

    @staticmethod
    def _walk(kernel):
        """The dims a kernel walks, innermost first, leaving out those of extent 1 (their order moves nothing)."""
        return [d for d in kernel.loop_order() if hint(kernel.shape[d]) != 1]

    def _made_at(self):
        """{node: the step that produces it} of the steps as they stand."""
        made = {}
        for i, (kind, what) in enumerate(self.steps):
            for n in (what.roots if kind == "kernel" else [what]):
                made[n] = i
        return made

    def _reduction_for(self, kernel, values, init, init_at, made):
        """The step of the reduction kernel nearest before `init_at` that `values` (and the scatter's initial
        values, `init`) can join, or None."""
        walked = self._walk(kernel)
        for i in range(init_at - 1, -1, -1):
            kind, k = self.steps[i]
            if kind != "kernel" or not k.dims or k.closed or k.alone or not same(k.shape, kernel.shape) \
                    or self._walk(k) != walked:
                continue
            for node, at in ((values, k), (init.roots[0], init)):
                value, _ = self.evaluate(at, node, at.full_index() if at is k else at.probe(node))
                read = [v.buf if isinstance(v, ir.Load) else v.node for v in ir.walk(value)
                        if isinstance(v, (ir.Load, ir.ReduceRef))]
                if any(made.get(n, -1) >= i for n in read):
                    return None
            return i
        return None

    def _stored_reads(self, kernel, node, idx):
        """The nodes other kernels store that `node`, at `idx` in `kernel`, reads at that same index only."""
        value, _ = self.evaluate(kernel, node, idx)
        loads = {}
        for v in ir.walk(value):
            if isinstance(v, ir.Load) and v.buf.kind == "pointwise" and v.buf in self.kernel_of:
                loads.setdefault(v.buf, []).append(v.index)
        return [b for b, at in loads.items()
                if b.stride is not None and all(a == linear(idx, b.stride, 0) for a in at)]

    def _absorbable(self, kernel, into, node, between):
        if kernel.closed or kernel.alone or kernel.dims or not same(kernel.shape, into.shape):
            return False
        if self._walk(kernel) != self._walk(into):   # the same walk, so the stores stay as coalesced
            return False
        for step in between:
            if step is None:
                continue
            kind, what = step
            if kind == "kernel":
                for r in what.roots:
                    value, _ = self.evaluate(what, r, what.probe(r))
                    if any(isinstance(v, ir.Load) and v.buf is node for v in ir.walk(value)):
                        return False
            elif kind == "aten" and node in _fx_inputs(what, self.L):
                return False
        return True

    def run(self):
        self.required()
        for n in self.nodes:
            if n.kind == "buffer":
                if n.producer in ("extern", "fallback"):
                    self.position[n] = len(self.steps)
                    self.steps.append(("aten", n))
                else:
                    self.position[n] = -1
            elif n in self.host_views:
                self.position[n] = len(self.steps)
                self.steps.append(("aten", n))
            if n.meta.get("scatter") is not None:
                self.place_scatter(n)
                continue
            if n.kind == "reduction" or (n.kind == "pointwise" and n in self.stored):
                if n.numel == 0 and n.kind == "pointwise":
                    n.stride = tuple(n.meta["fake"].stride()) if hasattr(n.meta.get("fake"), "stride") \
                        else layout.dense_strides(n.shape, layout.row_major(len(n.shape)))
                    self.position[n] = len(self.steps)
                    self.steps.append(("empty", n))
                    continue
                self.place(n)
        self.absorb_into_scatters()
        self.scatters_into_reductions()
        self.choose_tiles()
        position = {fx: i for i, fx in enumerate(self.L.gm.graph.nodes)} if self.L.gm is not None else {}
        for i, k in enumerate(k for kind, k in self.steps if kind == "kernel"):
            k.name = kernel_name(k.members, i, position)
        # refusals stay unrendered (Reason): a kernel may still be renamed when its source is known (kernel_registry)
        return Plan(self.steps, self.stored, self.refusals, self.L)


BROADCAST_EVALS = 1 << 22   # extra evaluations of a long math op that are worth a kernel of its own


def _numel(space):
    shape, _ = space
    return hint(_prod(shape))


def _space(n):
    if n.kind == "reduction":
        return (tuple(n.src_shape), n.dims)
    return (tuple(n.shape), ())


def _ir_of(L, fx):
    v = L.env.get(fx)
    if isinstance(v, ir.Node):
        return [v]
    if isinstance(v, tuple):
        return [x for x in v if isinstance(x, ir.Node)]
    return []


def _fx_inputs(node, L):
    out = []
    import torch
    torch.fx.node.map_arg((node.fx.args, node.fx.kwargs), lambda a: out.extend(_ir_of(L, a)))
    return out


def schedule(L, split=()):
    """The Plan for lowering `L`; `split`: FX nodes whose values are stored and start kernels of their own, where
    measurement found the kernel fusing them slower (runtime/floor.py)."""
    return Scheduler(L, split).run()
