"""Unaligned matmuls padded before lowering (brrr/compile/passes/pad_matmuls.py): the rewritten graph computes the
same values with the same strides, the cost model pads only where it pays, and end to end through brrr's
kernels a linear + cross-entropy over an odd vocabulary trains as eager does, with the pads fused."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import brrr
from brrr.compile.passes import pad_matmuls as mp
from tests.compile.helpers import compiled

aten = torch.ops.aten


@pytest.fixture
def pad_everywhere(monkeypatch):
    """The policy as on a GPU, on CPU tensors, with padding always paying (the sizes here are tiny)."""
    monkeypatch.setattr(mp, "PAD_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(mp, "PAD_LAUNCH_S", 0.0)
    monkeypatch.setattr(mp, "UNALIGNED_SLOWDOWN", {2: 100.0, 4: 100.0, 8: 100.0})
    monkeypatch.setattr(mp, "on_tensor_cores", lambda dtype: True)   # fp32 here stands for a tensor-core dtype


def _padded_graph(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    decisions = mp.pad_matmuls(gm)
    return gm, decisions


def _matmuls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in mp._MATMULS]


def _aligned(t):
    lead = mp._leading_dim(t)
    return lead is not None and lead[1]


CASES = {
    "mm odd N": (lambda a, b: a @ b, [(17, 64), (64, 1007)]),
    "mm odd K": (lambda a, b: a @ b, [(16, 130 + 1), (131, 8)]),
    "mm transposed A, odd M": (lambda a, b: a.t() @ b, [(24, 1001), (24, 32)]),
    "mm transposed B, odd N": (lambda a, b: a @ b.t(), [(24, 32), (1001, 32)]),
    "addmm, bias over N": (lambda c, a, b: torch.addmm(c, a, b), [(1007,), (17, 64), (64, 1007)]),
    "addmm, full bias": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), [(17, 1007), (17, 63),
                                                                                    (63, 1007)]),
    "bmm odd K and N": (lambda a, b: torch.bmm(a, b), [(3, 17, 33), (3, 33, 1001)]),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, alpha=0.5), [(3, 1, 1001), (3, 17, 33), (3, 33, 1001)]),
    "every dim 1 or odd": (lambda a, b: a @ b, [(1, 17), (17, 1)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_padded_graph_equals_the_original(pad_everywhere, name):
    fn, shapes = CASES[name]
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g) for s in shapes]
    gm, decisions = _padded_graph(fn, *args)
    ref = fn(*[a.double() for a in args])
    out = gm(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert out.stride() == ref.stride()   # readers see the traced layout
    for mm in _matmuls(gm):               # every matmul left in the graph reads and writes aligned matrices
        vals = [a.meta["val"] for a in mm.args if isinstance(a, torch.fx.Node)][-2:]
        assert all(_aligned(v) for v in vals), name
        assert mm.meta["val"].shape[-1] % 4 == 0 or mm.meta["val"].shape[-1] == 1
    assert mp.pad_matmuls(gm) == []       # idempotent: nothing left to pad


def test_a_tensor_read_both_ways_is_padded_once(pad_everywhere):
    # GPT-2's backward: the logits' gradient feeds grad_input (as it is) and grad_weight (transposed)
    gm, decisions = _padded_graph(lambda gl, w, h: (gl @ w, gl.t() @ h),
                                  torch.randn(24, 1001), torch.randn(1001, 32), torch.randn(24, 32))
    assert [d.padded for d in decisions] == [True, True]
    pads = [n for n in gm.graph.nodes if n.target == aten.constant_pad_nd.default]
    assert len([p for p in pads if p.args[0].name == "gl_1"]) == 1


def test_small_matmuls_are_not_padded_on_the_gpu_policy(monkeypatch):
    monkeypatch.setattr(mp, "PAD_DEVICES", ("cuda", "cpu"))
    gm, decisions = _padded_graph(lambda a, b: a @ b, torch.randn(17, 17), torch.randn(17, 17))
    assert len(decisions) == 1 and not decisions[0].padded and "predicted" in decisions[0].reason
    assert not any(n.target == aten.constant_pad_nd.default for n in gm.graph.nodes)


def test_large_unaligned_matmul_pays_under_the_default_cost_model(monkeypatch):
    # GPT-2's LM head, [8192, 768] @ [768, 50257] bf16: padding costs a copy of the weight and of the logits,
    # far less than an align1 kernel; only the fake shapes matter (nothing runs)
    monkeypatch.setattr(mp, "PAD_DEVICES", ("cuda", "cpu"))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        h, w = torch.empty(8192, 768, dtype=torch.bfloat16), torch.empty(50257, 768, dtype=torch.bfloat16)
        gm = make_fx(lambda h, w: h @ w.t(), tracing_mode="fake")(h, w)
    (d,) = mp.pad_matmuls(gm)
    assert d.padded and d.dims == {"N": (50257, 50264)}


def test_an_ieee_fp32_matmul_is_not_padded_and_a_tf32_one_is(monkeypatch):
    # fp32 DistilBERT's LM head, [4096, 768] @ [768, 30522]: cuBLAS's SIMT kernels don't mind the 8-byte output
    # leading dimension, tensor cores (TF32) do
    monkeypatch.setattr(mp, "PAD_DEVICES", ("cuda", "cpu"))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        h, w = torch.empty(4096, 768), torch.empty(30522, 768)
        gm = make_fx(lambda h, w: h @ w.t(), tracing_mode="fake")(h, w)
    precision = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        (ieee,) = mp.pad_matmuls(gm)
        assert not ieee.padded and "IEEE fp32" in ieee.reason
        for node in gm.graph.nodes:
            node.meta.pop(mp.DECISIONS, None)
        torch.set_float32_matmul_precision("high")
        (tf32,) = mp.pad_matmuls(gm)
        assert tf32.padded and tf32.dims == {"N": (30522, 30524)}
    finally:
        torch.set_float32_matmul_precision(precision)


def test_the_slowdown_follows_the_worst_leading_dimension():
    assert [mp.alignment_bytes(n, 2) for n in (50257, 30522, 50260, 50264)] == [2, 4, 8, 16]
    assert mp.alignment_bytes(1001, 4) == 4 and mp.alignment_bytes(0, 2) == 16


def test_cpu_graphs_are_left_alone():
    gm, decisions = _padded_graph(lambda a, b: a @ b, torch.randn(64, 64), torch.randn(64, 1001))
    assert decisions == [] and not any(n.target == aten.constant_pad_nd.default for n in gm.graph.nodes)


def _lm_head(tokens=24, dim=32, vocab=1001, dtype=torch.float32):
    torch.manual_seed(0)
    w = torch.randn(vocab, dim, dtype=dtype, requires_grad=True)
    h = torch.randn(tokens, dim, dtype=dtype, requires_grad=True)
    return h, w, torch.arange(tokens) * 37 % vocab


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def test_the_padded_gradient_is_written_by_the_kernel_that_computes_it(pad_everywhere):
    h, w, target = _lm_head()
    ex = brrr.explain(lambda h, w: torch.nn.functional.cross_entropy(h @ w.t(), target), h, w, train=True)
    padded = [p for _, p in ex.paddings if p.padded]
    assert sorted(sorted(p.dims) for p in padded) == [["K"], ["M"], ["N"]]   # forward N; backward K and M
    assert "unaligned matmuls" in str(ex)
    backward_writes = [w for k in ex.kernels if k.graph == "backward" for w in k.writes]
    assert any("[24, 1004]" in w for w in backward_writes)
    assert not any("[24, 1001]" in w for w in backward_writes), backward_writes   # no unpadded copy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_cross_entropy_over_an_odd_vocab_trains_as_eager(pad_everywhere, dtype):
    h, w, target = _lm_head(dtype=dtype)

    def f(h, w):
        logits = h @ w.t()
        return torch.nn.functional.cross_entropy(logits.float(), target), logits

    loss, logits = compiled(f)(h, w)
    (loss + logits.float().sum() * 1e-3).backward()
    got = (loss.detach(), logits.detach(), h.grad, w.grad)
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref_logits = h64 @ w64.t()
    ref_loss = torch.nn.functional.cross_entropy(ref_logits, target)
    (ref_loss + ref_logits.sum() * 1e-3).backward()
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for a, b in zip(got, (ref_loss, ref_logits, h64.grad, w64.grad)):
        assert _rel(a, b) < tol
    assert logits.stride() == (1001, 1)   # the user's logits keep eager's layout


def test_an_odd_vocab_is_padded_at_symbolic_token_counts(pad_everywhere, monkeypatch):
    """A graph planned at symbolic sizes pads its static unaligned dims (the vocabulary) as a static one does:
    the LM head's three matmuls, with the tokens symbolic; GPT-2 at changing lengths ran cuBLAS's align1
    kernels without it (benchmarks/NOTES.md). One plan per graph serves every length."""
    from brrr.compile.backend import make_backend

    decided = []
    real = mp.pad_matmuls
    monkeypatch.setattr(mp, "pad_matmuls", lambda gm: decided.extend(real(gm)) or decided)
    vocab, dim = 1001, 32
    torch.manual_seed(0)

    class Head(torch.nn.Module):   # a module's parameters keep static sizes; the tokens are marked dynamic
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(vocab, dim))

        def forward(self, h, target):
            logits = h @ self.weight.t()
            return torch.nn.functional.cross_entropy(logits, target), logits

    head = Head()
    w = head.weight
    step = torch.compile(head, backend=make_backend(symbolic_sizes=True))
    for tokens in (24, 40, 17):
        h = torch.randn(tokens, dim, requires_grad=True)
        target = torch.arange(tokens) * 37 % vocab
        torch._dynamo.mark_dynamic(h, 0)
        torch._dynamo.mark_dynamic(target, 0)
        w.grad = None
        loss, logits = step(h, target)
        (loss + logits.sum() * 1e-3).backward()
        h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        ref_logits = h64 @ w64.t()
        ref_loss = torch.nn.functional.cross_entropy(ref_logits, target)
        (ref_loss + ref_logits.sum() * 1e-3).backward()
        for a, b in zip((loss.detach(), logits.detach(), h.grad, w.grad), (ref_loss, ref_logits, h64.grad, w64.grad)):
            assert _rel(a, b) < 1e-5
    assert sorted(sorted(p.dims) for p in decided if p.padded) == [["K"], ["M"], ["N"]], [str(p) for p in decided]
    assert all("s" in p.shape for p in decided)   # decided once, at symbolic sizes
