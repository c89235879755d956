"""Matmul epilogues (matmul/fusion.py, matmul/epilogue.py): a matmul and the pointwise kernel reading its
product as one template kernel, against eager (float64 references for half types)."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F

import brrr


@pytest.fixture
def templates(monkeypatch):
    monkeypatch.setenv("BRRR_MATMUL_TEMPLATES", "1")


def _fused(ex):
    return [k for k in ex.kernels if any(op in ("mm", "addmm", "bmm") for op in k.ops)]


def _matmul_externs(ex):
    return [e for e in ex.externs if any(f"aten.{op}." in e.op for op in ("mm", "addmm", "bmm"))]


@pytest.mark.parametrize("shape", [(64, 32), (3, 17, 32)])
def test_linear_bias_gelu_is_one_kernel_and_equals_eager(templates, shape):
    torch.manual_seed(0)
    x, w, b = torch.randn(*shape), torch.randn(48, 32), torch.randn(48)

    def f(x, w, b):
        return F.gelu(F.linear(x, w, b))

    ex = brrr.explain(f, x, w, b)
    (kernel,) = ex.kernels
    assert {"addmm", "gelu"} <= set(kernel.ops) and not _matmul_externs(ex)
    assert "tl.dot" in kernel.source
    torch.testing.assert_close(brrr.compile(f)(x, w, b), f(x, w, b))


def test_templates_are_off_by_default():
    x, w = torch.randn(16, 8), torch.randn(8, 8)
    ex = brrr.explain(lambda x, w: torch.relu(x @ w), x, w)
    assert len(_matmul_externs(ex)) == 1 and not _fused(ex)


def test_a_trained_block_fuses_forward_and_backward_matmuls_and_matches_eager(templates):
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down, self.norm = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)

        def forward(self, x):
            return self.norm(x + self.down(F.gelu(self.up(x))))

    model = Block()
    ours = copy.deepcopy(model)
    x = torch.randn(4, 8, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ex = brrr.explain(copy.deepcopy(model), x.detach().clone().requires_grad_(), train=True)
    fused = {k.graph: k.ops for k in _fused(ex)}
    assert {"addmm", "gelu"} <= set(fused["forward"]) and "mm" in fused["backward"]
    # explain lists every matmul; the forward's first keeps its product (the backward reads it): 32 x 64 fp32
    # written once and never read back
    up = ex.matmuls[0]
    assert (up.graph, up.op, up.size, up.epilogue, up.bytes_saved) == ("forward", "addmm", "32 x 64 x 32",
                                                                       ["gelu"], 32 * 64 * 4)
    assert up.runs_as.startswith("template ") and "cuBLAS" in {m.runs_as for m in ex.matmuls}
    assert len(ex.matmuls) == 6 and "matmuls (" in str(ex)
    y = brrr.compile(ours)(x2)
    y.backward(torch.ones_like(y))
    want = model(x)
    want.backward(torch.ones_like(want))
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(x2.grad, x.grad)
    for (name, p), q in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_a_batched_matmul_with_a_residual_epilogue(templates):
    torch.manual_seed(0)
    a, b, c = torch.randn(3, 17, 24), torch.randn(3, 24, 40), torch.randn(3, 17, 40)

    def f(a, b, c):
        return torch.relu(torch.bmm(a, b)) * c

    ex = brrr.explain(f, a, b, c)
    assert [set(k.ops) >= {"bmm", "relu", "mul"} for k in ex.kernels] == [True]
    torch.testing.assert_close(brrr.compile(f)(a, b, c), f(a, b, c))


def test_transposed_and_sliced_operands(templates):
    torch.manual_seed(0)
    big = torch.randn(40, 70)

    def f(big, w):
        return torch.sigmoid(big[3:20, 5:69:2] @ w.t()) - 1   # a strided slice, a transposed weight

    w = torch.randn(30, 32)
    assert len(_fused(brrr.explain(f, big, w))) == 1
    torch.testing.assert_close(brrr.compile(f)(big, w), f(big, w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_types_are_no_less_accurate_than_eager(templates, dtype):
    torch.manual_seed(0)
    x, w, b = (torch.randn(33, 40) / 4).to(dtype), (torch.randn(50, 40) / 4).to(dtype), torch.randn(50).to(dtype)

    def f(x, w, b):
        return torch.tanh(F.linear(x, w, b)) + 1

    assert len(_fused(brrr.explain(f, x, w, b))) == 1
    ref = f(x.double(), w.double(), b.double())
    ours = brrr.compile(f)(x, w, b)
    assert ours.dtype == dtype
    eager_err = (f(x, w, b).double() - ref).abs().max().item()
    assert (ours.double() - ref).abs().max().item() <= 2 * eager_err + 1e-3


@pytest.mark.parametrize("read,why", [
    (lambda p: p.t(), "not pointwise over the product"),   # a layout-change kernel walks it in tiles
    (lambda p: torch.flip(p, [1]).t().t(), "element for element"),   # read at another element than written
])
def test_a_consumer_reading_the_product_elsewhere_is_refused_and_still_right(templates, read, why):
    torch.manual_seed(0)
    x, w = torch.randn(16, 8), torch.randn(8, 12)
    c = torch.randn(read(torch.empty(16, 12)).shape)

    def f(x, w, c):
        return read(x @ w) * c

    ex = brrr.explain(f, x, w, c)
    assert not _fused(ex) and len(_matmul_externs(ex)) == 1
    assert any("matmul epilogue" in text and why in text for _, _, text in ex.refusals), ex.refusals
    torch.testing.assert_close(brrr.compile(f)(x, w, c), f(x, w, c))


def test_a_product_also_returned_is_stored_by_the_fused_kernel(templates):
    torch.manual_seed(0)
    x, w = torch.randn(16, 8), torch.randn(8, 12)

    def f(x, w):
        p = x @ w
        return p, torch.exp(p)

    ex = brrr.explain(f, x, w)
    (kernel,) = _fused(ex)
    assert any(s.startswith("mm:") for s in kernel.writes)
    p, e = brrr.compile(f)(x, w)
    torch.testing.assert_close(p, x @ w)
    torch.testing.assert_close(e, torch.exp(x @ w))


class FakeTimer:
    """Runs each way once (so both must launch) and reports the times given, by way: cuBLAS or a template."""

    def __init__(self, cublas_us, template_us):
        self.cublas_us, self.template_us, self.calls = cublas_us, template_us, 0

    def __call__(self, run):
        self.calls += 1
        run()
        return self.cublas_us if self.calls == 1 else self.template_us + self.calls


@pytest.fixture
def timed(monkeypatch, tmp_path):
    from brrr.compile.matmul import choice as matmul_choice, fusion as matmul_fusion

    monkeypatch.setenv("BRRR_MATMUL_TEMPLATES", "auto")
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(matmul_fusion, "TIMED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(matmul_choice, "_MEMO", {})

    def use(timer):
        monkeypatch.setattr(matmul_choice, "_time_us", timer)
        return timer
    return use


def _relu_mm(x, w):
    return torch.relu(x @ w) * 2


@pytest.mark.parametrize("cublas_us,fuses", [(50.0, True), (1.0, False)])
def test_auto_keeps_the_way_that_timed_faster_and_caches_it_on_disk(timed, tmp_path, cublas_us, fuses):
    from brrr.compile.matmul import choice as matmul_choice

    x, w = torch.randn(40, 24), torch.randn(24, 36)
    timer = timed(FakeTimer(cublas_us, 10.0))
    ex = brrr.explain(_relu_mm, x, w)
    assert timer.calls == 1 + matmul_choice.MAX_TILES   # cuBLAS + kernel, then each candidate tile
    assert bool(_fused(ex)) == fuses
    if not fuses:
        assert any("timed faster" in why for _, _, why in ex.refusals)
    (path,) = (tmp_path / "matmul_choices").glob("*.json")
    entry = json.loads(path.read_text())
    assert sum(way.startswith("template") for way in entry["times_us"]) == matmul_choice.MAX_TILES
    assert entry["choice"].startswith("template") == fuses
    # another process: nothing in memory, the disk's answer, no timing
    matmul_choice._MEMO.clear()
    again = timed(FakeTimer(cublas_us, 10.0))
    ex = brrr.explain(_relu_mm, x, w)
    assert again.calls == 0 and bool(_fused(ex)) == fuses
    torch.testing.assert_close(brrr.compile(_relu_mm)(x, w), _relu_mm(x, w))


def test_auto_fuses_nothing_without_a_device_to_time_on(monkeypatch):
    monkeypatch.setenv("BRRR_MATMUL_TEMPLATES", "auto")
    ex = brrr.explain(_relu_mm, torch.randn(8, 8), torch.randn(8, 8))
    assert not _fused(ex) and any("no GPU to time it on" in why for _, _, why in ex.refusals)


def test_a_way_that_fails_to_run_is_never_chosen(tmp_path, monkeypatch):
    from brrr.compile.matmul import choice as matmul_choice

    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(matmul_choice, "_MEMO", {})

    def broken():
        raise RuntimeError("out of shared memory")

    times = iter([3.0])
    chosen = matmul_choice.choose("k", {"template a": broken, "cublas": lambda: None},
                                  timer=lambda run: (run(), next(times))[1])
    assert chosen == "cublas"
    assert matmul_choice.choose("k2", {"template a": broken}, timer=lambda run: run()) is None


def test_brrr_compile_takes_the_choice_as_an_option(monkeypatch):
    monkeypatch.delenv("BRRR_MATMUL_TEMPLATES", raising=False)
    from brrr.bench.backends import resolve_backend

    import contextlib

    from brrr.compile.runtime import kernel_registry

    launched = []
    monkeypatch.setattr(kernel_registry, "LAUNCH_HOOK", lambda name: launched.append(name) or contextlib.nullcontext())
    x, w = torch.randn(16, 8), torch.randn(8, 12)
    fused = brrr.compile(_relu_mm, matmul_templates="always")
    torch.testing.assert_close(fused(x, w), _relu_mm(x, w))
    assert [name.startswith("brrr_mm_") for name in launched] == [True]
    with pytest.raises(ValueError, match="matmul_templates"):
        brrr.compile(_relu_mm, matmul_templates="yes")
    assert resolve_backend("brrr-templates").keywords == {"matmul_templates": "auto"}


def test_a_dropout_and_residual_epilogue_keeps_what_it_keeps_scaled(templates):
    torch.manual_seed(0)
    x, w, r = torch.randn(64, 32), torch.randn(48, 32), torch.randn(64, 48)

    def f(x, w, r):
        return F.dropout(x @ w.t(), p=0.5, training=True) + r

    (kernel,) = brrr.explain(f, x, w, r).kernels
    assert {"mm", "rand_like", "add"} <= set(kernel.ops)
    out = brrr.compile(f)(x, w, r)
    kept = (out - r).abs() > 1e-6
    assert 0.4 < kept.float().mean().item() < 0.6   # 3072 draws of p = 0.5
    torch.testing.assert_close((out - r)[kept], (2 * (x @ w.t()))[kept])


@pytest.fixture
def tma_templates(templates, monkeypatch):
    """Fusion into the TMA persistent template under the interpreter, with a tile the small shapes fill."""
    from brrr.compile.matmul import fusion as matmul_fusion
    from brrr.compile.matmul.configs import TileConfig

    monkeypatch.setattr(matmul_fusion, "TMA_INTERPRETED", True)
    monkeypatch.setattr(matmul_fusion, "tma_config", lambda m, n, k, dtype, batch=1:
                        TileConfig(16, 16, 16, 2, 4, 2) if dtype.itemsize == 2 and batch == 1 else None)


def _float64_error(got, want64):
    return ((got.double() - want64).abs().max() / want64.abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_bias_gelu_runs_in_the_tma_template_and_matches_a_float64_reference(tma_templates, dtype):
    torch.manual_seed(0)
    x, w, b = torch.randn(40, 32), torch.randn(48, 32) / 6, torch.randn(48)

    def f(x, w, b):
        return F.gelu(F.linear(x, w, b))

    args = [t.to(dtype) for t in (x, w, b)]
    ex = brrr.explain(f, *args)
    (kernel,) = ex.kernels
    assert {"addmm", "gelu"} <= set(kernel.ops) and not _matmul_externs(ex)
    assert "in_ptr0.load(" in kernel.source and "flatten=True" in kernel.source   # descriptors, persistent
    (info,) = ex.matmuls
    assert info.runs_as == "TMA template 16x16x16" and info.epilogue
    got = brrr.compile(f)(*args)
    want64 = f(*[t.double() for t in args])
    assert _float64_error(got, want64) <= 2 * _float64_error(f(*args), want64) + 1e-3


def test_a_transposed_operand_is_read_through_a_tma_descriptor_of_its_transpose(tma_templates):
    """x.t() @ w with x [K, M] contiguous: A's unit stride is its first, so the descriptor covers x itself."""
    torch.manual_seed(0)
    x, w = torch.randn(32, 40).to(torch.bfloat16), (torch.randn(32, 48) / 6).to(torch.bfloat16)

    def f(x, w):
        return torch.relu(x.t() @ w)

    ex = brrr.explain(f, x, w)
    (kernel,) = ex.kernels
    assert ex.matmuls[0].runs_as.startswith("TMA template") and ".T" in kernel.source
    want64 = f(x.double(), w.double())
    assert _float64_error(brrr.compile(f)(x, w), want64) <= 2 * _float64_error(f(x, w), want64) + 1e-3


