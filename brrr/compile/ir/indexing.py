"""Affine index expressions: how views rewrite an index without moving data (lower -> schedule -> codegen).

An `Ix` is `const + sum(coeff * ((base // div) % mod))` over a few bases: the kernel's flat iteration variables
(`xindex`, `rindex`), an index loaded from memory (gather/embedding), or, when a rewrite cannot stay in this form,
an opaque parenthesised sub-expression. Every base carries its range, so `% mod` disappears when it cannot wrap
and adjacent terms merge back (`(x % 8) + (x // 8) * 8 == x`). That is the whole algebra: no sympy, a handful of
integer rules, and the contiguous case renders as plain `xindex`.

Every Ix's terms are canonical (`_canonical`: simplified, merged, sorted). Views build indices by hundreds of
thousands of `+` and `*` per model, so these skip the pass where it cannot change a canonical result: a product
by k != 0, a sum of terms that neither share a key nor merge (`_sum`). tests/compile/test_indexing.py holds
them to canonicalizing every step.
"""

import itertools
import math
import weakref
from dataclasses import dataclass

from brrr.compile.ir.sizes import expr_text, known_true, size


@dataclass(frozen=True)
class Term:
    base: object        # str atom ("xindex", "rindex", "(...)") or an ir.Value for indirect indices
    brange: object      # int: base takes values in [0, brange); None: unknown
    div: int
    mod: object         # int or None
    coeff: int

    def max(self):
        if self.mod is not None:
            m = self.mod - 1
        elif self.brange is None:
            return None
        elif type(self.brange) is not int and known_true(self.brange % self.div == 0):
            # symbolic and exact: (B - 1) // d == B // d - 1, which sympy simplifies where it cannot the former
            m = self.brange // self.div - 1
        else:
            m = (self.brange - 1) // self.div
        return m * self.coeff


