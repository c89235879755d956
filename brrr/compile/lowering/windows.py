"""Lowerings: pooling as window reductions (part of core.py's tables).

max_pool2d (with indices), avg_pool2d, adaptive_avg_pool2d and their backward ops become Reductions over the
space (..., OH, OW, KH, KW): output positions, then the positions of a window, reduced. Their kernels walk
memory order like any reduction, so channels_last pooling is a column reduction whose loads run along C. The
backward ops gather instead of scatter: an input position sums the output gradients of the windows that hold
it, enumerated as a small fixed window of candidate output positions (no atomics). im2col (F.unfold) is one
pointwise gather; col2im (F.fold) is the same gather as pooling's backward: each output element sums the column
entries of the windows that cover it (backend.py keeps both ops whole).
"""

import torch

from brrr.compile.ir import nodes as ir
from brrr.compile.ir.indexing import Ix
from brrr.compile.ir.nodes import Const, IndexValue, Op
from brrr.compile.ir.sizes import known_true
from brrr.compile.lowering.core import (NotLowered, cast, device_of, indirect, kept_index, make_reduction, masked,
                                        meta, register)

I64 = torch.int64


def _pair(v, default=None):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return default
    if isinstance(v, int):
        return (v, v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _int(x):
    """An int64 Value: an index expression (Ix) or a Python int."""
    return Const(x, I64) if isinstance(x, int) else IndexValue(Ix.of(x))


def _op(name, *args, dtype=I64):
    return Op(name, [a if isinstance(a, ir.Value) else _int(a) for a in args], dtype)


def _all(conds):
    conds = [c for c in conds if c is not None]
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = Op("and", [out, c], torch.bool)
    return out


def _in_range(ix, low, high, lowest, highest):
    """low <= ix < high, leaving out a bound that the index's own range (lowest, highest) never crosses."""
    return _all([_op("ge", ix, low, dtype=torch.bool) if lowest < low else None,
                 _op("lt", ix, high, dtype=torch.bool) if highest >= high else None])


def _gated(cond, read, fill, dtype):
    """`read()` where `cond` holds (its loads masked by it), else `fill`."""
    if cond is None:
        return cast(read(), dtype)
    value = masked(cond, lambda: cast(read(), dtype))
    if fill == 0 and _masked_load(value, cond):   # a masked load reads 0 where cond fails: no select needed
        return value
    return Op("where", [cond, value, Const(fill, dtype)], dtype)


def _masked_load(v, cond):
    """Whether `v` is 0 wherever `cond` fails: a Load (through casts) masked by `cond`, alone or as the last of its
    masks, or a select between such a value and 0 (max pooling's backward: the gradient where the window's max
    was here)."""
    while isinstance(v, Op) and v.name == "cast":
        v = v.args[0]
    if isinstance(v, Op) and v.name == "where" and isinstance(v.args[2], Const) and v.args[2].value == 0:
        return _masked_load(v.args[1], cond)
    mask = v.mask if isinstance(v, ir.Load) else None
    return mask is cond or (isinstance(mask, Op) and mask.name == "and" and mask.args[-1] is cond)


def _window(L, fx, x, space, value_at):
    """A helper node over the window space whose value at an index is `value_at(idx)`; only inlined."""
    node = ir.pointwise(L.fresh("window"), space, x.dtype, value_at, fx=fx, ops=(fx.target.__name__.split(".")[0],))
    node.meta["device"] = x.meta.get("device") if x.meta.get("device") is not None else x.meta["fake"].device
    return node


def _accumulator(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _lowest(dtype):
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


class Pooling:
    """Sizes of one 2-d pooling: kernel (kh, kw), stride, padding, dilation, input (H, W), output (OH, OW)
    and the leading dims before them."""

    def __init__(self, x_shape, out_shape, kernel_size, stride=None, padding=0, dilation=1):
        self.kh, self.kw = _pair(kernel_size)
        self.sh, self.sw = _pair(stride, (self.kh, self.kw))
        self.ph, self.pw = _pair(padding, (0, 0))
        self.dh, self.dw = _pair(dilation, (1, 1))
        self.lead = tuple(x_shape[:-2])
        self.H, self.W = x_shape[-2:]
        self.OH, self.OW = out_shape[-2:]
        self.nl = len(self.lead)

    def forward_space(self):
        return self.lead + (self.OH, self.OW, self.kh, self.kw), (self.nl + 2, self.nl + 3)

    def input_at(self, idx):
        """(input index, whether it is inside the input) of window position idx = (..., oh, ow, a, b)."""
        oh, ow, a, b = idx[self.nl:]
        ih = Ix.of(oh) * self.sh + Ix.of(a) * self.dh + (-self.ph)
        iw = Ix.of(ow) * self.sw + Ix.of(b) * self.dw + (-self.pw)
        hi_h = (self.OH - 1) * self.sh + (self.kh - 1) * self.dh - self.ph
        hi_w = (self.OW - 1) * self.sw + (self.kw - 1) * self.dw - self.pw
        valid = _all([_in_range(ih, 0, self.H, -self.ph, hi_h), _in_range(iw, 0, self.W, -self.pw, hi_w)])
        return list(idx[:self.nl]) + [ih, iw], valid

    def candidates(self, extent_h, extent_w):
        """For the backward: the space (..., H, W, JH, JW) and, per index, the candidate output position
        (oh, ow) = ((ih + p) // s - (J - 1) + j, ...) with whether it is an output; J covers every window of
        extent (k - 1) * d + 1 that can hold (ih, iw)."""
        jh, jw = (extent_h - 1) // self.sh + 1, (extent_w - 1) // self.sw + 1

        def at(idx):
            ih, iw, a, b = idx[self.nl:]
            oh = (Ix.of(ih) + self.ph) // self.sh + Ix.of(a) + (-(jh - 1))
            ow = (Ix.of(iw) + self.pw) // self.sw + Ix.of(b) + (-(jw - 1))
            valid = _all([_in_range(oh, 0, self.OH, -(jh - 1), (self.H - 1 + self.ph) // self.sh),
                          _in_range(ow, 0, self.OW, -(jw - 1), (self.W - 1 + self.pw) // self.sw)])
            return list(idx[:self.nl]), oh, ow, valid
        return self.lead + (self.H, self.W, jh, jw), (self.nl + 2, self.nl + 3), at

    def windows_inside_padding(self):
        """Whether every window ends inside the padded input (as without ceil_mode): counting the padding, each
        then holds kh * kw positions, and the divisor is a constant, not a dozen integer ops per output."""
        return known_true((self.OH - 1) * self.sh - self.ph + self.kh <= self.H + self.ph) and \
            known_true((self.OW - 1) * self.sw - self.pw + self.kw <= self.W + self.pw)

    def divisor(self, oh, ow, count_include_pad, divisor_override):
        """avg_pool2d's divisor for output (oh, ow), as ATen computes it (an int64 Value)."""
        if divisor_override:
            return _int(int(divisor_override))
        if count_include_pad and self.windows_inside_padding():   # ATen's clip never binds: one divisor for all
            return _int(self.kh * self.kw)
        h0, w0 = _op("sub", _op("mul", oh, self.sh), self.ph), _op("sub", _op("mul", ow, self.sw), self.pw)
        h1 = _op("minimum", _op("add", h0, self.kh), self.H + self.ph)
        w1 = _op("minimum", _op("add", w0, self.kw), self.W + self.pw)
        if not count_include_pad:
            h0, w0 = _op("maximum", h0, 0), _op("maximum", w0, 0)
            h1, w1 = _op("minimum", h1, self.H), _op("minimum", w1, self.W)
        # an empty window (only ceil_mode makes one) sums to 0: divide by 1, as ATen returns 0
        return _op("maximum", _op("mul", _op("sub", h1, h0), _op("sub", w1, w0)), 1)


@register("max_pool2d_with_indices")
def lower_max_pool2d(L, fx, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """values: the window's max (NaN wins); indices: the flat input index (ih * W + iw) of the first max in
    the window's scan order, or of its last NaN, as ATen picks them. The reductions pick a position in the
    window (int32, a constant per element of an unrolled window); its flat index is computed once per output,
    where reducing int64 flat indices cost two int64 selects and a min per window element."""
    values_meta, indices_meta = meta(fx)
    p = Pooling(x.shape, values_meta.shape, kernel_size, stride, padding, dilation)
    space, dims = p.forward_space()
    out_shape, dtype = tuple(values_meta.shape), values_meta.dtype
    I32, positions = torch.int32, p.kh * p.kw

    def value_at(idx):
        src, valid = p.input_at(idx)
        return _gated(valid, lambda: x(src), _lowest(dtype), dtype)
    window = _window(L, fx, x, space, value_at)
    values = make_reduction(L, fx, window, dims, "max", out_shape, dtype)
    compute = _accumulator(dtype)

    def position(idx):
        return IndexValue(Ix.of(idx[p.nl + 2]) * p.kw + idx[p.nl + 3], I32)

    def first_max(idx):
        _, valid = p.input_at(idx)
        hit = Op("eq", [cast(window(idx), compute), cast(values(kept_index(idx, dims, out_shape)), compute)],
                 torch.bool)
        return Op("where", [_all([valid, hit]), position(idx), Const(positions, I32)], I32)
    first = make_reduction(L, fx, window, dims, "min", out_shape, I32, body=first_max, acc_dtype=I32)
    last = None
    if dtype.is_floating_point:
        def last_nan(idx):   # a position outside the input reads -inf, never NaN: no need to ask if it is inside
            nan = Op("isnan", [window(idx)], torch.bool)
            return Op("where", [nan, position(idx), Const(-1, I32)], I32)
        last = make_reduction(L, fx, window, dims, "max", out_shape, I32, body=last_nan, acc_dtype=I32)

    def index_fn(idx):
        pos = first(idx)
        if last is not None:
            n = last(idx)
            pos = Op("where", [Op("ge", [n, Const(0, I32)], torch.bool), n, pos], I32)
        a, b = Op("truncdiv", [pos, Const(p.kw, I32)], I32), Op("fmod", [pos, Const(p.kw, I32)], I32)
        oh, ow = idx[-2], idx[-1]
        ih = _op("add", _op("mul", oh, p.sh), _op("sub", _op("mul", cast(a, I64), p.dh), p.ph))
        iw = _op("add", _op("mul", ow, p.sw), _op("sub", _op("mul", cast(b, I64), p.dw), p.pw))
        return _op("add", _op("mul", ih, p.W), iw)
    indices = ir.pointwise(L.fresh("pw"), out_shape, I64, index_fn, fx=fx, ops=("max_pool2d_with_indices",))
    return values, indices


@register("max_pool2d_with_indices_backward")
def lower_max_pool2d_backward(L, fx, grad, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                              indices=None):
    """grad_input at (ih, iw): the sum of the output gradients of windows whose max was (ih, iw)."""
    m = meta(fx)
    p = Pooling(x.shape, grad.shape, kernel_size, stride, padding, dilation)
    space, dims, candidate = p.candidates((p.kh - 1) * p.dh + 1, (p.kw - 1) * p.dw + 1)
    compute = _accumulator(m.dtype)

    def value_at(idx):
        lead, oh, ow, valid = candidate(idx)
        ih, iw = idx[p.nl], idx[p.nl + 1]
        here = _op("add", _op("mul", ih, p.W), iw)

        def read():
            hit = Op("eq", [cast(indices(lead + [oh, ow]), I64), here], torch.bool)
            return Op("where", [hit, cast(grad(lead + [oh, ow]), compute), Const(0, compute)], compute)
        return _gated(valid, read, 0, compute)
    window = _window(L, fx, x, space, value_at)
    return make_reduction(L, fx, window, dims, "sum", tuple(m.shape), m.dtype)


@register("avg_pool2d")
def lower_avg_pool2d(L, fx, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                     divisor_override=None):
    m = meta(fx)
    p = Pooling(x.shape, m.shape, kernel_size, stride, padding)
    space, dims = p.forward_space()
    compute = _accumulator(m.dtype)

    def value_at(idx):
        src, valid = p.input_at(idx)
        return _gated(valid, lambda: x(src), 0, compute)
    window = _window(L, fx, x, space, value_at)
    total = make_reduction(L, fx, window, dims, "sum", tuple(m.shape), compute, acc_dtype=compute)

    def fn(idx):
        div = cast(p.divisor(idx[-2], idx[-1], count_include_pad, divisor_override), compute)
        return cast(Op("div", [total(idx), div], compute), m.dtype)
    return ir.pointwise(L.fresh("pw"), tuple(m.shape), m.dtype, fn, fx=fx, ops=("avg_pool2d",))


@register("avg_pool2d_backward")
def lower_avg_pool2d_backward(L, fx, grad, x, kernel_size, stride=None, padding=0, ceil_mode=False,
                              count_include_pad=True, divisor_override=None):
    """grad_input at (ih, iw): the sum of grad / divisor over the windows that hold (ih, iw)."""
    m = meta(fx)
    p = Pooling(x.shape, grad.shape, kernel_size, stride, padding)
    space, dims, candidate = p.candidates(p.kh, p.kw)
    compute = _accumulator(m.dtype)

    def value_at(idx):
        lead, oh, ow, valid = candidate(idx)
        ih, iw = idx[p.nl], idx[p.nl + 1]
        # inside the window: ih - (oh * s - p) < k (never below 0: oh <= (ih + p) // s)
        inside = _all([_inside(ih, oh, idx[p.nl + 2], p.ph, p.sh, p.kh), _inside(iw, ow, idx[p.nl + 3], p.pw, p.sw, p.kw)])
        valid = _all([valid, inside])

        def read():
            div = cast(p.divisor(oh, ow, count_include_pad, divisor_override), compute)
            return Op("div", [cast(grad(lead + [oh, ow]), compute), div], compute)
        return _gated(valid, read, 0, compute)
    window = _window(L, fx, x, space, value_at)
    return make_reduction(L, fx, window, dims, "sum", tuple(m.shape), m.dtype)


def _inside(i, o, a, pad, stride, k):
    """Whether input position `i` lies in the window of candidate output `o`, the `a`-th candidate (Pooling.candidates):
    i + pad - o * stride < k. It is (i + pad) % stride + stride * (J - 1 - a), so it can fail only for the first
    candidate, and only when the windows do not tile the stride (k % stride != 0): None where it always holds
    (an unrolled window's candidates are constants, and a check that is never false only costs instructions)."""
    if k % stride == 0 or (Ix.of(a).is_const() and Ix.of(a).const > 0):
        return None
    return _op("lt", _op("sub", _op("add", i, pad), _op("mul", o, stride)), k, dtype=torch.bool)


def _adaptive_bounds(o, size_in, size_out):
    """[start, end) of adaptive pooling's window for output position o (an Ix): floor(o * I / O), ceil(...)."""
    return (Ix.of(o) * size_in) // size_out, (Ix.of(o) * size_in + (size_in + size_out - 1)) // size_out


def _widest(size_in, size_out):
    """The widest adaptive window over all output positions."""
    return max(-(-(o + 1) * size_in // size_out) - o * size_in // size_out for o in range(size_out))


@register("_adaptive_avg_pool2d")
def lower_adaptive_avg_pool2d(L, fx, x, output_size):
    m = meta(fx)
    lead, (H, W), (OH, OW) = tuple(x.shape[:-2]), x.shape[-2:], m.shape[-2:]
    nl, kh, kw = len(lead), _widest(H, OH), _widest(W, OW)
    compute = _accumulator(m.dtype)

    def bounds(oh, ow):
        (h0, h1), (w0, w1) = _adaptive_bounds(oh, H, OH), _adaptive_bounds(ow, W, OW)
        return h0, h1, w0, w1

    def value_at(idx):
        oh, ow, a, b = idx[nl:]
        h0, h1, w0, w1 = bounds(oh, ow)
        valid = _all([_op("lt", _op("add", h0, a), h1, dtype=torch.bool) if H % OH else None,
                      _op("lt", _op("add", w0, b), w1, dtype=torch.bool) if W % OW else None])
        return _gated(valid, lambda: x(list(idx[:nl]) + [h0 + a, w0 + b]), 0, compute)
    window = _window(L, fx, x, lead + (OH, OW, kh, kw), value_at)
    total = make_reduction(L, fx, window, (nl + 2, nl + 3), "sum", tuple(m.shape), compute, acc_dtype=compute)

    def fn(idx):
        h0, h1, w0, w1 = bounds(idx[-2], idx[-1])
        count = cast(_op("mul", _op("sub", h1, h0), _op("sub", w1, w0)), compute)
        return cast(Op("div", [total(idx), count], compute), m.dtype)
    return ir.pointwise(L.fresh("pw"), tuple(m.shape), m.dtype, fn, fx=fx, ops=("adaptive_avg_pool2d",))


@register("_adaptive_avg_pool2d_backward")
def lower_adaptive_avg_pool2d_backward(L, fx, grad, x):
    """grad_input at (ih, iw): grad / window size over the output positions whose windows hold it, which are
    [floor(ih * O / I), ceil((ih + 1) * O / I)) per dim."""
    m = meta(fx)
    lead, (H, W), (OH, OW) = tuple(x.shape[:-2]), x.shape[-2:], grad.shape[-2:]
    nl, jh, jw = len(lead), _widest(OH, H), _widest(OW, W)
    compute = _accumulator(m.dtype)

    def value_at(idx):
        ih, iw, a, b = idx[nl:]
        (o_h0, o_h1), (o_w0, o_w1) = _adaptive_bounds(ih, OH, H), _adaptive_bounds(iw, OW, W)
        oh, ow = o_h0 + a, o_w0 + b
        valid = _all([_op("lt", oh, o_h1, dtype=torch.bool), _op("lt", ow, o_w1, dtype=torch.bool)])

        def read():
            (h0, h1), (w0, w1) = _adaptive_bounds(oh, H, OH), _adaptive_bounds(ow, W, OW)
            count = cast(_op("mul", _op("sub", h1, h0), _op("sub", w1, w0)), compute)
            return Op("div", [cast(grad(list(idx[:nl]) + [oh, ow]), compute), count], compute)
        return _gated(valid, read, 0, compute)
    window = _window(L, fx, x, lead + (H, W, jh, jw), value_at)
    return make_reduction(L, fx, window, (nl + 2, nl + 3), "sum", tuple(m.shape), m.dtype)


class Unfolding:
    """Sizes of im2col / col2im: image (..., C, H, W), columns (..., C * kh * kw, OH * OW)."""

    def __init__(self, image_hw, kernel_size, dilation, padding, stride):
        (self.kh, self.kw), (self.dh, self.dw) = _pair(kernel_size), _pair(dilation)
        (self.ph, self.pw), (self.sh, self.sw) = _pair(padding), _pair(stride)
        self.H, self.W = image_hw
        self.OH = (self.H + 2 * self.ph - (self.kh - 1) * self.dh - 1) // self.sh + 1
        self.OW = (self.W + 2 * self.pw - (self.kw - 1) * self.dw - 1) // self.sw + 1

    @staticmethod
    def candidates(size, k, d, s, p, out):
        """The column positions (o, kernel offset) along one dim that image position i feeds: o counts the
        J = ((k - 1) * d) // s + 1 windows that can reach i, from the last; offset = (i + p - o * s) / d, a
        non-negative value, where it divides and is under k. Returns (J, fn(i, j) -> (o, offset, valid))."""
        J = ((k - 1) * d) // s + 1

        def at(i, j):
            o = (Ix.of(i) + p) // s + Ix.of(j) + (-(J - 1))
            t = _op("sub", _op("add", i, p) if p else _int(i), _op("mul", o, s) if s > 1 else _int(o))
            valid = [_in_range(o, 0, out, -(J - 1), (size - 1 + p) // s)]
            if d == 1:
                offset = t
            else:
                valid.append(_op("eq", _op("fmod", t, d), 0, dtype=torch.bool))
                offset = _op("truncdiv", t, d)
            if d > 1 or J * s > k:   # else the offset, under J * s, is always under k
                valid.append(_op("lt", offset, k, dtype=torch.bool))
            return o, offset, _all(valid)
        return J, at


@register("im2col")
def lower_im2col(L, fx, x, kernel_size, dilation, padding, stride):
    """out[..., c * kh * kw + a * kw + b, oh * OW + ow] = x[..., c, oh * sh + a * dh - ph, ow * sw + b * dw - pw],
    0 outside the image: one pointwise kernel (F.unfold)."""
    m = meta(fx)
    u = Unfolding(x.shape[-2:], kernel_size, dilation, padding, stride)
    nl = len(x.shape) - 3
    out = m.dtype

    def fn(idx):
        ch, l = Ix.of(idx[nl]), Ix.of(idx[nl + 1])
        c, a, b = ch // (u.kh * u.kw), (ch // u.kw) % u.kh, ch % u.kw
        ih = (l // u.OW) * u.sh + a * u.dh + (-u.ph)
        iw = (l % u.OW) * u.sw + b * u.dw + (-u.pw)
        valid = _all([_in_range(ih, 0, u.H, -u.ph, (u.OH - 1) * u.sh + (u.kh - 1) * u.dh - u.ph),
                      _in_range(iw, 0, u.W, -u.pw, (u.OW - 1) * u.sw + (u.kw - 1) * u.dw - u.pw)])
        return _gated(valid, lambda: x(list(idx[:nl]) + [c, ih, iw]), 0, out)
    return ir.pointwise(L.fresh("pw"), tuple(m.shape), out, fn, fx=fx, ops=("im2col",))


@register("col2im")
def lower_col2im(L, fx, cols, output_size, kernel_size, dilation, padding, stride):
    """out[..., c, h, w]: the sum of the column entries that cover (h, w), gathered per output element as a
    reduction over the (JH, JW) windows that can reach it (F.fold; no atomics, deterministic)."""
    m = meta(fx)
    u = Unfolding(tuple(output_size), kernel_size, dilation, padding, stride)
    if u.OH * u.OW != cols.shape[-1]:
        raise NotLowered("col2im columns that do not match the output size")
    nl = len(m.shape) - 3
    lead, C = tuple(m.shape[:nl]), m.shape[nl]
    compute = _accumulator(m.dtype)
    jh, along_h = u.candidates(u.H, u.kh, u.dh, u.sh, u.ph, u.OH)
    jw, along_w = u.candidates(u.W, u.kw, u.dw, u.sw, u.pw, u.OW)

    def value_at(idx):
        c, h, w, a, b = idx[nl:]
        oh, ki, vh = along_h(h, a)
        ow, kj, vw = along_w(w, b)
        channel = Ix.of(c) * (u.kh * u.kw) + indirect(_op("add", _op("mul", ki, u.kw), kj))
        return _gated(_all([vh, vw]), lambda: cols(list(idx[:nl]) + [channel, Ix.of(oh) * u.OW + ow]), 0, compute)
    space = lead + (C, u.H, u.W, jh, jw)
    window = ir.pointwise(L.fresh("window"), space, compute, value_at, fx=fx, ops=("col2im",))
    window.meta["device"] = device_of(cols)
    return make_reduction(L, fx, window, (nl + 3, nl + 4), "sum", tuple(m.shape), m.dtype)
