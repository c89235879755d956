"""Index arithmetic's shortcuts against the canonicalizer they skip: `+` and `*` build their terms without a
second `_canonical` pass where that pass would change nothing; each must give exactly what it gives."""

import random

import pytest

from brrr.compile.ir.indexing import Ix, Term, linear, unflatten

LOADED = object()   # stands for an ir.Value: an index loaded from memory, keyed by identity


def slow_add(a, b):
    b = Ix.of(b)
    return Ix(a.terms + b.terms, a.const + b.const)


def slow_mul(a, k):
    return Ix() if k == 0 else Ix([Term(t.base, t.brange, t.div, t.mod, t.coeff * k) for t in a.terms], a.const * k)


def outcome(build):
    try:
        return build()
    except Exception as e:   # random sums reach corners `_canonical` fails on: both paths must fail alike
        return type(e)


def same(fast, slow):
    fast, slow = outcome(fast), outcome(slow)
    if not isinstance(slow, Ix):
        assert fast == slow
        return Ix()
    assert (fast.terms, fast.const, fast.render()) == (slow.terms, slow.const, slow.render())
    assert [type(t.base) for t in fast.terms] == [type(t.base) for t in slow.terms]
    return fast


def leaf(rng):
    return rng.choice([
        lambda: Ix.var("xindex", rng.choice([1, 7, 64, 3136, 65536])),
        lambda: Ix.var("rindex", rng.choice([3, 56, 784])),
        lambda: Ix([Term(LOADED, None, 1, None, 1)]),
        lambda: Ix.of(rng.randrange(0, 40)),
    ])()