class Ix:
    __slots__ = ("terms", "const", "memo")   # memo: its value key (_ix_memo_key), once asked for

    def __init__(self, terms=(), const=0):
        self.terms, self.const = _canonical(list(terms)) if terms else (), size(const)

    @staticmethod
    def var(name, size):
        return Ix([Term(name, size, 1, None, 1)])

    @staticmethod
    def of(x):
        return x if isinstance(x, Ix) else _made((), size(x))

    def key(self):
        return (tuple((id(t.base) if not isinstance(t.base, str) else t.base, t.div, t.mod, t.coeff)
                      for t in self.terms), self.const)

    def __eq__(self, other):
        return isinstance(other, Ix) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def max(self):
        """Largest value (None when a base is unbounded); coefficients are never negative."""
        total = self.const
        for t in self.terms:
            m = t.max()
            if m is None:
                return None
            total += m
        return total

    def is_const(self):
        return not self.terms

    def bases(self):
        return [t.base for t in self.terms]

    def __add__(self, other):
        other = Ix.of(other)
        return _made(_sum(self.terms, other.terms), self.const + other.const)

    __radd__ = __add__

    def __mul__(self, k):
        k = size(k)
        if known_true(k == 0):
            return Ix()
        if not _nonzero(self.terms):
            return Ix([Term(t.base, t.brange, t.div, t.mod, t.coeff * k) for t in self.terms], self.const * k)
        # scaling by k != 0 keeps canonical terms canonical: no term vanishes, merges or moves
        if known_true(k == 1):
            return self
        return _made(tuple(Term(t.base, t.brange, t.div, t.mod, t.coeff * k) for t in self.terms), self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, k):
        k = size(k)
        if known_true(k == 1):
            return self
        mx = self.max()
        if mx is not None and known_true(mx < k) and known_true(self.const >= 0):
            return Ix()
        high = [t for t in self.terms if known_true(t.coeff % k == 0)]
        low = [t for t in self.terms if not known_true(t.coeff % k == 0)]
        ch, cl = self.const // k, self.const % k   # divmod takes no SymInt
        low_max = Ix(low, cl).max()
        if low_max is not None and known_true(low_max < k):
            return Ix([Term(t.base, t.brange, t.div, t.mod, t.coeff // k) for t in high], ch)
        if high or not known_true(ch == 0):
            # multiples of k (terms and constant) leave the division exactly: only the rest is divided, as `%`
            # takes the rest, so an unflattened sum keeps each dim's own term and the two halves merge back
            return Ix([Term(t.base, t.brange, t.div, t.mod, t.coeff // k) for t in high], ch) + Ix(low, cl) // k
        if len(low) == 1 and known_true(cl == 0):
            t = low[0]
            if known_true(k % t.coeff == 0):
                k2 = k // t.coeff
                if t.mod is None:
                    return Ix([Term(t.base, t.brange, t.div * k2, None, 1)], ch)
                if known_true(t.mod % k2 == 0):
                    return Ix([Term(t.base, t.brange, t.div * k2, t.mod // k2, 1)], ch)
        digits = _mixed_radix(self, k)
        if digits is not None:
            g, upper, _ = digits
            return upper // (k // g)
        return _opaque(self, k, None)

    def __mod__(self, k):
        k = size(k)
        if known_true(k == 1):
            return Ix()
        keep = [t for t in self.terms if not known_true(t.coeff % k == 0)]
        rest = Ix(keep, self.const % k)
        mx = rest.max()
        if mx is not None and known_true(mx < k):
            return rest
        if len(keep) == len(self.terms):
            if len(keep) == 1 and known_true(rest.const == 0):
                t = keep[0]
                if known_true(k % t.coeff == 0):
                    k2 = k // t.coeff
                    if t.mod is None or known_true(t.mod % k2 == 0):
                        return Ix([Term(t.base, t.brange, t.div, k2, t.coeff)])
            digits = _mixed_radix(rest, k)
            if digits is not None:
                g, upper, lower = digits
                return (upper % (k // g)) * g + lower
            return _opaque(rest, 1, k)
        # Multiples of k dropped exactly, the modulo of the rest, as `//` divides the same rest: the terms of an
        # unflattened sum merge back (`(q // 56) * 14336 + (q % 56) * 256 == q * 256` for a split reduction's
        # row q = p * 784 + r: `p * 14 + r // 56` and `r % 56`)
        return rest % k

    def render(self, name_of=str):
        """Triton/Python source; `name_of` names non-string bases (loaded index values)."""
        parts = []
        for t in self.terms:
            s = t.base if isinstance(t.base, str) else name_of(t.base)
            divided = not known_true(t.div == 1)   # a symbolic divisor or factor is written out, even where it is 1
            if divided:
                s = f"{s} // {t.div}"
            if t.mod is not None:
                s = f"({s}) % {t.mod}" if divided else f"{s} % {t.mod}"
            if not known_true(t.coeff == 1):
                s = f"({s}) * {t.coeff}" if (divided or t.mod is not None) else f"{s} * {t.coeff}"
            parts.append(s)
        if not parts or not known_true(self.const == 0):
            parts.append(expr_text(self.const))
        return " + ".join(parts)

    def __repr__(self):
        return f"Ix({self.render()})"


def _mixed_radix(ix, k):
    """(g, upper, lower) with ix == upper * g + lower, 0 <= lower < g and g dividing k, where ix's terms read as
    digits of a mixed-radix number (its terms of smallest coefficients, under g, the lower digit): then
    ix // k == upper // (k // g) and ix % k == (upper % (k // g)) * g + lower exactly. A flat index over
    (rows, 784) divided by 512 * 784 is then `rows // 512`, where it was a division of the whole sum. None where
    no such split exists or a size is symbolic."""
    if type(k) is not int or type(ix.const) is not int \
            or any(type(t.coeff) is not int or t.coeff <= 0 for t in ix.terms):
        return None
    terms = sorted(ix.terms, key=lambda t: t.coeff)
    for j in range(len(terms)):
        g = k
        for t in terms[j:]:
            g = math.gcd(g, t.coeff)
        if g == 1:
            continue
        a, b = divmod(ix.const, g)
        lower = Ix(terms[:j], b)
        top = lower.max()
        if top is None or top >= g:
            continue
        return g, Ix([Term(t.base, t.brange, t.div, t.mod, t.coeff // g) for t in terms[j:]], a), lower
    return None


def _opaque(ix, div, mod):
    mx = ix.max()
    if any(not isinstance(b, str) for b in ix.bases()):
        # an indirect base inside: keep the object so codegen can name it; render lazily
        return Ix([Term(Opaque(ix), None if mx is None else mx + 1, div, mod, 1)])
    return Ix([Term("(" + ix.render() + ")", None if mx is None else mx + 1, div, mod, 1)])


class Opaque:
    """A sub-expression that references loaded values; rendered by codegen with its naming function."""

    def __init__(self, ix):
        self.ix = ix


def _simplify(t):
    if t.coeff == 0:
        return None
    mod = t.mod
    if mod is not None and t.brange is not None and known_true(t.brange <= t.div * mod):
        mod = None
    if mod is not None and known_true(mod == 1):
        return None
    if t.brange is not None and known_true(t.brange <= t.div):
        return None
    return Term(t.base, t.brange, t.div, mod, t.coeff)


def _bkey(b):
    return b if isinstance(b, str) else f"~{id(b)}"


def _made(terms, const):
    """An Ix of terms that are already what `_canonical` makes of them: building one needs no second pass."""
    ix = object.__new__(Ix)
    ix.terms, ix.const = terms, const
    return ix


def _nonzero(terms):
    # a sum can leave a canonical term at coefficient 0, which the next `_canonical` drops
    return all(t.coeff for t in terms)


def _sum(a, b):
    """`_canonical(a + b)` of two canonical term tuples. When no term of one shares a key or merges with a term
    of the other (and none has coefficient 0), `_canonical` would only sort their union: do just that. Indices
    are built by hundreds of thousands of such sums (`linear`), almost all of disjoint terms."""
    if not b and _nonzero(a):
        return a
    if not a and _nonzero(b):
        return b
    if _nonzero(a) and _nonzero(b) and not _meet(a, b):
        return tuple(sorted(a + b, key=_order))
    return _canonical(list(a) + list(b))


def _meet(a, b):
    """Whether `_canonical` would sum or merge a term of `a` with one of `b` (each canonical on its own)."""
    keys = {(_bkey(t.base), t.div, t.mod) for t in a}
    if any((_bkey(t.base), t.div, t.mod) in keys for t in b):
        return True
    return any(_merges(t1, t2) or _merges(t2, t1) for t1 in a for t2 in b)


def _merges(t1, t2):
    """The rule of `_canonical`'s second pass: (b//a % m1)*c and (b//(a*m1) % m2)*(c*m1) are one term."""
    return (t1.mod is not None and known_true(t2.div == t1.div * t1.mod) and known_true(t2.coeff == t1.coeff * t1.mod)
            and _bkey(t2.base) == _bkey(t1.base))


_SEEN = weakref.WeakKeyDictionary()   # non-str base -> the order it was first sorted in
_COUNT = itertools.count()


def _rank(b):
    """Where a non-str base (a loaded index, an opaque sub-expression) sorts: the order bases were first seen
    in, which a compile repeats; their ids are not, and sorting by id made one kernel's source differ from
    process to process (BERT's embedding backward), so its cache entry missed on a warm compile."""
    try:
        rank = _SEEN.get(b)
        if rank is None:
            rank = _SEEN[b] = next(_COUNT)
        return rank
    except TypeError:   # neither weak-referable nor hashable: its id, as before
        return id(b)


def _order(t):
    b = t.base
    return ((0, b) if isinstance(b, str) else (1, _rank(b)), t.div, t.mod or 0)


def _canonical(terms):
    merged = {}
    for t in terms:
        t = _simplify(t)
        if t is None:
            continue
        k = (_bkey(t.base), t.div, t.mod)
        if k in merged:
            o = merged[k]
            t = Term(o.base, o.brange, o.div, o.mod, o.coeff + t.coeff)
        merged[k] = t
    changed = True
    while changed:  # (b//a % m1)*c + (b//(a*m1) % m2)*(c*m1) == (b//a % (m1*m2))*c
        changed = False
        for k1, t1 in list(merged.items()):
            if t1.mod is None or k1 not in merged:
                continue
            for k2, t2 in list(merged.items()):
                if (k2 != k1 and _bkey(t2.base) == k1[0] and known_true(t2.div == t1.div * t1.mod)
                        and known_true(t2.coeff == t1.coeff * t1.mod)):
                    new = _simplify(Term(t1.base, t1.brange, t1.div,
                                         None if t2.mod is None else t1.mod * t2.mod, t1.coeff))
                    del merged[k1], merged[k2]
                    merged[(_bkey(new.base), new.div, new.mod)] = new
                    changed = True
                    break
            if changed:
                break
    return tuple(sorted(merged.values(), key=_order))


def contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(size(s), 1)
    return tuple(reversed(strides))


# Lowering asks for the same few indices thousands of times (every view of every value inlines its chain again:
# a BERT layer's graph called `linear` 7313 times for 132 distinct arguments, `unflatten` 4217 times for 90). An Ix
# is never changed once made, so one whose bases are names and whose numbers are ints is shared. The key holds
# each term whole (Ix.key leaves out a base's range, which decides what simplifies).
_MEMO = {}
MEMO_MAX = 1 << 16   # entries before the table starts again


def _plain(x):
    return type(x) is int


def _ix_memo_key(ix):
    """A key of `ix` made of values only (names and ints), or None: a loaded base (compared by identity) or a
    symbolic number cannot be keyed by value."""
    if _plain(ix):
        return ix
    if not isinstance(ix, Ix):
        return None
    try:
        return ix.memo
    except AttributeError:
        pass
    out = [ix.const]
    for t in ix.terms:
        if not (isinstance(t.base, str) and (t.brange is None or _plain(t.brange)) and _plain(t.div)
                and (t.mod is None or _plain(t.mod)) and _plain(t.coeff)):
            out = None
            break
        out.append((t.base, t.brange, t.div, t.mod, t.coeff))
    ix.memo = tuple(out) if out is not None and _plain(ix.const) else None
    return ix.memo


def _memo_key(kind, indices, numbers, extra):
    """(kind, the indices' keys, numbers, extra), or None where an index or number cannot be keyed by value. Asked
    some 70000 times in planning BERT-base's training graphs: written for speed (loops, the kept key read first)."""
    keys = []
    for i in indices:
        if type(i) is int:
            keys.append(i)
            continue
        try:
            k = i.memo
        except AttributeError:
            k = _ix_memo_key(i)
        if k is None:
            return None
        keys.append(k)
    for n in numbers:
        if type(n) is not int:
            return None
    return kind, tuple(keys), tuple(numbers), extra


def _memoized(key, make):
    if key is None:
        return make()
    found = _MEMO.get(key)
    if found is None:
        if len(_MEMO) >= MEMO_MAX:
            _MEMO.clear()
        found = _MEMO[key] = make()
    return found


def linear(idx, strides, offset=0):
    """sum(idx[d] * strides[d]) + offset."""
    idx, strides = tuple(idx), tuple(strides)
    return _memoized(_memo_key("linear", idx, strides + (offset,), None) if _plain(offset) else None,
                     lambda: _linear(idx, strides, offset))


def _linear(idx, strides, offset):
    out = Ix((), offset)
    for i, s in zip(idx, strides):
        if s:
            out = out + Ix.of(i) * s
    return out


def unflatten(flat, shape, order=None):
    """Per-dim indices of a flat index into `shape`, numbered over `order` (dims innermost first; default
    row-major, the last dim innermost). The outermost dim of size > 1 needs no modulo: the flat index is in range.
    A shape with a 0 has no elements: its dims of size 0 index nothing (0, never a modulo by 0)."""
    shape = tuple(shape)
    order = tuple(reversed(range(len(shape)))) if order is None else tuple(order)
    # a list each call: callers set elements of it
    return list(_memoized(_memo_key("unflatten", (flat,), shape, order), lambda: tuple(_unflatten(flat, shape, order))))


def _unflatten(flat, shape, order):
    idx, stride = [Ix()] * len(shape), 1
    # a symbolic size not proven to be 1 (a chunk length of ceil(n / 40)) is indexed as a dim: right at 1 too
    outermost = next((d for d in reversed(order) if not known_true(shape[d] <= 1)), None)
    for d in order:
        size = shape[d]
        if not known_true(size <= 1):
            idx[d] = flat // stride if d == outermost else (flat // stride) % size
        stride *= size if type(size) is not int else max(size, 1)   # symbolic sizes are never 0 (Dynamo's rule)
    return idx
