"""How the op_db sweep (opdb.py) judges a result: values against eager, random values statistically against
eager's draws, undefined values (`empty*`) by metadata.

A result is a dict: "out" (the op's outputs), "grads" (gradients of the inputs that require grad, backward
cases), "inputs" (the inputs after the call: an op that writes into its input must write the same).
"""

import math

import torch
import torch.utils._pytree as pytree

# relative/absolute tolerance against eager per dtype; an element outside it still agrees when brrr is at
# least as close to the float64 result as eager is (eager's own rounding is no standard to hold brrr to)
TOLERANCE = {torch.float64: (1e-7, 1e-7), torch.float32: (1.3e-5, 1e-5), torch.float16: (2e-3, 1e-3),
             torch.bfloat16: (1.6e-2, 1e-3)}
# random ops: eager's reference draws stand for each element's distribution; brrr's draws and eager's held-out
# draws are ranked among them alike
REFERENCE_DRAWS, HELD_OUT_DRAWS, BRRR_DRAWS = 16, 16, 8
Z_BOUND = 6.0                      # statistics farther than this many standard errors from eager's are wrong


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def leaves(result):
    keys = ["out", "grads", "inputs"]
    return [(k, [dense(t) for t in pytree.tree_leaves(result.get(k))]) for k in keys if k in result]


def dense(t):
    return t.to_dense() if isinstance(t, torch.Tensor) and t.layout != torch.strided else t


def same(a, b):
    """Whether two results hold the same numbers (NaN equal to NaN)."""
    for (_, xs), (_, ys) in zip(leaves(a), leaves(b)):
        for x, y in zip(xs, ys):
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                if x.shape != y.shape or x.dtype != y.dtype:
                    return False
                if not torch.equal(real(x), real(y)):
                    xf, yf = real(x), real(y)
                    if not (xf.is_floating_point() and torch.equal(xf.isnan(), yf.isnan())
                            and torch.equal(xf.nan_to_num(), yf.nan_to_num())):
                        return False
            elif x != y and not (isinstance(x, float) and math.isnan(x) and isinstance(y, float) and math.isnan(y)):
                return False
    return True


def real(t):
    return torch.view_as_real(t.resolve_conj().resolve_neg()) if t.is_complex() else t


def compare(got, ref, reference64):
    """None when `got` agrees with eager's `ref`, else what differs. `reference64()` gives eager's result in
    float64 (asked for only when an element is outside the tolerance)."""
    for (kind, xs), (_, ys) in zip(leaves(got), leaves(ref)):
        if len(xs) != len(ys):
            return f"{kind}: {len(xs)} values, eager has {len(ys)}"
        for i, (x, y) in enumerate(zip(xs, ys)):
            why = compare_one(x, y, None)
            if why:
                ref64 = reference64()
                zs = [dense(t) for t in pytree.tree_leaves(ref64.get(kind))] if ref64 is not None else []
                z = zs[i] if i < len(zs) and isinstance(zs[i], torch.Tensor) else None
                why = compare_one(x, y, z) if z is not None else why
            if why:
                return f"{kind}[{i}]: {why}"
    return None


def compare_one(x, y, z):
    if isinstance(y, torch.Tensor):
        if not isinstance(x, torch.Tensor):
            return f"a {type(x).__name__}, eager a tensor"
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{dtype_name(x.dtype)}{list(x.shape)}, eager {dtype_name(y.dtype)}{list(y.shape)}"
        if y.is_complex():
            x, y, z = real(x), real(y), (real(z) if z is not None and z.is_complex() else None)
        if not y.is_floating_point():
            if not torch.equal(x, y):
                bad = (x != y).nonzero()[0].tolist()
                return f"{int((x != y).sum())} of {y.numel()} differ, e.g. at {bad}: {x[tuple(bad)].item()} " \
                       f"vs {y[tuple(bad)].item()}"
            return None
        return compare_float(x, y, z)
    if isinstance(y, float) and isinstance(x, float):
        return None if (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6) \
            else f"{x} vs {y}"
    if x != y:
        return f"{x!r} vs {y!r}"
    return None