def test_a_trained_block_with_a_tma_epilogue_matches_eager(tma_templates):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 32)).to(torch.bfloat16)
    ours = copy.deepcopy(model)
    x = torch.randn(40, 32).to(torch.bfloat16)
    ex = brrr.explain(copy.deepcopy(model), x.clone().requires_grad_(), train=True)
    assert any(m.runs_as.startswith("TMA template") for m in ex.matmuls if m.graph == "forward")
    # the first product (48 bf16 = 96-byte rows) is saved for the backward: the kernel stores it through a
    # descriptor, and the GELU beside it through pointers
    stored = [k for k in ex.kernels if "out_ptr0.store([" in k.source]
    assert stored and all("tl.store(" in k.source for k in stored), [k.name for k in ex.kernels]
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = brrr.compile(ours)(x2)
    y.float().sum().backward()
    want = model(x1)
    want.float().sum().backward()
    torch.testing.assert_close(y, want, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(x2.grad, x1.grad, atol=3e-2, rtol=3e-2)
    for (name, p), q in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=5e-2, rtol=5e-2, msg=name)


def test_an_unaligned_input_is_read_from_an_aligned_copy(tma_templates):
    """A graph input that arrives 2 bytes off 16-byte alignment (a slice at an odd offset) still multiplies
    right: TMA reads only aligned memory, so the call copies it first."""
    torch.manual_seed(0)
    w, b = (torch.randn(48, 32) / 6).to(torch.bfloat16), torch.randn(48).to(torch.bfloat16)

    def f(x, w, b):
        return F.gelu(F.linear(x, w, b))

    compiled = brrr.compile(f)
    base = torch.randn(40 * 32 + 1).to(torch.bfloat16)
    aligned = base[:40 * 32].view(40, 32)
    compiled(aligned.clone(), w, b)
    odd = base[1:].view(40, 32)
    assert odd.data_ptr() % 16
    torch.testing.assert_close(compiled(odd, w, b), f(odd, w, b), atol=2e-2, rtol=2e-2)


