import pytest
import torch

from brrr.bench.backends import backend_name, dynamo_limits, resolve_backend, strict_dynamo


def test_resolve_backend():
    assert resolve_backend("eager") is None
    assert resolve_backend("inductor") == "inductor"

    def my_backend(gm, example_inputs):
        return gm.forward

    assert resolve_backend(my_backend) is my_backend and backend_name(my_backend) == "my_backend"
    with pytest.raises(Exception):
        resolve_backend("no_such_backend_xyz")


def test_brrr_resolves_without_the_entry_point_installed():
    pytest.importorskip("brrr.compile.backend", reason="brrr's compiler is not built yet")
    resolved = resolve_backend("brrr")
    assert resolved == "brrr" or callable(resolved)


def test_brrr_cudagraphs_is_brrr_with_graphs_on():
    fn = resolve_backend("brrr-cudagraphs")
    assert backend_name(fn) == "brrr-cudagraphs" and fn.keywords == {"cuda_graphs": True}
    x = torch.randn(8)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(lambda t: t.cos() * 2, backend=fn)(x), x.cos() * 2)


def test_dynamo_limits_raise_whichever_limits_exist():
    import torch._dynamo.config as config

    overrides = dynamo_limits(1000)
    assert overrides and all(v >= 1000 for v in overrides.values())
    assert all(hasattr(config, k) for k in overrides)
    with strict_dynamo(recompile_limit=1000):
        for name in overrides:
            assert getattr(config, name) >= 1000
    assert any(getattr(config, name) < 1000 for name in overrides)  # restored afterwards


def test_inductor_reduce_overhead_is_inductor_in_its_cuda_graph_mode(monkeypatch):
    from brrr.bench import backends

    seen = {}
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.update(kw) or fn)
    backends.fresh_compile(torch.nn.Linear(2, 2), "inductor-reduce-overhead")
    assert seen["backend"] == "inductor" and seen["mode"] == "reduce-overhead"
    seen.clear()
    backends.fresh_compile(torch.nn.Linear(2, 2), "inductor")
    assert seen["backend"] == "inductor" and "mode" not in seen
