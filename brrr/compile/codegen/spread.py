"""Roots of one small pointwise kernel spread over programs of their own (codegen, a mixin of triton.Codegen).

Why. The scheduler packs every root of one iteration space into one kernel, which saves launches. Where the
space is small, its few blocks each then do every root's work in turn: DenseNet121's 58 3x3 weights converted to
channels_last ran as one kernel of 10 programs, 61 us for 4.3 MB. Roots that load no buffer in common lose
nothing apart, so each group of them gets the kernel's blocks of its own: program `pid` runs group
`pid // blocks` (`if member == g:`), one launch still.
"""

from brrr.compile.ir import nodes as ir
from brrr.compile.ir.sizes import is_symbolic

SPREAD_BELOW = 264   # blocks (two per SM of an H100) under which a kernel's independent roots spread


class SpreadRoots:
    def independent_groups(self, roots):
        """The roots in groups that load no buffer in common (in their order), or [roots] where one is atomic."""
        if any(r.meta.get("atomic_into") is not None for r in roots):
            return [roots]
        idx = self.k.full_index()
        groups = []   # [(buffers, roots)]
        for r in roots:
            bufs = {id(v.buf) for v in ir.walk(r(idx)) if isinstance(v, ir.Load)}
            joined = [g for g in groups if g[0] & bufs]
            merged = (bufs.union(*(g[0] for g in joined)), [x for g in joined for x in g[1]] + [r])
            groups = [g for g in groups if not any(g is j for j in joined)] + [merged]
        order = {r: i for i, r in enumerate(roots)}
        return sorted((sorted(rs, key=order.get) for _, rs in groups), key=lambda rs: order[rs[0]])

    def root_lines(self, roots, blocks):
        """(members, body lines) of a pointwise kernel of `blocks` blocks: its roots spread where
        `spread_roots` spreads them, else all of them in one Scope (members 1)."""
        spread = self.spread_roots(roots, blocks)
        if spread is not None:
            return spread
        s = self.new_scope()
        self.store_roots(s, roots)
        return 1, s.lines

    def spread_roots(self, roots, blocks):
        """(members, body lines) where the kernel's independent root groups each get `blocks` programs of their
        own (program `pid` runs group pid // blocks), or None where it stays one program per block: it has
        SPREAD_BELOW blocks or more (or a symbolic count), or one group."""
        if len(roots) < 2 or is_symbolic(blocks) or blocks >= SPREAD_BELOW:
            return None
        groups = self.independent_groups(roots)
        if len(groups) < 2:
            return None
        lines = []
        for g, group in enumerate(groups):
            s = self.new_scope("        ")
            self.store_roots(s, group)
            lines += [f"    if member == {g}:"] + (s.lines or ["        pass"])
        return len(groups), lines
