"""Orthogonal polynomials for generated kernels (codegen helper, beside special_functions.py): Chebyshev (T, U, V,
W and their shifted forms), Hermite (physicists' and probabilists'), Laguerre and Legendre, as @triton.jit helpers
from portable primitives.

Each runs the recurrence ATen's CPU kernel runs, in fp32, to the largest n of the block, with its closed forms and
special values where eager takes them. special_functions.SPECIAL_HELPERS takes these in, after the gamma,
error-function and Bessel families.
"""

POLYNOMIALS = {
    # the orthogonal polynomials take n as a float tensor, truncated as eager's cast to int64 (NaN, infinities
    # and values past int64 give a negative n there, so 0); the recurrences run to the largest n of the block
    "poly_n": '''
@triton.jit
def poly_n(n):
    ok = (n == n) & (tl.abs(n) < 9.223372036854776e18)
    return tl.where(ok, trunc(n), -1.0)
''',
    "poly_even": '''
@triton.jit
def poly_even(n):
    return tl.math.floor(n * 0.5) * 2.0 == n
''',
    "acos_f": '''
@triton.jit
def acos_f(x):
    return atan2(tl.sqrt((1.0 - x) * (1.0 + x)), x)
''',
    "cheb_rec": '''
@triton.jit
def cheb_rec(y2, q, n, use):
    # r_k = y2 r_{k-1} - r_{k-2} for k = 2..n from r_0 = 1, r_1 = q, stopping where a value is NaN (as eager)
    p = tl.zeros_like(q) + 1.0
    r = q
    k = 2
    go = tl.max(use.to(tl.int32)) > 0
    while go:
        active = use & (k <= n) & (q == q)
        nxt = y2 * q - p
        r = tl.where(active, nxt, r)
        p = tl.where(active, q, p)
        q = tl.where(active, nxt, q)
        k += 1
        go = tl.max(active.to(tl.int32)) > 0
    return r
''',
    "chebyshev_t": '''
@triton.jit
def chebyshev_t(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    ax = tl.abs(x)
    closed = (n > 6) & (ax < 1.0)
    r = cheb_rec(x + x, x, n, (n >= 2) & ~closed & (ax != 1.0))
    r = tl.where(n == 1, x, tl.where(n == 0, 1.0, r))
    r = tl.where(closed, tl.cos(n * acos_f(x)), r)
    r = tl.where(ax == 1.0, tl.where((x > 0) | poly_even(n), 1.0, -1.0), r)
    return tl.where(n < 0, 0.0, r)
''',
    "chebyshev_u": '''
@triton.jit
def chebyshev_u(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    ax = tl.abs(x)
    closed = (n > 8) & (ax < 1.0)
    r = cheb_rec(x + x, x + x, n, (n >= 2) & ~closed & (ax != 1.0))
    r = tl.where(n == 1, x + x, tl.where(n == 0, 1.0, r))
    th = acos_f(x)
    s = tl.sin(th)
    r = tl.where(closed, tl.where(s != 0, tl.sin((n + 1.0) * th) / s, (n + 1.0) * tl.cos((n + 1.0) * th) / x), r)
    r = tl.where(ax == 1.0, tl.where((x > 0) | poly_even(n), n + 1.0, -(n + 1.0)), r)
    return tl.where(n < 0, 0.0, r)
''',
    "chebyshev_v": '''
@triton.jit
def chebyshev_v(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    ax = tl.abs(x)
    closed = (n > 8) & (ax < 1.0)
    r = cheb_rec(x + x, x + x - 1.0, n, (n >= 2) & ~closed & (ax != 1.0))
    r = tl.where(n == 1, x + x - 1.0, tl.where(n == 0, 1.0, r))
    odd_end = tl.where(poly_even(n), n + n + 1.0, -(n + n + 1.0))
    th = acos_f(x)
    r = tl.where(closed, tl.where(tl.sin(th / 2.0) != 1.0, tl.cos((n + 0.5) * th) / tl.cos(th / 2.0), odd_end), r)
    r = tl.where(ax == 1.0, tl.where(x > 0, 1.0, odd_end), r)
    return tl.where(n < 0, 0.0, r)
''',
    "chebyshev_w": '''
@triton.jit
def chebyshev_w(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    ax = tl.abs(x)
    closed = (n > 8) & (ax < 1.0)
    r = cheb_rec(x + x, x + x + 1.0, n, (n >= 2) & ~closed & (ax != 1.0))
    r = tl.where(n == 1, x + x + 1.0, tl.where(n == 0, 1.0, r))
    end = tl.where(x > 0, n + n + 1.0, tl.where(poly_even(n), 1.0, -1.0))
    th = acos_f(x)
    r = tl.where(closed, tl.where(tl.cos(th / 2.0) != 1.0, tl.sin((n + 0.5) * th) / tl.sin(th / 2.0), end), r)
    r = tl.where(ax == 1.0, end, r)
    return tl.where(n < 0, 0.0, r)
''',
    "shifted_chebyshev_t": '''
@triton.jit
def shifted_chebyshev_t(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    u = x + x - 1.0
    closed = (n > 6) & (tl.abs(u) < 1.0)
    r = cheb_rec(u + u, u, n, (n >= 2) & ~closed & (x != 1.0) & (x != 0.0))
    r = tl.where(n == 1, u, tl.where(n == 0, 1.0, r))
    r = tl.where(closed, tl.cos(n * acos_f(u)), r)
    r = tl.where(x == 0.0, tl.where(poly_even(n), 1.0, -1.0), r)
    r = tl.where(x == 1.0, 1.0, r)
    return tl.where(n < 0, 0.0, r)
''',
    "shifted_chebyshev_u": '''
@triton.jit
def shifted_chebyshev_u(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    u = x + x - 1.0
    closed = (n > 6) & (tl.abs(u) < 1.0)
    r = cheb_rec(u + u, u + u, n, (n >= 2) & ~closed & (x != 1.0) & (x != 0.0))
    r = tl.where(n == 1, u + u, tl.where(n == 0, 1.0, r))
    th = acos_f(u)
    s = tl.sin(th)
    r = tl.where(closed, tl.where(s != 0, tl.sin((n + 1.0) * th) / s, (n + 1.0) * tl.cos((n + 1.0) * th) / u), r)
    r = tl.where(x == 0.0, tl.where(poly_even(n), n + 1.0, -(n + 1.0)), r)
    r = tl.where(x == 1.0, n + 1.0, r)
    return tl.where(n < 0, 0.0, r)
''',
    "shifted_chebyshev_v": '''
@triton.jit
def shifted_chebyshev_v(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    u = x + x - 1.0
    closed = (n > 6) & (tl.abs(u) < 1.0)
    r = cheb_rec(u + u, u + u - 1.0, n, (n >= 2) & ~closed & (x != 1.0) & (x != 0.0))
    r = tl.where(n == 1, u + u - 1.0, tl.where(n == 0, 1.0, r))
    odd_end = tl.where(poly_even(n), n + n + 1.0, -(n + n + 1.0))
    th = acos_f(u)
    r = tl.where(closed, tl.where(tl.sin(th / 2.0) != 1.0, tl.cos((n + 0.5) * th) / tl.cos(th / 2.0), odd_end), r)
    r = tl.where(x == 0.0, odd_end, r)
    r = tl.where(x == 1.0, 1.0, r)
    return tl.where(n < 0, 0.0, r)
''',
    "shifted_chebyshev_w": '''
@triton.jit
def shifted_chebyshev_w(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    u = x + x - 1.0
    closed = (n > 4) & (tl.abs(u) < 1.0)
    r = cheb_rec(u + u, u + u + 1.0, n, (n >= 2) & ~closed & (x != 1.0) & (x != 0.0))
    r = tl.where(n == 1, u + u + 1.0, tl.where(n == 0, 1.0, r))
    sign_end = tl.where(poly_even(n), 1.0, -1.0)
    th = acos_f(u)
    r = tl.where(closed, tl.where(tl.cos(th / 2.0) != 1.0, tl.sin((n + 0.5) * th) / tl.sin(th / 2.0), sign_end), r)
    r = tl.where(x == 0.0, sign_end, r)
    r = tl.where(x == 1.0, n + n + 1.0, r)
    return tl.where(n < 0, 0.0, r)
''',
    "hermite_h": '''
@triton.jit
def hermite_h(x, n, physicists: tl.constexpr):
    # H_n (physicists) or He_n by their three-term recurrences; NaN past n = 128, as eager in float32
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    if physicists:
        q = x + x
    else:
        q = x
    p = tl.zeros_like(x) + 1.0
    r = q
    use = (n >= 2) & (n <= 128)
    j = 1
    go = tl.max(use.to(tl.int32)) > 0
    while go:
        active = use & (j < n)
        if physicists:
            nxt = (x + x) * q - (2.0 * j) * p
        else:
            nxt = x * q - (1.0 * j) * p
        r = tl.where(active, nxt, r)
        p = tl.where(active, q, p)
        q = tl.where(active, nxt, q)
        j += 1
        go = tl.max(active.to(tl.int32)) > 0
    if physicists:
        r = tl.where(n == 1, x + x, r)
    else:
        r = tl.where(n == 1, x, r)
    r = tl.where(n > 128, float("nan"), tl.where(n == 0, 1.0, r))
    return tl.where(n < 0, 0.0, r)
''',
    "laguerre_l": '''
@triton.jit
def laguerre_l(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    p = tl.zeros_like(x) + 1.0
    q = 1.0 - x
    r = q
    use = (n >= 2) & (x != 0.0)
    k = 1
    go = tl.max(use.to(tl.int32)) > 0
    while go:
        active = use & (k < n) & (q == q)
        nxt = ((k + k) + (1.0 - x)) * q - k * p
        nxt = nxt / (k + 1.0)
        r = tl.where(active, nxt, r)
        p = tl.where(active, q, p)
        q = tl.where(active, nxt, q)
        k += 1
        go = tl.max(active.to(tl.int32)) > 0
    r = tl.where(n == 1, 1.0 - x, tl.where(n == 0, 1.0, r))
    r = tl.where(x == 0.0, 1.0, r)
    return tl.where(n < 0, 0.0, r)
''',
    "legendre_p": '''
@triton.jit
def legendre_p(x, n):
    x, n = tl.broadcast(x, n)
    n = poly_n(n)
    p = tl.zeros_like(x) + 1.0
    q = x
    r = q
    use = (n >= 2) & (tl.abs(x) != 1.0)
    k = 1
    go = tl.max(use.to(tl.int32)) > 0
    while go:
        active = use & (k < n) & (q == q)
        nxt = ((k + k + 1) * x * q - k * p) / (k + 1.0)
        r = tl.where(active, nxt, r)
        p = tl.where(active, q, p)
        q = tl.where(active, nxt, q)
        k += 1
        go = tl.max(active.to(tl.int32)) > 0
    r = tl.where(n == 1, x, tl.where(n == 0, 1.0, r))
    r = tl.where(tl.abs(x) == 1.0, tl.where((x > 0) | poly_even(n), 1.0, -1.0), r)
    return tl.where(n < 0, 0.0, r)
''',
}
