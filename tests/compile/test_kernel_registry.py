"""Kernel names unique in the process, and what the registry keeps about each kernel (kernel_registry.py)."""

import gc
import re

import torch

import brrr
from brrr.compile.runtime import kernel_registry


def _launched_names(fn, *args, monkeypatch):
    """The names of the brrr kernels that `fn(*args)` launches (interpreted kernels open LAUNCH_HOOK(name))."""
    import contextlib

    launched = []

    def hook(name):
        launched.append(name)
        return contextlib.nullcontext()

    monkeypatch.setattr(kernel_registry, "LAUNCH_HOOK", hook)
    out = fn(*args)
    monkeypatch.setattr(kernel_registry, "LAUNCH_HOOK", None)
    return out, launched


def test_two_graphs_with_a_kernel_of_one_name_get_two_names_and_a_shared_source_shares_one(monkeypatch):
    # Other tests of the process may hold live kernels of these names: the test reads the names its own calls launch
    x = torch.randn(8, 4)
    plus_one, plus_two = brrr.compile(lambda t: t + 1), brrr.compile(lambda t: t + 2)
    again = brrr.compile(lambda t: t + 1)
    names = []
    for fn, expected in ((plus_one, x + 1), (plus_two, x + 2), (again, x + 1)):
        out, launched = _launched_names(fn, x, monkeypatch=monkeypatch)
        torch.testing.assert_close(out, expected)
        names += launched
    # x + 1 and x + 2 are both `brrr_add_0` in their graphs, launching functions named after their sources: two
    # names; the third is the first's source, and shares its name
    assert len(names) == 3 and all(re.fullmatch(r"brrr_add_[0-9a-f]{8}", name) for name in names)
    assert names[0] != names[1] and names[2] == names[0]
    for name in set(names):
        meta = kernel_registry.lookup(name)
        assert (meta.flops, meta.bytes_read, meta.bytes_written) == (32, 128, 128)
        assert meta.ops == ("aten.add.Tensor",) and meta.op_class == "elementwise" and meta.dtype == torch.float32


def test_an_entry_goes_with_the_last_graph_that_generated_it(monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx

    from brrr.compile.backend import compile_graph

    x = torch.randn(5)
    gm = make_fx(lambda t: (t * 3 - 1.25,))(x)   # an AOTAutograd graph returns a tuple
    compiled = compile_graph(gm, [x], cuda_graphs=False, graph_kind="inference")
    (out,), (name,) = _launched_names(compiled, [x], monkeypatch=monkeypatch)
    torch.testing.assert_close(out, x * 3 - 1.25)
    assert name.startswith("brrr_mul_sub_") and kernel_registry.lookup(name).graph == "inference"
    del compiled, gm   # the compiled graph holds its GraphModule, which owns the entry
    gc.collect()
    assert kernel_registry.lookup(name) is None


def test_explain_names_kernels_as_the_registry_and_the_triton_function_do():
    def fn(a, b):
        return torch.relu(a) * 2 + b

    a, b = torch.randn(64, 128), torch.randn(64, 128)
    ex = brrr.explain(fn, a, b)
    (kernel,) = ex.kernels
    meta = kernel_registry.lookup(kernel.kernel_name)
    assert f"def {kernel.kernel_name}(" in kernel.source
    # relu, mul, add: one FLOP per element each; a and b read once, the result written once
    assert (meta.flops, meta.bytes_read, meta.bytes_written) == (3 * 64 * 128, 2 * 64 * 128 * 4, 64 * 128 * 4)
    assert (kernel.flops, kernel.bytes) == (meta.flops, meta.bytes)
    assert kernel_registry.LAUNCH_HOOK is None   # set only while brrr.analyze traces a CPU step


def test_a_reduction_split_over_two_kernels_shares_its_flops_between_them():
    x = torch.randn(1 << 16)
    ex = brrr.explain(lambda t: t.sum(), x)
    assert len(ex.kernels) == 2   # one long row: partial sums, then the sum of the partials
    # brrr.cost counts a sum as one FLOP per element read: the two kernels' FLOPs add up to the op's
    assert sum(k.flops for k in ex.kernels) == x.numel() and all(k.flops > 0 for k in ex.kernels)
    assert max(k.flops for k in ex.kernels) > 0.9 * x.numel()   # the partial sums do nearly all of it
    assert all(kernel_registry.lookup(k.kernel_name).op_class == "normalization" for k in ex.kernels)