def grow(rng, pool):
    """One random step of what views do to indices; every `+` and `*` checked against the slow path."""
    a, b = rng.choice(pool), rng.choice(pool)
    op = rng.randrange(7)
    if op == 0:
        return same(lambda: a + b, lambda: slow_add(a, b))
    if op == 1:
        k = rng.choice([0, 1, 2, 3, 7, 8, 56, 256, -1, -3])
        return same(lambda: a * k, lambda: slow_mul(a, k))
    if op == 2:   # a sum that cancels: the shortcut must leave zero coefficients to `_canonical`
        return same(lambda: a + b * -1 + b, lambda: slow_add(slow_add(a, slow_mul(b, -1)), b))
    if op == 3:
        v = outcome(lambda: view(a, rng))
        return same(lambda: linear(*v), lambda: slow_linear(*v)) if isinstance(v, tuple) else Ix()
    if op == 4:
        made = outcome(lambda: a // rng.choice([2, 4, 7, 8, 56, 784]))
    elif op == 5:
        made = outcome(lambda: a % rng.choice([2, 3, 8, 56, 64]))
    else:
        made = leaf(rng)
    return made if isinstance(made, Ix) else Ix()


def view(flat, rng):
    """Per-dim indices of `flat` in a random shape, and random strides to read them at."""
    shape = rng.choice([(4, 56, 56), (2, 8, 7), (3, 1, 5)])
    idx = unflatten(flat, shape, rng.choice([None, (0, 2, 1)]))
    return idx, rng.choice([(12544, 224, 4), (1, 4 * shape[0], 4), (0, 1, 8)]), rng.randrange(3)


def slow_linear(idx, strides, offset):
    out = Ix((), offset)
    for i, s in zip(idx, strides):
        if s:
            out = slow_add(out, slow_mul(Ix.of(i), s))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_sums_and_products_match_canonicalizing_every_step(seed):
    rng = random.Random(seed)
    pool = [leaf(rng) for _ in range(4)]
    for _ in range(150):
        pool.append(grow(rng, pool))
        if len(pool) > 30:
            pool.pop(rng.randrange(len(pool)))


def test_unflattened_flat_index_merges_back_through_the_shortcut():
    # (x % 8) + (x // 8) * 8: the sum must still reach `_canonical`'s merge rule
    x = Ix.var("xindex", 64)
    h, w = unflatten(x, (8, 8))
    assert (w + h * 8).render() == "xindex"
    assert linear(unflatten(x, (2, 4, 8)), (32, 8, 1)).render() == "xindex"


def test_terms_over_loaded_values_sort_in_the_order_first_seen_not_by_address():
    # a kernel's source must not depend on where its IR objects happen to live: two gathers' terms in one
    # index come out in the order the compile first met them, in every process (the cache keys on the source)
    from brrr.compile.ir.indexing import Opaque, Term
    for _ in range(50):
        later = Opaque(Ix.var("xindex", 8))     # allocated first
        first = Opaque(Ix.var("rindex", 8))
        Ix([Term(first, None, 1, None, 1)])      # first seen
        Ix([Term(later, None, 1, None, 3)])
        both = Ix([Term(later, None, 1, None, 3), Term(first, None, 1, None, 1)])
        assert [t.base for t in both.terms] == [first, later]
        assert [t.base for t in (Ix([Term(later, None, 1, None, 3)]) + Ix([Term(first, None, 1, None, 1)])).terms] \
            == [first, later]


def test_memoized_indices_equal_fresh_ones_and_tell_ranges_apart():
    from brrr.compile.ir import indexing

    indexing._MEMO.clear()
    shape, order = (4, 2, 4), (2, 1, 0)
    small, large = Ix.var("xindex", 8), Ix.var("xindex", 64)   # equal Ix.key(), different ranges
    for flat in (small, large, small):
        got = indexing.unflatten(flat, shape, order)
        assert [i.render() for i in got] == [i.render() for i in indexing._unflatten(flat, shape, order)]
    # in range 8, (x // 4) % 2 needs no modulo; in range 64 it does
    assert indexing.unflatten(small, shape, order)[1].render() == "xindex // 4"
    assert indexing.unflatten(large, shape, order)[1].render() == "(xindex // 4) % 2"
    idx = indexing.unflatten(large, shape, order)
    idx[0] = Ix()   # callers change the list they get: the next caller's list is whole
    assert indexing.unflatten(large, shape, order)[0].render() == "xindex // 8"
    for strides in ((8, 4, 1), (1, 16, 2)):
        assert indexing.linear(idx, strides, 3).render() == indexing._linear(idx, strides, 3).render()


@pytest.mark.parametrize("seed", range(6))
def test_division_and_modulo_equal_integer_arithmetic(seed):
    # sums of bounded terms (views' indices, a padding offset below zero among them) divided and taken modulo
    # by the divisors views use: every rewrite (multiples of k leaving the division, mixed-radix digits) exact
    import itertools
    rng = random.Random(seed)
    for _ in range(60):
        sizes = [rng.choice([2, 3, 4, 7, 8, 56]) for _ in range(rng.randint(1, 3))]
        coeffs = [rng.choice([1, 2, 3, 7, 8, 56, 112, 784, 3136]) for _ in sizes]
        const = rng.randint(-120, 120)
        a = Ix.of(const)
        for i, (n, c) in enumerate(zip(sizes, coeffs)):
            a = a + Ix.var(f"v{i}", n) * c
        k1, k2 = rng.choice([2, 3, 4, 7, 8, 56, 784]), rng.choice([2, 3, 8, 56, 64])
        built = [(a // k1, lambda x: x // k1), (a % k2, lambda x: x % k2),
                 ((a // k1) % k2, lambda x: (x // k1) % k2), (a % k2 + (a // k2) * k2, lambda x: x)]
        codes = [(ix, compile(ix.render(), "<index>", "eval"), expect) for ix, expect in built]
        for vals in itertools.product(*[range(n) for n in sizes]):
            x = const + sum(c * v for c, v in zip(coeffs, vals))
            env = {f"v{i}": v for i, v in enumerate(vals)}
            for ix, code, expect in codes:
                assert eval(code, {}, env) == expect(x), (a, ix, env)


def test_a_merged_view_divides_back_into_its_dims():
    # [N, C, H, W] read as [N, G, C // G, H * W] (a group norm): n * 802816 + g * 25088 + c * 3136 + s, s < 3136,
    # unflattened over (C, H, W) and read back at NCHW strides is the flat index again, no division left
    n, g, c, s = Ix.var("n", 32), Ix.var("g", 32), Ix.var("c", 8), Ix.var("s", 3136)
    flat = n * 802816 + g * 25088 + c * 3136 + s
    assert linear(unflatten(flat, (32, 256, 56, 56)), (802816, 3136, 56, 1)) == flat
    # rows of 784 numbered by xindex, divided by 512 rows' worth: xindex // 512
    rows = Ix.var("rindex", 784) + Ix.var("xindex", 16384) * 784
    assert (rows // 401408).render() == "xindex // 512"
    assert (rows % 401408).render() == "rindex + (xindex % 512) * 784"