def test_a_tma_descriptor_written_through_refuses_unaligned_memory():
    """A copy would lose what the kernel writes: a store descriptor of memory off 16-byte alignment is an error
    (brrr stores only into buffers it allocated, which are aligned)."""
    from brrr.compile.runtime.compiled import tma_descriptor

    base = torch.zeros(41 * 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="16-byte alignment"):
        tma_descriptor(base[1:1 + 40 * 32].view(40, 32), (16, 16), False, writes=True)
    assert tma_descriptor(base[:40 * 32].view(40, 32), (16, 8), False, writes=True).base.data_ptr() == base.data_ptr()


def test_a_tma_descriptor_of_unaligned_memory_reads_an_aligned_copy():
    from brrr.compile.runtime.compiled import tma_descriptor

    base = torch.arange(41 * 32, dtype=torch.float32).to(torch.bfloat16)
    odd = base[1:1 + 40 * 32].view(40, 32)
    desc = tma_descriptor(odd, (16, 16), False)
    assert odd.data_ptr() % 16 and desc.base.data_ptr() % 16 == 0 and torch.equal(desc.base, odd)
    t = tma_descriptor(odd.t(), (16, 16), True)
    assert t.base.data_ptr() % 16 == 0 and torch.equal(t.base, odd) and list(t.block_shape) == [16, 16]
    aligned = base[:40 * 32].view(40, 32)
    assert tma_descriptor(aligned, (16, 16), False).base.data_ptr() == aligned.data_ptr()
