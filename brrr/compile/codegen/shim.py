"""Math shim for generated kernels (codegen helper): one source for the GPU and the Triton interpreter.

`tl.math` has exp/log/sin/cos/sqrt/rsqrt/erf/floor/ceil in both triton 3.6 and 3.9 and in the interpreter;
tanh, pow and a few more are not portable (libdevice is GPU-only), so they are written here as small
@triton.jit functions from portable primitives; the special functions (lgamma, Bessel, ...) are in
special_functions.py. Codegen copies only the helpers a kernel uses into its module.
"""


HELPERS = {
    "tanh": '''
@triton.jit
def tanh(x):
    # stable for large |x|: tanh(x) = sign(x) * (1 - e) / (1 + e), e = exp(-2|x|)
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)
''',
    "atan": '''
@triton.jit
def atan(x):
    # Cephes' atanf: reduce |x| to [0, tan(pi/8)], then an odd polynomial (fp32 accuracy)
    a = tl.abs(x)
    big = a > 2.414213562373095
    mid = (a > 0.4142135623730950) & (a <= 2.414213562373095)
    z = tl.where(big, -1.0 / tl.where(big, a, 1.0), tl.where(mid, (a - 1.0) / (a + 1.0), a))
    base = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    z2 = z * z
    p = (((8.05374449538e-2 * z2 - 1.38776856032e-1) * z2 + 1.99777106478e-1) * z2 - 3.33329491539e-1) * z2 * z + z
    r = base + p
    return tl.where(x < 0, -r, r)
''',
    "atan2": '''
@triton.jit
def atan2(y, x):
    # the angle of (x, y) in [-pi, pi] from atan of a ratio in [0, 1]; signed zeros and infinities as in C
    ax = tl.abs(x)
    ay = tl.abs(y)
    swap = ay > ax
    num = tl.where(swap, ax, ay)
    den = tl.where(swap, ay, ax)
    both_zero = (num == 0) & (den == 0)
    both_inf = (num == float('inf')) & (den == float('inf'))
    ratio = tl.where(both_zero, 0.0, tl.where(both_inf, 1.0, num / tl.where(both_zero, 1.0, den)))
    t = atan(ratio)
    t = tl.where(swap, 1.5707963267948966 - t, t)
    neg_x = (x < 0) | ((x == 0) & ((1.0 / tl.where(x == 0, x, 1.0)) < 0))
    t = tl.where(neg_x, 3.141592653589793 - t, t)
    neg_y = (y < 0) | ((y == 0) & ((1.0 / tl.where(y == 0, y, 1.0)) < 0))
    return tl.where(neg_y, -t, t)
''',
    "pow": '''
@triton.jit
def pow(x, y):
    # x ** y for float tensors, with torch's signs for negative bases and integral exponents; y may be a
    # constant (x ** 5.0)
    y = tl.zeros_like(x) + y
    r = tl.exp2(y * tl.log2(tl.abs(x)))
    y_int = tl.math.floor(y) == y
    y_odd = y_int & ((tl.math.floor(y * 0.5) * 2.0) != y)
    r = tl.where((x < 0) & y_odd, -r, r)
    r = tl.where((x < 0) & (~y_int), float("nan"), r)
    r = tl.where(y == 0, 1.0, r)
    return r
''',
    "acosh": '''
@triton.jit
def acosh(x):
    # log1p((x - 1) + sqrt((x - 1)(x + 1))): exact near 1; log(x) + log(2) where x * x would overflow
    big = x > 1e18
    xs = tl.where(big, 2.0, x)
    t = xs - 1.0
    r = log1p(t + tl.sqrt(t * (xs + 1.0)))
    r = tl.where(x < 1.0, float("nan"), r)
    return tl.where(big, tl.log(x) + 0.6931471805599453, r)
''',
    "asinh": '''
@triton.jit
def asinh(x):
    # odd: log1p(a + a^2 / (1 + sqrt(1 + a^2))) for a = |x|, exact near 0; log(a) + log(2) where a^2 overflows
    a = tl.abs(x)
    big = a > 1e18
    s = tl.where(big, 1.0, a)
    r = log1p(s + s * s / (1.0 + tl.sqrt(1.0 + s * s)))
    r = tl.where(big, tl.log(a) + 0.6931471805599453, r)
    return tl.where(x < 0, -r, r)
''',
    "atanh": '''
@triton.jit
def atanh(x):
    return 0.5 * log1p(2.0 * x / (1.0 - x))
''',
    "signbit": '''
@triton.jit
def signbit(x):
    # x < 0, and -0.0 too
    return (x < 0) | ((x == 0) & ((1.0 / tl.where(x == 0, x, 1.0)) < 0))
''',
    "hypot": '''
@triton.jit
def hypot(a, b):
    # sqrt(a^2 + b^2) without overflow: max * sqrt(1 + (min / max)^2); inf wins over NaN, as in C
    x = tl.abs(a)
    y = tl.abs(b)
    big = tl.where(x > y, x, y)
    small = tl.where(x > y, y, x)
    r = small / tl.where(big == 0, 1.0, big)
    h = tl.where(big == 0, 0.0, big * tl.sqrt(1.0 + r * r))
    h = tl.where((x != x) | (y != y), float("nan"), h)
    return tl.where((x == float("inf")) | (y == float("inf")), float("inf"), h)
''',
    "round_half_even": '''
@triton.jit
def round_half_even(x):
    r = tl.math.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (tl.math.floor(r * 0.5) * 2.0) != r
    r = tl.where(tie & odd, r - 1.0, r)
    return tl.where(r == 0, x * 0.0, r)   # a zero keeps x's sign: round(-0.3) is -0.0
''',
    # Exact bfloat16 conversions for the Triton interpreter, as bit manipulations: its own fp32 -> bf16 cast
    # truncates, and both directions lose subnormals. Compiled kernels use Triton's casts, which are exact.
    "bf16_rne": '''
@triton.jit
def bf16_rne(x):
    # to bfloat16 rounded to nearest even, as eager does (overflow rounds to inf, NaN stays NaN)
    bits = tl.cast(x, tl.float32).to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x != x, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
''',
    "bf16_to_fp32": '''
@triton.jit
def bf16_to_fp32(x):
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
''',
    "trunc": '''
@triton.jit
def trunc(x):
    return tl.where(x < 0, tl.math.ceil(x), tl.math.floor(x))
''',
    "prod_combine": '''
@triton.jit
def prod_combine(a, b):
    return a * b
''',
    "max_nan": '''
@triton.jit
def max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "min_nan": '''
@triton.jit
def min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "expm1": '''
@triton.jit
def expm1(x):
    small = tl.abs(x) < 1e-5
    return tl.where(small, x + 0.5 * x * x, tl.exp(x) - 1.0)
''',
    "log1p": '''
@triton.jit
def log1p(x):
    small = tl.abs(x) < 1e-4
    return tl.where(small, x - 0.5 * x * x + x * x * x / 3.0, tl.log(1.0 + x))
''',
    "floordiv_int": '''
@triton.jit
def floordiv_int(a, b):
    q = a // b
    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), q - 1, q)
''',
    "remainder_int": '''
@triton.jit
def remainder_int(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
''',
}

from brrr.compile.codegen.special_functions import SPECIAL_HELPERS  # noqa: E402

HELPERS.update(SPECIAL_HELPERS)


def prelude(used):
    return "".join(HELPERS[name] for name in sorted(used))
