"""Shared helpers for the compiler tests: compile with brrr, compare with eager."""

import torch

from brrr.compile.backend import brrr_backend


class Recording:
    """brrr's backend, remembering which runtime it returned for each graph Dynamo handed it."""

    def __init__(self):
        self.runtimes = []

    def __call__(self, gm, example_inputs):
        fn = brrr_backend(gm, example_inputs)
        self.runtimes.append(getattr(fn, "_brrr_lean", "aot"))
        return fn


def compiled(fn):
    return torch.compile(fn, backend=brrr_backend, dynamic=False)


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / (ref.norm() + 1e-12)).item()


def first(out):
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0]


def to64(model):
    import copy
    return copy.deepcopy(model).double()
