"""What the scheduler fuses, read through explain (planning only; no kernels run)."""

import torch
import torch.nn.functional as F

import brrr
from brrr.compile.explain import explain
from brrr.examples import mlp


def test_cos_cos_is_one_kernel():
    ex = explain(lambda x: x.cos().cos(), torch.randn(1000))
    assert len(ex.kernels) == 1
    assert ex.kernels[0].ops == ["cos"]
    assert ex.bytes_fused < ex.bytes_unfused
    assert "@triton.jit" in ex.kernels[0].source


def test_softmax_last_dim_is_one_kernel():
    ex = explain(lambda x: torch.softmax(x, -1), torch.randn(16, 100))
    assert len(ex.kernels) == 1 and not ex.fallbacks
    assert {"amax", "exp", "sum"} <= set(ex.kernels[0].ops)


def test_layer_norm_forward_is_one_kernel():
    w, b = torch.randn(64), torch.randn(64)
    ex = explain(lambda x: F.layer_norm(x, (64,), w, b), torch.randn(8, 64))
    assert len(ex.kernels) == 1 and not ex.fallbacks


def test_rms_norm_forward_is_one_kernel():
    w = torch.randn(64)
    ex = explain(lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, torch.randn(8, 64))
    assert len(ex.kernels) == 1


def test_seed_mlp_two_matmuls_and_at_most_two_kernels():
    model, (x,) = mlp(batch=32, dim=64)
    ex = brrr.explain(model, x)
    assert len(ex.externs) == 2 and not ex.fallbacks
    assert len(ex.kernels) <= 2
    assert ex.bytes_fused < ex.bytes_unfused
    assert all(k.source.startswith("import triton") for k in ex.kernels)
    text = str(ex)
    assert "fused kernels" in text and "addmm" in text and "less" in text


def test_seed_mlp_training_plans_forward_and_backward():
    model, (x,) = mlp(batch=32, dim=64)
    ex = brrr.explain(model, x.requires_grad_(), train=True)
    assert "forward" in ex.graphs and "backward" in ex.graphs
    assert ex.bytes_fused < ex.bytes_unfused


def test_unlowered_op_is_a_fallback_with_reason():
    ex = explain(lambda x: torch.cumprod(x, 0).cos(), torch.randn(32))
    assert [f.op for f in ex.fallbacks] == ["aten.cumprod.default"]
    assert "no brrr lowering" in ex.fallbacks[0].reason
    assert "cumprod" in str(ex)


def test_refusals_are_recorded():
    def f(x):
        s = x.sum(0)            # reduction over dim 0
        return x.sum(1), s      # another reduction space: not the same kernel
    ex = explain(f, torch.randn(8, 16))
    assert len(ex.kernels) == 2
    assert ex.refusals and "iteration space" in ex.refusals[0][2]


def test_explain_works_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ex = explain(lambda x: x.exp() + 1, torch.randn(64))
    assert len(ex.kernels) == 1


def test_int64_indexing_once_offsets_pass_2_31():
    ex = explain(lambda x: (x * 2).sum(-1), torch.empty(3, 2**30 + 8, device="meta"))
    assert "program_id(0).to(tl.int64)" in ex.kernels[0].source
    small = explain(lambda x: (x * 2).sum(-1), torch.empty(3, 1000, device="meta"))
    assert "int64" not in small.kernels[0].source


def test_bert_and_gpt2_plans():
    from brrr.examples import bert, gpt2
    for build in (bert, gpt2):
        model, inputs = build()
        ex = brrr.explain(model, *inputs)
        assert ex.kernels and ex.externs
        assert any("scaled_dot_product" in e.op for e in ex.externs)   # attention stays one ATen call
        assert not ex.fallbacks
        assert ex.bytes_fused < ex.bytes_unfused


def test_cli_explain_prints_the_plan(capsys):
    from brrr.cli import main
    try:
        main(["explain", "--example", "mlp"])
    except SystemExit as e:
        assert not e.code
    out = capsys.readouterr().out
    assert "fused kernels" in out and "addmm" in out


def test_a_residual_stream_is_stored_not_rederived_in_every_layer():
    # x_{l+1} = x_l + LN(x_l) @ W_l: each layer norm sits after the last layer's matmul, so re-deriving x_l
    # from the first input would read one more tensor per layer; stored, every layer reads the same few
    ws = [torch.randn(64, 64) for _ in range(6)]

    def stack(x):
        for w in ws:
            x = x + F.layer_norm(x, (64,)) @ w
        return F.layer_norm(x, (64,))
    ex = explain(stack, torch.randn(32, 64))
    inputs = [k.source.split("@triton.jit")[1].split(")")[0].count("in_ptr") for k in ex.kernels]
    assert len(ex.kernels) == 7 and max(inputs) <= 2, inputs


def _rotate(x, angle):
    """A rotary embedding's shape: cos and sin of small [positions, dims] angles, broadcast over batch and heads."""
    return x * angle.cos() + x.flip(-1) * angle.sin()


def test_a_long_math_op_read_through_a_broadcast_is_computed_once(monkeypatch):
    from brrr.compile.scheduling import schedule
    monkeypatch.setattr(schedule, "BROADCAST_EVALS", 1 << 10)
    x, angle = torch.randn(4, 8, 16, 32), torch.randn(16, 32)
    ex = explain(_rotate, x, angle)
    small, big = sorted(ex.kernels, key=lambda k: len(k.space))
    assert set(small.ops) == {"cos", "sin"} and small.space == "[16, 32]"
    assert "cos" not in big.ops and "sin" not in big.ops   # it loads them
    assert any("would evaluate its cos" in r for r in map(str, ex.refusals))
    torch.testing.assert_close(brrr.compile(_rotate, cuda_graphs=False)(x, angle), _rotate(x, angle))


def test_short_ops_and_unbroadcast_long_ops_stay_inlined(monkeypatch):
    from brrr.compile.scheduling import schedule
    monkeypatch.setattr(schedule, "BROADCAST_EVALS", 1 << 10)
    x, a = torch.randn(4, 8, 16, 32), torch.randn(16, 32)
    assert len(explain(lambda x, a: x * (a * 2 + 1), x, a).kernels) == 1        # a multiply-add: recomputed
    assert len(explain(lambda x, y: x.exp() * y, x, torch.randn_like(x)).kernels) == 1   # exp once per element
    monkeypatch.setattr(schedule, "BROADCAST_EVALS", 1 << 22)
    assert len(explain(_rotate, x, a).kernels) == 1   # too few extra evaluations to pay for a kernel
