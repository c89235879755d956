"""The special functions' test inputs (the gamma, error-function and Bessel families, the orthogonal
polynomials), shared by tests/compile/test_special_functions.py (CPU, Triton interpreter) and
tests/compile/gpu_smoke.py (the same cases compiled for the GPU). No pytest here: the GPU machine lacks it."""

import torch

S = torch.special
INF, NAN = float("inf"), float("nan")
SPECIAL_VALUES = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 1e-30, -1e-30, 1e30, -1e30, INF, -INF, NAN, 3.0,
                  7.5, -7.5, 8.0, -8.48, 5.77, 1.4616, -2.457, 10.0, 2.09, -2.09, 5.0, 50.0, 51.0, -6.2, -30.0,
                  0.03, 1e-5, 100.0, 1e-3, -3.3, 15.0]
REAL_LINE = torch.tensor(SPECIAL_VALUES + torch.linspace(-12, 12, 49).tolist())
UNIT = torch.tensor([0.0, 1.0, -1.0, 0.5, 1e-30, 0.13, 0.14, 0.86, 0.87, 1e-20, 1 - 6e-8, -0.1, 1.1, 0.7, -0.7,
                     0.999, NAN] + torch.linspace(-0.98, 0.98, 25).tolist())

# name -> (function of one tensor, its inputs)
GAMMA = {
    "lgamma": (torch.lgamma, REAL_LINE), "digamma": (torch.digamma, REAL_LINE),
    **{f"polygamma_{n}": ((lambda n: lambda x: torch.polygamma(n, x))(n), REAL_LINE) for n in range(1, 6)},
    "special.polygamma_0": (lambda x: S.polygamma(0, x), REAL_LINE),
    "mvlgamma_3": (lambda x: torch.mvlgamma(x, 3), torch.linspace(1.01, 12, 23)),
}
ERROR = {
    "erfinv": (torch.erfinv, UNIT), "erfcx": (S.erfcx, REAL_LINE), "log_ndtr": (S.log_ndtr, REAL_LINE),
    "ndtri": (S.ndtri, (UNIT + 1) / 2),
}
BESSEL = {name: (fn, REAL_LINE) for name, fn in {
    "i0": torch.i0, "i0e": S.i0e, "i1": S.i1, "i1e": S.i1e, "modified_bessel_i0": S.modified_bessel_i0,
    "modified_bessel_i1": S.modified_bessel_i1, "modified_bessel_k0": S.modified_bessel_k0,
    "modified_bessel_k1": S.modified_bessel_k1, "scaled_modified_bessel_k0": S.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": S.scaled_modified_bessel_k1, "bessel_j0": S.bessel_j0, "bessel_j1": S.bessel_j1,
    "bessel_y0": S.bessel_y0, "bessel_y1": S.bessel_y1, "spherical_bessel_j0": S.spherical_bessel_j0,
    "airy_ai": S.airy_ai}.items()}
FAMILIES = {"gamma": GAMMA, "error": ERROR, "bessel": BESSEL}

POLYNOMIALS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
               "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
               "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
               "laguerre_polynomial_l", "legendre_polynomial_p"]
# x: the shortcuts at 0 and +-1, inside and outside [-1, 1]; n: negative, 0, 1, the recurrences, the closed forms
# past n = 4, 6, 8 (not far past: cos(n acos x) amplifies acos's last-bit error n times), hermite's limit of 128,
# and n's that eager casts to a negative int64 (NaN, inf, 1e19)
POLY_X = torch.tensor([0.0, 1.0, -1.0, 0.5, -0.5, 0.25, 0.75, 0.999, -0.3, 1.5, -2.5, 3.3, -8.48, 1e-3, INF, -INF])
POLY_N = torch.tensor([-1.77, -1.0, 0.0, 1.0, 2.0, 3.61, 5.0, 6.0, 7.0, 9.0, 10.5, 13.0, 20.0, 40.0, 129.0, INF, NAN,
                       1e19])


def family(table, dtype):
    names = list(table)

    def fn(*xs):
        return tuple(table[name][0](x) for name, x in zip(names, xs))
    inputs = [table[name][1].to(dtype) for name in names]
    return names, fn, inputs


def eager_has(fn, dtype):
    try:
        fn(torch.ones(2, dtype=dtype))
        return True
    except (RuntimeError, NotImplementedError):
        return False
