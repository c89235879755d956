"""Generated kernels never touch memory outside their tensors (conftest's bounds guard checks every launch)."""

import pytest
import torch
import triton
import triton.language as tl

from brrr.compile.backend import brrr_backend


@triton.jit
def _shifted_copy(x_ptr, y_ptr, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets - SHIFT, mask), mask)


def test_guard_catches_an_out_of_bounds_load():
    x, y = torch.randn(64), torch.empty(64)
    _shifted_copy[(1,)](x, y, 64, SHIFT=0, BLOCK=64)
    assert torch.equal(x, y)
    with pytest.raises(Exception, match="outside its tensors"):  # the interpreter wraps it
        _shifted_copy[(1,)](x, y, 64, SHIFT=64, BLOCK=64)


def qkv_grad_cat(q, k, v):
    """GPT-2's qkv backward: three head-split [B, H, S, D] grads back into one [B, S, 3*H*D] tensor."""
    b, h, s, d = q.shape
    merge = lambda t: t.permute(0, 2, 1, 3).reshape(b, s, h * d)  # noqa: E731
    return torch.cat([merge(q), merge(k + 1), merge(v * 2)], dim=-1)


def test_cat_parts_are_loaded_only_inside_their_range():
    # The middle part of a cat was once loaded wherever idx < its end, so row 0 read before its tensor.
    q, k, v = (torch.randn(2, 3, 4, 8) for _ in range(3))
    out = torch.compile(qkv_grad_cat, backend=brrr_backend)(q, k, v)
    torch.testing.assert_close(out, qkv_grad_cat(q, k, v))
