"""In-place kernel outputs: written over a graph-owned input only when every element is read before the
same program overwrites it, nothing reads that input later, and the graph does not return it."""

import torch

from brrr.compile.runtime import compiled as runtime
from brrr.compile.scheduling.inplace import same_element_access
from brrr.examples import mlp
from tests.compile.helpers import compiled

PERSISTENT = """
@triton.jit
def k1(in_ptr0, in_ptr1, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    tmp1 = tl.load(in_ptr0 + (rindex + 64 * xindex), xmask & rmask, other=0)
    tmp2 = tl.load(in_ptr1 + (rindex), rmask, other=0)
    tmp3 = tl.sum(tmp1, 1)[:, None]
    tl.store(out_ptr0 + (rindex + 64 * xindex), tmp1 - tmp3 + tmp2, xmask & rmask)
"""


def test_same_element_access_on_kernel_sources():
    assert same_element_access(PERSISTENT, "in_ptr0", "out_ptr0")
    assert not same_element_access(PERSISTENT, "in_ptr1", "out_ptr0")         # read at another index
    transposed = PERSISTENT.replace("in_ptr0 + (rindex + 64 * xindex)", "in_ptr0 + (xindex + 64 * rindex)")
    assert not same_element_access(transposed, "in_ptr0", "out_ptr0")
    masked = PERSISTENT.replace("xmask & rmask, other=0)\n    tmp2", "xmask, other=0)\n    tmp2")
    assert not same_element_access(masked, "in_ptr0", "out_ptr0")             # another mask
    read_after = PERSISTENT + "    tmp9 = tl.load(in_ptr0 + (rindex + 64 * xindex), xmask & rmask, other=0)\n"
    assert not same_element_access(read_after, "in_ptr0", "out_ptr0")         # a load after the store
    twice = PERSISTENT + "    tl.store(out_ptr0 + (rindex + 64 * xindex), tmp2, xmask & rmask)\n"
    assert not same_element_access(twice, "in_ptr0", "out_ptr0")


def _generated_calls(fn, *args, monkeypatch):
    sources = []
    build = runtime.build

    def spy(plan, gm, **kw):
        out = build(plan, gm, **kw)
        sources.append(out[0].source)
        return out
    monkeypatch.setattr(runtime, "build", spy)
    return fn(*args), sources


def test_seed_mlp_writes_gelu_and_layer_norm_over_the_matmul_outputs(monkeypatch):
    model, (x,) = mlp(batch=16, dim=64)
    torch._dynamo.reset()
    with torch.no_grad():
        out, sources = _generated_calls(compiled(model), x, monkeypatch=monkeypatch)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert sum(src.count("# in place") for src in sources) == 2


def test_tensors_read_later_or_returned_keep_their_memory(monkeypatch):
    def f(a, b):
        h = a @ b                 # graph-owned, but read again after the first kernel...
        y = h.sin()
        return y, (h * 2).sum(1)

    def g(a, b):
        h = a @ b                 # ...or returned
        return h, h.cos()

    a, b = torch.randn(8, 16), torch.randn(16, 32)
    for fn in (f, g):
        torch._dynamo.reset()
        out, sources = _generated_calls(compiled(fn), a, b, monkeypatch=monkeypatch)
        for o, r in zip(out, fn(a, b)):
            torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5)
        if fn is g:
            assert not any("# in place" in src for src in sources)


def test_transposed_reader_does_not_overwrite(monkeypatch):
    def f(a, b):
        h = a @ b
        return (h.t() * 3 + 1).contiguous().t() + h   # reads h at two different indices

    a, b = torch.randn(16, 16), torch.randn(16, 16)
    torch._dynamo.reset()
    out, _ = _generated_calls(compiled(f), a, b, monkeypatch=monkeypatch)
    torch.testing.assert_close(out, f(a, b), rtol=1e-4, atol=1e-5)


def test_dead_tensors_lend_their_memory_to_later_outputs(monkeypatch):
    def f(a, b):
        y = (a @ b).sin()          # stored: the next matmul reads it, then it is dead
        z = (y @ b).cos() + 1      # may be written in place over the matmul's result
        w = (z @ b).exp()          # may take y's memory
        return (w @ b).sum(1)

    a, b = torch.randn(32, 32), torch.randn(32, 32) / 8
    torch._dynamo.reset()
    out, sources = _generated_calls(compiled(f), a, b, monkeypatch=monkeypatch)
    torch.testing.assert_close(out, f(a, b), rtol=1e-4, atol=1e-4)
    assert sum(src.count("# its memory: no longer read") + src.count("# in place") for src in sources) >= 2


def test_memory_read_by_an_aliasing_aten_call_is_never_handed_on():
    from brrr.compile.scheduling.inplace import _may_alias

    class FX:
        def __init__(self, target):
            self.target = target
    assert _may_alias(FX(torch.ops.aten.diagonal.default))        # returns a view of its input
    assert _may_alias(FX(lambda x: x))                              # unknown: assume it may
    assert not _may_alias(FX(torch.ops.aten.mm.default))
