"""Shared helpers for the compiler tests: compile with brrr, compare with eager."""

import importlib.util
from pathlib import Path

import torch

from brrr.compile.backend import brrr_backend

ROOT = Path(__file__).resolve().parents[2]


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


def load_acceptance(name):
    """benchmarks/acceptance/<name>.py as a module (the scripts are not a package)."""
    path = ROOT / "benchmarks" / "acceptance" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"acceptance_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
