"""Test doubles for bench: backends that are wrong on purpose or that raise."""

import pytest
import torch

from brrr.examples import mlp


def add_offset_backend(gm, example_inputs):
    """Wrong on purpose: every floating output comes back 1e-2 too large."""
    def run(*args):
        outs = gm(*args)
        return type(outs)(o + 1e-2 if o.is_floating_point() else o for o in outs)

    return run


def raising_backend(gm, example_inputs):
    raise RuntimeError("this backend always fails")


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.01


def wrong_gradient_backend(gm, example_inputs):
    """Forward exact, gradients 1% too large: only a training comparison can catch it."""
    def run(*args):
        outs = gm(*args)
        return type(outs)(_ScaleGrad.apply(o) if o.is_floating_point() else o for o in outs)

    return run


@pytest.fixture
def tiny_mlp():
    torch.manual_seed(0)
    return mlp(batch=4, dim=16)