def compare_float(x, y, z):
    rtol, atol = TOLERANCE.get(y.dtype, (1.3e-5, 1e-5))
    xd, yd = x.double(), y.double()
    zd = z.double() if z is not None and z.shape == y.shape else None
    # NaN and inf where eager has them, and nowhere else; except that a half-precision eager result that
    # overflowed in its half-precision intermediates (inf, or NaN from inf - inf) is no standard where brrr,
    # computing in fp32, gives the float64 result
    rescued = torch.zeros_like(yd, dtype=torch.bool)
    if zd is not None and y.dtype in (torch.float16, torch.bfloat16):
        z_half = zd.to(y.dtype).double()
        rescued = ~torch.isfinite(yd) & torch.isfinite(xd) & (xd == z_half)
    nan_x, nan_y = xd.isnan(), yd.isnan() & ~rescued
    if not torch.equal(nan_x, nan_y):
        return f"NaN pattern differs: {int(nan_x.sum())} NaN vs eager's {int(nan_y.sum())}"
    inf_x, inf_y = xd.isinf(), yd.isinf() & ~rescued
    if not torch.equal(inf_x, inf_y) or not torch.equal(xd[inf_x], yd[inf_y]):
        return f"inf pattern differs: {int(inf_x.sum())} inf vs eager's {int(inf_y.sum())}"
    finite = torch.isfinite(yd)
    err = (xd - yd).abs()
    bad = finite & (err > atol + rtol * yd.abs())
    if bad.any() and zd is not None:
        own = (yd - zd).abs()   # eager's own error against float64
        bad &= ~((xd - zd).abs() <= 2 * own + atol + rtol * zd.abs())
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        return f"{int(bad.sum())} of {y.numel()} elements differ, e.g. at {list(i)}: {xd[i].item():.7g} vs " \
               f"eager {yd[i].item():.7g}" + (f" (float64 {z.double()[i].item():.7g})" if z is not None else "")
    return None


def compare_metadata(got, ref, strides=True):
    for (kind, xs), (_, ys) in zip(leaves(got), leaves(ref)):
        if kind == "inputs":
            continue
        for x, y in zip(xs, ys):
            if isinstance(y, torch.Tensor):
                if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                    return f"{kind}: {x if not isinstance(x, torch.Tensor) else (x.dtype, list(x.shape))} " \
                           f"vs eager {y.dtype}{list(y.shape)}"
                if strides and strides_that_matter(x) != strides_that_matter(y):
                    return f"{kind}: strides {x.stride()} vs eager {y.stride()}"
    return None


def strides_that_matter(t):
    return tuple(s for s, n in zip(t.stride(), t.shape) if n > 1)


def real_dtype(dtype):
    return dtype if dtype.is_floating_point else torch.float32


def numbers(result):
    return [real(t).detach().double().flatten() for _, ts in leaves(result) for t in ts
            if isinstance(t, torch.Tensor) and t.numel()]


def same_distribution(b, e, dtype):
    """b: [draws, n] of brrr's, e: [draws, n] of eager's. An output eager never varies is compared as values.
    Otherwise each value is ranked among eager's reference draws of its element, values within the dtype's
    tolerance counting as ties (its mid-rank in [0, 1]: the same distribution for brrr's draws as for eager's
    held-out draws when brrr draws from eager's distribution, whatever that is: heavy tails, discrete values,
    rounding noise around zero). Per draw, the mean rank and the mean squared distance of the ranks from 1/2 (a
    variance) must lie where eager's held-out draws put them. Statistics per draw, not per element: elements
    of one draw may be correlated (a dropout mask per channel)."""
    known = ~(torch.isnan(e).any(0) | torch.isnan(b).any(0))
    e, b = e[:, known], b[:, known]
    if not e.numel():
        return None
    rtol, atol = TOLERANCE.get(dtype, (0, 0)) if dtype.is_floating_point else (0, 0)
    if ((e - e[:1]).abs() <= atol + rtol * e[:1].abs()).all():
        for row in b:
            why = compare_float(row.to(dtype), e[0].to(dtype), None)
            if why:
                return f"eager never varies it, brrr: {why}"
        return None
    ref, held_out = e[:REFERENCE_DRAWS], e[REFERENCE_DRAWS:]

    def ranks(x):
        tol = (atol + rtol * x.abs())[:, None]
        less = (ref[None] < x[:, None] - tol).sum(1)
        tie = ((ref[None] - x[:, None]).abs() <= tol).sum(1)
        return (less + 0.5 * tie) / ref.shape[0]
    if (b == b[:1]).all() and len({tuple(row.tolist()) for row in e}) == len(e):
        return "every draw gave the same numbers, where no two of eager's agree"
    rank_b, rank_e = ranks(b), ranks(held_out)
    for what, stat_b, stat_e in (("mean", rank_b, rank_e), ("variance", (rank_b - 0.5) ** 2, (rank_e - 0.5) ** 2)):
        per_b, per_e = stat_b.mean(1), stat_e.mean(1)
        se = per_e.std().item() * math.sqrt(1 / len(per_b) + 1 / len(per_e)) + 1e-6
        z = (per_b.mean().item() - per_e.mean().item()) / se
        if abs(z) > Z_BOUND:
            return f"{what} of the values' ranks among eager's draws is {z:+.1f} standard errors off"
    # elements drawn together where eager draws them apart (one random number for a whole tensor) make the
    # mean rank of a draw swing from draw to draw: compare its variance across draws with eager's
    ratio = rank_b.mean(1).var().item() / max(rank_e.mean(1).var().item(), 1e-12)
    bound = math.exp(Z_BOUND * math.sqrt(2 / (len(rank_b) - 1) + 2 / (len(rank_e) - 1)))
    if ratio > bound:
        return f"the mean rank varies {ratio:.3g}x as much across draws as eager's (bound {bound:.3g})"
    return None
