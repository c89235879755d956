"""Unrolled window reductions in strips (codegen/unrolled.py): a lane computes consecutive output rows whose
windows overlap, each shared load written once. Values against eager's float64 result, and the loads a kernel
writes per output."""

import pytest
import torch
import torch.nn.functional as F

from tests.compile.helpers import compiled
from tests.compile.test_layout import plans

aten = torch.ops.aten


def window_source(fn, *inputs):
    """(source, kept elements, rows a lane computes) of the one reduction kernel brrr plans for fn."""
    meta = [x.to("meta") if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    torch._dynamo.reset()
    (kernel, src), = [(k, s) for _, _, ks in plans(fn, *meta) for k, s in ks.items() if k.dims]
    body = src.source.split("@triton.jit")[-1]
    lanes = int(body.split("xnumel = ")[1].split("\n")[0])
    return body, kernel.xnumel(), kernel.xnumel() // lanes


def max_pool(x):
    return aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])


def avg_pool(x):
    return F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)


def avg_pool_backward(g, x):
    return aten.avg_pool2d_backward(g, x, [3, 3], [1, 1], [1, 1], False, False, None)


def max_pool_backward(g, x, indices):
    return aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, indices)


def test_a_stride_one_window_loads_each_input_row_once_per_strip():
    # 8 output rows of a 3x3 stride-1 window read 10 input rows of 3 columns: 30 loads, not 72
    body, _, rows = window_source(avg_pool, torch.randn(2, 3, 16, 20))
    assert rows == 8 and body.count("tl.load(") == 30


def test_a_stride_two_window_shares_the_rows_between_outputs():
    # max pool 3x3/2: 8 output rows read 17 input rows of 3 columns (51 loads, not 72)
    body, _, rows = window_source(max_pool, torch.randn(2, 3, 32, 20))
    assert rows == 8 and body.count("tl.load(") == 51


def test_windows_that_do_not_overlap_take_no_strips():
    # 2x2 stride 2: no input is in two windows, so nothing would be shared
    body, _, rows = window_source(lambda x: F.max_pool2d(x, 2, 2), torch.randn(2, 3, 32, 20))
    assert rows == 1


def test_a_backward_window_shares_its_candidates():
    # the average's backward: each input sums its 3x3 candidate outputs' gradients over their divisors; 8 input
    # rows share 10 rows of candidates, and each candidate's divisor
    g, x = torch.randn(2, 3, 16, 20), torch.randn(2, 3, 16, 20)
    body, _, rows = window_source(avg_pool_backward, g, x)
    assert rows == 8 and body.count("tl.load(") == 30 and body.count(" / ") == 30


def _check(fn, *inputs):
    torch._dynamo.reset()
    out = compiled(fn)(*inputs)
    ref = fn(*[x.double() if x.is_floating_point() else x for x in inputs])
    for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        if r.is_floating_point():
            torch.testing.assert_close(o.double(), r, equal_nan=True, atol=1e-5 if o.dtype == torch.float32 else 2e-2,
                                       rtol=1e-5 if o.dtype == torch.float32 else 2e-2)
        else:
            assert torch.equal(o, r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_strips_of_pooling_equal_eager(dtype, memory_format):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (2, 3, 16, 12), generator=g).to(dtype).to(memory_format=memory_format)
    x[0, 1, 3, 3] = x[1, 2, 7, 6] = x[1, 2, 8, 6] = float("nan")
    x[1, 0, 0:4, 0:4] = float("-inf")
    _check(max_pool, x)
    y = torch.randn(2, 3, 16, 12, generator=g).to(dtype).to(memory_format=memory_format)
    _check(avg_pool, y)
    _check(lambda x: F.avg_pool2d(x, 3, 1, 1), y)   # the padding in the divisor
    _check(lambda x: F.avg_pool2d(x, 5, 1, 2), y)
    _check(avg_pool_backward, torch.randn(2, 3, 16, 12, generator=g).to(dtype), y)
    values, indices = max_pool(y)
    _check(max_pool_backward, torch.randn(values.shape, generator=g).to(dtype), y, indices)
    # a window whose stride does not tile it (3 over stride 2): only the first candidate checks it holds the input
    _check(lambda g, x: aten.avg_pool2d_backward(g, x, [3, 3], [2, 2], [1, 1], False, True, None),
           torch.randn(values.shape, generator=g).to(dtype), y)


def test_a_stripped_kernel_with_a_partial_last_block_equals_eager():
    # 2 x 3 x 5 strips of 8 rows' 7 columns: 210 lanes, a block of 128 and one partial
    x = torch.randn(2, 3, 40, 7)
    body, _, rows = window_source(avg_pool, x)
    assert rows == 8 and "xmask" in body.split("xmask = ")[1]
    _check(avg_pool, x)
    _check(lambda x: F.avg_pool2d(x, 3, 1, 1).relu() * 2, x)   # an epilogue per row of the strip


@pytest.mark.parametrize("pool, constant", [
    (lambda x: F.avg_pool2d(x, 3, 1, 1), True),                                      # every window 3x3, padding counted
    (lambda g, x: aten.avg_pool2d_backward(g, x, [3, 3], [1, 1], [1, 1], False, True, None), True),
    (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), False),                     # the last window passes the padding
    (avg_pool, False),                                                                # the padding not counted
], ids=["forward", "backward", "ceil-mode", "padding-not-counted"])
def test_an_average_whose_windows_stay_inside_the_padding_divides_by_a_constant(pool, constant):
    """Counting the padding, a window that ends inside the padded input holds kh * kw positions: the divisor is a
    constant, not a dozen integer ops per output (forward 331 -> 251 SASS instructions a program for sm_90,
    backward 520 -> 303). Where ceil_mode lets a window pass the padding, or the padding is not counted, it is
    computed per output. Values against float64 eager either way."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 13, generator=g)
    inputs = (torch.randn(2, 3, 16, 13, generator=g), x) if pool.__code__.co_argcount == 2 else (x,)
    body, _, _ = window_source(pool, *inputs)
    assert ("tl.minimum" not in body and "tl.maximum" not in body) == constant, body
    _check(pool, *inputs)


def test_max_pooling_asks_nothing_its_values_already_answer():
    """Backward: a candidate's gradient, loaded masked to 0 outside the input, is selected where the window's max
    was here, and not selected again against the mask (332 -> 296 SASS instructions a program, sm_90). Forward:
    a position outside the input reads -inf, never NaN, so the last NaN's search asks nothing of the mask. Values
    of both are checked against eager in test_strips_of_pooling_equal_eager."""
    import re

    y = torch.randn(2, 3, 32, 20)
    values, indices = max_pool(y)
    body, _, _ = window_source(max_pool_backward, torch.randn(values.shape), y, indices.to("meta"))
    zeroed = set(re.findall(r"(tmp\d+) = tl\.where\(\w+, \w+, 0\.0\)", body))
    assert zeroed and not re.findall(r"tl\.where\(\w+, (%s), 0\.0\)" % "|".join(zeroed), body), body
    body, _, _ = window_source(max_pool, y)
    nans = set(re.findall(r"(tmp\d+) = (tmp\d+) != \2\b", body))
    names = {n for n, _ in nans}
    assert names and not any(re.search(r"& %s\b" % n, body) or re.search(r"= %s &" % n, body) for n in names), body
