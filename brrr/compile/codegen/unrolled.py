"""Unrolled window reductions (part of codegen/triton.py's Codegen): a reduction over a few elements, such as a
3x3 pooling window in either layout, written like a pointwise kernel with the window's elements at constant
positions in the source.

Each lane may compute several rows at once: consecutive output positions along one kept dim (a strip), whose
windows overlap, so that a load two windows share is written once (the Scope's cache of identical expressions
finds them). An NCHW 3x3 window of stride 1 reads 9 values per output alone, and 3 * (8 + 2) / 8 = 3.75 in a
strip of 8 rows; the masks, the window's index arithmetic and an average's divisors are shared the same way.
On an H200 the unrolled kernels were bound by instruction issue, not by bytes: an average pool over
[32, 64, 56, 56] bf16 issued 115 instructions per output and took 25.8 us where its bytes take 6.3.
"""

from dataclasses import replace

from brrr.compile.ir.indexing import Ix, linear
from brrr.compile.ir.sizes import cdiv, hint, is_symbolic, known_true, next_pow2

STRIP_ROWS = (8, 4, 2)     # rows per lane tried, most first
STRIP_VALUES = 96          # window elements a lane may hold at once (rows x window): registers
STRIP_GAIN = 0.8           # a strip is taken when it leaves at most this fraction of the loads per output


class RowStrip:
    """Kernel `k` seen from row `j` of strips of `rows` consecutive positions along kept dim `dim`: its flat
    xindex numbers strips (the kernel's kept size over `rows`), and every index it hands out puts `dim` at
    strip * rows + j. The rest of the kernel's interface is `k`'s own."""

    def __init__(self, k, dim, rows, j):
        self.kernel, self.dim, self.rows, self.j = k, dim, rows, j
        shape = list(k.shape)
        shape[dim] = shape[dim] // rows
        self._lanes = replace(k, shape=tuple(shape))

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def xnumel(self):
        return self._lanes.xnumel()

    def full_index(self, reduced_at=None):
        idx = self._lanes.full_index(reduced_at)
        idx[self.dim] = Ix.of(idx[self.dim]) * self.rows + self.j
        return idx

    def row_index(self, shape, full=None):
        return self.kernel.row_index(shape, self.full_index() if full is None else full)

    def is_current_row(self, idx, shape):
        strides = self.kernel.row_strides(shape)
        return linear(idx, strides) == linear(self.row_index(shape), strides)


def strip_dim(k):
    """The kept dim a strip runs along: the one next to the innermost kept dim in memory order (lanes stay
    consecutive along the innermost, so loads coalesce), when it is static and longer than 1."""
    kept = [d for d in k.loop_order() if d not in k.dims and not known_true(k.shape[d] <= 1)]
    if len(kept) < 2 or is_symbolic(k.shape[kept[1]]):
        return None
    return kept[1]


def strip_choices(k):
    """(dim, rows) worth trying for kernel `k`, most rows first: rows dividing the dim's size, the lane's
    window elements within STRIP_VALUES."""
    dim = strip_dim(k)
    if dim is None or is_symbolic(k.rnumel()):
        return []
    return [(dim, rows) for rows in STRIP_ROWS
            if k.shape[dim] % rows == 0 and k.shape[dim] > rows and rows * k.rnumel() <= STRIP_VALUES]


class UnrolledReductions:
    """Codegen's unrolled reductions (mixed into codegen.triton.Codegen, which supplies the rest)."""

    def gen_unrolled(self, roots, reds):
        """One lane per kept element (or per strip of them), like a pointwise kernel, with the reduced elements
        unrolled in the source at constant positions. Their indices then fold to a constant offset per element,
        and the div/mod of the window position and the lanes a [XBLOCK, RBLOCK] tile would leave empty (7 of 16
        for 9 elements) are gone: as a tile, the window reductions of inception_v3 ran at ~2% of copy bandwidth,
        bound by index arithmetic."""
        k = self.k
        strip = self.unrolled_strip(roots, reds)
        rows = strip[1] if strip else 1
        lanes = cdiv(k.xnumel(), rows)
        xblock = min(max(128, 1024 // rows), next_pow2(hint(lanes)))
        warps = max(1, min(4, xblock * rows // 256))
        self.x_full, self.r_full = known_true(lanes % xblock == 0), True
        lines = self.unrolled_body(roots, reds, strip)
        return self.reduction_head(lanes, k.rnumel()) + lines, dict(XBLOCK=xblock, RBLOCK=1, num_warps=warps,
                                                                     grid=(cdiv(lanes, xblock),))

    def unrolled_body(self, roots, reds, strip):
        """The kernel's lines, each row of a strip in turn over one Scope (so rows share what they load)."""
        k, s = self.k, self.new_scope()
        views = [RowStrip(k, strip[0], strip[1], j) for j in range(strip[1])] if strip else [k]
        R = k.rnumel()
        try:
            for view in views:
                self.k = view
                levels = self.levels(reds)
                for lvl in sorted(set(levels.values())):
                    for r in (r for r in reds if levels[r] == lvl):
                        self.finish_reduction(s, r, self.unrolled_combine(s, r, view))
                rows, fulls = self.pointwise_roots(roots)
                self.store_rows_and_reductions(s, reds, rows)
                for r in fulls:
                    for j in range(R):
                        idx = view.full_index(j)
                        self.store(s, r, idx, self.value(s, r(idx)))
        finally:
            self.k = k
        return s.lines

    def unrolled_combine(self, s, r, view):
        """Reduction `r` over the window, one window row (the innermost reduced dim) at a time and then across
        the rows: the rows of a strip whose windows share an input row share its partial result too."""
        inner = self.k.shape[[d for d in self.k.loop_order() if d in self.k.dims][0]]
        partials = []
        for row in range(0, self.k.rnumel(), inner):
            acc = None
            for j in range(row, row + inner):
                term = self.reduction_value(s, r, view.full_index(j))
                if not term.startswith("tmp"):   # a literal: give it the block's shape
                    term = self.tmp(s, f"tl.full([XBLOCK, 1], {term}, {self.tl_type(self.acc_dtype(r))})", False)
                acc = term if acc is None else self.tmp(s, self.combine(r, acc, term), False)
            partials.append(acc)
        acc = partials[0]
        for p in partials[1:]:
            acc = self.tmp(s, self.combine(r, acc, p), False)
        return acc

    def unrolled_strip(self, roots, reds):
        """(dim, rows) of the strips the kernel's lanes take, or None for one row a lane: the most rows whose
        loads per output fall to STRIP_GAIN of a lane's own, counted by writing each form aside."""
        choices = strip_choices(self.k)
        if not choices:
            return None
        base = self.count_loads(roots, reds, None)
        for dim, rows in choices:
            if self.count_loads(roots, reds, (dim, rows)) <= STRIP_GAIN * base * rows:
                return dim, rows
        return None

    def count_loads(self, roots, reds, strip):
        """The loads a lane writes in form `strip`, by a copy of this codegen whose state is then dropped."""
        aside = self.aside()
        lines = aside.unrolled_body(roots, reds, strip)
        return sum(line.count("tl.load(") for line in lines)
