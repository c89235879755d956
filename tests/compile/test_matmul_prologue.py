"""Matmul prologues (fusion.foldable_producers, matmul/prologue.py): an operand's cheap producer
computed in the template's K loop. Each folded kernel is checked against the same template with the operand
loaded from its producer's output, bit for bit (the prologue must round as the producer's store did), and
against eager."""

import pytest
import torch
import torch.nn.functional as F

import brrr
from brrr.compile.matmul import fusion as matmul_fusion


@pytest.fixture
def templates(monkeypatch):
    monkeypatch.setenv("BRRR_MATMUL_TEMPLATES", "1")


def _unfolded(monkeypatch, f, *args):
    """f compiled with the template but every operand loaded (no prologue)."""
    with monkeypatch.context() as m:
        m.setattr(matmul_fusion, "foldable_producers", lambda *a, **k: {})
        torch._dynamo.reset()
        ex = brrr.explain(f, *args)
        torch._dynamo.reset()
        out = brrr.compile(f)(*args)
    torch._dynamo.reset()
    return ex, out


def _cast_weight(x, w, b):   # autocast's shape of a linear: fp32 weights cast to bf16 on every call
    return torch.relu(F.linear(x, w.to(torch.bfloat16), b))


def _scaled_input(x, w):
    return torch.sigmoid((x * 0.125) @ w) * 3


def _transposed_copy(x, w):
    return torch.tanh(x.t().contiguous() @ w)


