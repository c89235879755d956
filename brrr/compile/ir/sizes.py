"""Symbolic sizes (capture -> **sizes** -> lower -> schedule -> codegen -> runtime).

When Dynamo captures a graph with symbolic sizes, AOTAutograd traces it with Dynamo's own ShapeEnv: the sizes
in every node's FakeTensor, and the graph's size inputs, are `torch.SymInt`s (`s0`, `s27`, ...). brrr plans such
a graph with those SymInts where a static graph has ints. Their arithmetic stays symbolic; a comparison the
ShapeEnv cannot decide from what it knows is decided at the sizes Dynamo first saw (the hints) and becomes a
guard of Dynamo's, so a call whose sizes would have decided otherwise recompiles: a symbolic plan is never
wrong, only sometimes narrower than it could be. `hint(x)` reads a size at its hint without a guard, for
heuristics (block sizes, splits) whose choice does not change what a kernel computes.

A SymInt cannot be hashed, and brrr's planner keys dictionaries by shapes and index terms. `planning()` lets
it while a graph is planned and generated: a SymInt hashes as its expression (two SymInts are equal exactly
when the ShapeEnv proves it, or guards it), and formats as Python source over its symbols (`32*s27`, `a // b`,
`a % b`), which is also Triton source for the non-negative sizes and indices brrr computes. A kernel takes the
symbols its source names as arguments (`symbols_in`), and the generated call binds each symbol from its
graph's inputs.
"""

import contextlib
import functools
import re

import torch


def is_symbolic(x):
    return isinstance(x, torch.SymInt)


def hint(x):
    """A size's value at the sizes the graph was captured at (a number unchanged), without adding a guard."""
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        node = x.node
        h = node.hint if getattr(node, "hint", None) is not None else node.shape_env.size_hint(node.expr)
        return int(h) if isinstance(x, torch.SymInt) else float(h)
    return x


def expr_text(x):
    """A size as a Python/Triton expression over the size symbols (`32*s27`), or its decimal digits."""
    if isinstance(x, torch.SymInt):
        return expr_text_of(x.node.expr)
    return str(int(x))


def expr_text_of(expr):
    """A sympy expression of sizes as Python source."""
    return _printer().doprint(expr)


@functools.cache
def _printer():
    from torch.utils._sympy.printers import PythonPrinter

    class SizePrinter(PythonPrinter):
        """Python's printer, with sympy's Max and Min as Python's max and min (a slice's length)."""

        def _print_Max(self, expr):
            return f"max({', '.join(self._print(a) for a in expr.args)})"

        def _print_Min(self, expr):
            return f"min({', '.join(self._print(a) for a in expr.args)})"
    return SizePrinter()


def known_true(cond):
    """Whether `cond` (a bool, or a SymBool of sizes) holds for every size the graph may be called with, as
    far as the ShapeEnv can prove without a guard (False when it cannot). What the planner's simplifications
    (merge two index terms, drop a size-1 dim) ask: each is right untaken, and deciding it at the hint would
    pin the sizes with a guard, a recompile whenever they differ. A static graph's bool is returned as it is."""
    if type(cond) is bool:
        return cond
    if isinstance(cond, torch.SymBool):
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        return statically_known_true(cond)
    return bool(cond)


def next_pow2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a, b):
    """ceil(a / b) for sizes, symbolic or not."""
    return (a + b - 1) // b


_SYMBOL = re.compile(r"\b[su]\d+\b")   # Dynamo's size symbols: s0, s27 (backed), u0 (unbacked)


def symbols_in(text):
    """The size symbols named in generated source, in order of first appearance."""
    return list(dict.fromkeys(_SYMBOL.findall(text)))


def _hash(self):
    return hash(("SymInt", str(self.node.expr)))


def _format(self, spec):
    text = expr_text(self)   # parenthesized unless atomic: `x // 16*s27` would divide by 16 only
    return format(text if text.isidentifier() or text.isdigit() else f"({text})", spec)


def _repr(self):
    return _format(self, "")


@contextlib.contextmanager
def planning():
    """SymInts hash by expression, and format and repr as source (a tuple of sizes too), while the block runs."""
    previous = torch.SymInt.__hash__, torch.SymInt.__format__, torch.SymInt.__repr__
    torch.SymInt.__hash__, torch.SymInt.__format__, torch.SymInt.__repr__ = _hash, _format, _repr
    try:
        yield
    finally:
        torch.SymInt.__hash__, torch.SymInt.__format__, torch.SymInt.__repr__ = previous


def size(x):
    """A size as brrr's planner holds it: a SymInt as it is (symbolic), anything else as an int."""
    return x if isinstance(x, torch.SymInt) else int(x)


def same(a, b):
    """Whether two shapes (or any sequences of sizes) are equal for every size the graph may be called with,
    as far as the ShapeEnv proves without a guard: a planner's "same iteration space" must not specialize."""
    a, b = tuple(a), tuple(b)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if type(x) is int and type(y) is int:   # a static graph's sizes: compared as they are
            if x != y:
                return False
        elif not (x is y or known_true(x == y)):
            return False
    return True


def fixed_value(name, placeholders):
    """Source of the value a guard gave size symbol `name` (`s27` -> `16`, or an expression of other symbols),
    read from the ShapeEnv of the graph whose `placeholders` are given. Raises LookupError if none did."""
    env = shape_env_of(fx.meta.get("val") for fx in placeholders)
    if env is None:
        raise LookupError(f"size symbol {name}: no symbolic input to read its ShapeEnv from")
    fixed = next((r for s, r in env.replacements.items() if str(s) == name), None)
    if fixed is None:
        raise LookupError(f"size symbol {name} is neither an input's size nor fixed by a guard")
    return expr_text_of(fixed)


GUARDS = []   # (graph kind, guard source) brrr's planning added to Dynamo's guards, process-wide, latest 1000


def shape_env_of(values):
    """The ShapeEnv behind the first symbolic size among `values` (graph inputs), or None."""
    for v in values:
        sizes_of = [v] if isinstance(v, torch.SymInt) else list(getattr(v, "shape", ())) if isinstance(
            v, torch.Tensor) else []
        for x in sizes_of:
            if isinstance(x, torch.SymInt):
                return x.node.shape_env
    return None


@contextlib.contextmanager
def recording_guards(values, kind, sink=None):
    """Records the guards added to the ShapeEnv of `values` while the block runs (brrr's own, when the block
    plans a graph): in GUARDS, and in `sink.guards` (explain) when the sink keeps them."""
    env = shape_env_of(values)
    start = len(env.guards) if env is not None else 0
    try:
        yield
    finally:
        if env is not None:
            added = [(kind, expr_text_of(g.expr)) for g in env.guards[start:]]
            GUARDS.extend(added)
            del GUARDS[:-1000]
            if hasattr(sink, "guards"):
                sink.guards.extend(added)