CASES = {
    "cast weight, B": (_cast_weight, lambda: (torch.randn(33, 40).bfloat16(), torch.randn(50, 40),
                                              torch.randn(50).bfloat16()), "b", ["_to_copy", "permute"]),
    "scaled input, A, fp32": (_scaled_input, lambda: (torch.randn(17, 70), torch.randn(70, 24)), "a", ["mul"]),
    "scaled input, A, bf16": (_scaled_input, lambda: (torch.randn(17, 70).bfloat16(),
                                                      torch.randn(70, 24).bfloat16()), "a", ["mul"]),
    "transposed copy, A": (_transposed_copy, lambda: (torch.randn(64, 130), torch.randn(64, 16) / 8), "a",
                           ["clone", "t"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_cheap_producer_runs_in_the_k_loop_bit_for_bit(templates, monkeypatch, case):
    f, make, which, ops = CASES[case]
    torch.manual_seed(0)
    args = make()
    ex = brrr.explain(f, *args)
    (kernel,) = ex.kernels   # the producer's kernel is gone
    (info,) = ex.matmuls
    assert info.runs_as.startswith("template ") and set(info.prologue) >= set(ops) - {"t"}
    assert info.epilogue and not set(info.prologue) & {"relu", "sigmoid", "tanh"}
    assert f"{which} = " in kernel.source and f"{which}_ptrs" not in kernel.source
    out = brrr.compile(f)(*args)
    unfolded_ex, unfolded = _unfolded(monkeypatch, f, *args)
    assert len(unfolded_ex.kernels) == 2 and not unfolded_ex.matmuls[0].prologue
    assert torch.equal(out, unfolded)
    # the operand's write and read are saved on top of the product's
    operand = [t for t in args if t.dim() == 2][0 if which == "a" else 1]   # as many elements as its source
    assert info.bytes_saved - unfolded_ex.matmuls[0].bytes_saved == 2 * operand.numel() * out.dtype.itemsize
    torch.testing.assert_close(out, f(*args), rtol=2e-2 if out.dtype == torch.bfloat16 else 1e-5,
                               atol=2e-2 if out.dtype == torch.bfloat16 else 1e-5)


def test_a_prologue_is_as_accurate_as_eager_against_float64(templates):
    torch.manual_seed(0)
    x, w, b = torch.randn(48, 96).bfloat16(), torch.randn(40, 96) / 4, torch.randn(40).bfloat16()
    ex = brrr.explain(_cast_weight, x, w, b)
    assert ex.matmuls[0].prologue
    got = brrr.compile(_cast_weight)(x, w, b)
    want = torch.relu(F.linear(x.double(), w.bfloat16().double(), b.double()))
    err = lambda y: (y.double() - want).abs().max().item()  # noqa: E731
    assert err(got) <= 2 * err(_cast_weight(x, w, b)) + 1e-3


def _refusals(ex):
    return [why for _, _, why in ex.refusals if "matmul prologue" in why]


def _cast_also_summed(x, y, w):
    wb = w.to(torch.bfloat16)
    return torch.relu(x @ wb), wb.sum()


def _cast_read_by_two_matmuls(x, y, w):
    wb = w.to(torch.bfloat16)
    return torch.relu(x @ wb), torch.sigmoid(y @ wb)


@pytest.mark.parametrize("f,why", [(_cast_also_summed, "also stores"), (_cast_read_by_two_matmuls,
                                                                        "another step reads")])
def test_a_producer_whose_output_is_read_elsewhere_stays_a_kernel(templates, f, why):
    x, y, w = torch.randn(16, 24).bfloat16(), torch.randn(12, 24).bfloat16(), torch.randn(24, 8)
    ex = brrr.explain(f, x, y, w)
    assert not any(m.prologue for m in ex.matmuls)
    assert any(why in reason for reason in _refusals(ex)), _refusals(ex)
    for got, want in zip(brrr.compile(f)(x, y, w), f(x, y, w)):
        torch.testing.assert_close(got, want)


def test_a_costly_producer_is_not_repeated_per_tile(templates):
    def f(x, w):
        return torch.relu(torch.exp(x) @ w)

    x, w = torch.randn(16, 24), torch.randn(24, 8)
    ex = brrr.explain(f, x, w)
    assert not ex.matmuls[0].prologue and len(ex.kernels) == 2
    assert any("computes exp" in why for why in _refusals(ex))
    torch.testing.assert_close(brrr.compile(f)(x, w), f(x, w))


def test_a_returned_operand_is_not_folded(templates):
    def f(x, w):
        xs = x * 2
        return torch.relu(xs @ w), xs

    x, w = torch.randn(16, 24), torch.randn(24, 8)
    ex = brrr.explain(f, x, w)
    assert not ex.matmuls[0].prologue and any("leaves the graph" in why for why in _refusals(ex))
    got = brrr.compile(f)(x, w)
    for g, e in zip(got, f(x, w)):
        torch.testing.assert_close(g, e)


def test_a_prologue_takes_the_pointer_template_where_tma_would_run(templates, monkeypatch):
    from brrr.compile.matmul.configs import TileConfig

    monkeypatch.setattr(matmul_fusion, "TMA_INTERPRETED", True)
    monkeypatch.setattr(matmul_fusion, "tma_config", lambda m, n, k, dtype, batch=1:
                        TileConfig(16, 16, 16, 2, 4, 2) if dtype.itemsize == 2 and batch == 1 else None)
    torch.manual_seed(0)
    x, w, b = torch.randn(40, 32).bfloat16(), torch.randn(48, 32), torch.randn(48).bfloat16()
    ex = brrr.explain(_cast_weight, x, w, b)
    (info,) = ex.matmuls
    assert info.prologue and info.runs_as.startswith("template ")
    torch.testing.assert_close(brrr.compile(_cast_weight)(x, w, b), _cast_weight(x, w, b), rtol=2e-2, atol=2e-2)


def test_a_batched_product_keeps_its_operands_loaded(templates):
    def f(a, b):
        return torch.relu(torch.bmm(a * 2, b))

    a, b = torch.randn(3, 8, 16), torch.randn(3, 16, 8)
    ex = brrr.explain(f, a, b)
    assert not ex.matmuls[0].prologue
    torch.testing.assert_close(brrr.compile(f)(a, b), f(a, b))


def test_a_prologue_kernel_compiles_for_sm90_on_tensor_cores(templates, monkeypatch, tmp_path):
    """What the H100 would run: the cast weight's prologue, converted in registers, still feeds warpgroup MMAs."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from types import SimpleNamespace

    from brrr.compile.matmul.configs import default_config
    from tests.compile.test_matmul_template import _compiled_for_sm90

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)   # the source a GPU gets
    bf16 = torch.bfloat16
    x, w, b = torch.randn(512, 256).to(bf16), torch.randn(384, 256), torch.randn(384).to(bf16)
    ex = brrr.explain(_cast_weight, x, w, b)
    (kernel,) = ex.kernels
    assert ex.matmuls[0].prologue and "bf16_rne" not in kernel.source
    config = default_config(512, 384, 256, bf16)
    meta = config.meta(256)
    consts = {name: meta[name] for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K")}
    types = dict(in_ptr0="*bf16", in_ptr1="*fp32", in_ptr2="*bf16", out_ptr0="*bf16")
    src = SimpleNamespace(source=kernel.source, name=kernel.name.split(".")[-1])
    result = _compiled_for_sm90(src, tmp_path / f"{src.name}.py", types, consts, config)
    assert result["mma"] and all(op.startswith("wgmma") and "bf16.bf16" in op for op in result["mma"]), result


class WayTimer:
    """Runs each way once and times it by its place in the order `fusion._timed_here` builds: cuBLAS, the
    plain template's tiles, then the prologue template's; `fast` is the place of the way to win."""

    def __init__(self, fast):
        self.fast, self.calls = fast, 0

    def __call__(self, run):
        self.calls += 1
        run()
        return 1.0 if self.calls == self.fast else 100.0 + self.calls


@pytest.mark.parametrize("prologue_wins", [True, False])
def test_auto_times_the_prologue_against_loading_the_operand(monkeypatch, tmp_path, prologue_wins):
    from brrr.compile.matmul import choice as matmul_choice

    monkeypatch.setenv("BRRR_MATMUL_TEMPLATES", "auto")
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(matmul_fusion, "TIMED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(matmul_choice, "_MEMO", {})
    tiles = matmul_choice.MAX_TILES
    timer = WayTimer(fast=1 + tiles + 1 if prologue_wins else 2)   # the first prologue tile, or the first plain one
    monkeypatch.setattr(matmul_choice, "_time_us", timer)
    torch.manual_seed(0)
    x, w = torch.randn(40, 24), torch.randn(24, 36)
    ex = brrr.explain(_scaled_input, x, w)
    assert timer.calls >= 1 + 2 * tiles   # cuBLAS, the plain tiles and the prologue's, each with its producer
    (info,) = ex.matmuls
    assert info.runs_as.startswith("template ")
    assert bool(info.prologue) == prologue_wins and len(ex.kernels) == (1 if prologue_wins else 2)
    if not prologue_wins:
        assert any("timed faster" in why for why in _refusals(ex))
    torch.testing.assert_close(brrr.compile(_scaled_input)(x, w), _scaled_input(x, w))
