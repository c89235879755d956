"""The graph cache (runtime/graph_cache.py) and the AOT cache (runtime/aot_cache.py): a second compile, in another
process, traces nothing in AOTAutograd, plans nothing and computes what eager does; whatever changes the plan or
AOTAutograd's product misses; damaged, raced and interrupted entries never serve a wrong graph."""

import json
import signal

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from brrr.compile.backend import brrr_backend
from brrr.compile.runtime import graph_cache
from tests.compile.graph_cache_worker import model_and_input, step
from tests.compile.workers import finish, start, wait_for

TIMEOUT_S = 240


def eager_step():
    model, x = model_and_input()
    return step(model, x)


def assert_eager(result):
    loss, grads = eager_step()
    torch.testing.assert_close(result["loss"], loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(result["grads"], grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    model, x = model_and_input()
    with torch.no_grad():
        torch.testing.assert_close(result["inference"], model(x), rtol=1e-5, atol=1e-6)


def run_worker(tmp_path, cache, mode="run", label="run"):
    proc = start("graph_cache_worker", [mode, tmp_path], tmp_path / f"{label}.log", BRRR_CACHE_DIR=str(cache))
    finish([proc], TIMEOUT_S)
    return torch.load(tmp_path / f"{proc.pid}.pt")


def entries(cache):
    return sorted((cache / "graphs").glob("*.json"))


def assert_whole(cache):
    found = entries(cache)
    assert found
    for path in found:
        assert graph_cache.read_entry(path) is not None, f"{path.name} is damaged"
    assert not list((cache / "graphs").glob(".tmp-*"))


def test_a_second_process_traces_and_plans_nothing_and_equals_eager(tmp_path):
    cache = tmp_path / "cache"
    cold = run_worker(tmp_path, cache, label="cold")
    # the forward, the backward and the inference graph; AOTAutograd for the training and the inference step
    assert cold["stats"]["planned"] == 3 and cold["stats"]["stored"] == 3
    assert cold["aot_traced"] == 2 and cold["aot"]["stored"] == 2
    assert len(entries(cache)) == 3 and len(list((cache / "aot").glob("*.pkl"))) == 2
    warm = run_worker(tmp_path, cache, label="warm")
    assert warm["stats"]["planned"] == 0 and warm["stats"]["hits"] == 3 and warm["stats"]["stored"] == 0
    assert warm["aot_traced"] == 0 and warm["aot"]["hits"] == 2
    assert_eager(cold)
    assert_eager(warm)


def test_a_damaged_aot_entry_is_traced_again(tmp_path, monkeypatch):
    from brrr.compile.runtime import aot_cache

    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BRRR_GRAPH_CACHE", "1")
    monkeypatch.setattr(aot_cache, "STATS", dict.fromkeys(aot_cache.STATS, 0))
    x, w, c = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True), torch.randn(8)

    def train(x, w, c):
        return _graph(x, w, c).sum()

    def check():
        torch._dynamo.reset()
        torch.compile(train, backend=brrr_backend, dynamic=False)(x, w, c).backward()
        got, w.grad = w.grad, None
        train(x, w, c).backward()
        torch.testing.assert_close(got, w.grad, rtol=1e-5, atol=1e-6)
        w.grad = None

    check()
    (path,) = (tmp_path / "aot").glob("*.pkl")
    for damage in (lambda b: b[: len(b) // 2], lambda b: b"", lambda b: b[:70] + bytes([b[70] ^ 1]) + b[71:]):
        path.write_bytes(damage(path.read_bytes()))
        check()
    assert aot_cache.STATS["hits"] == 0 and aot_cache.STATS["misses"] == 4 and aot_cache.STATS["stored"] == 4
    check()
    assert aot_cache.STATS["hits"] == 1


def test_what_aotautograd_depends_on_changes_the_aot_key():
    from brrr.compile.runtime import aot_cache

    x, w, c = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    gm = _gm(x, w, c)

    def key(*inputs):
        return aot_cache.key(gm, inputs, {})

    base = key(x, w, c)
    assert base is not None and key(x, w, c) == base
    changed = {"requires_grad": key(x, w.requires_grad_(), c)}
    w.requires_grad_(False)
    with torch.no_grad():
        changed["grad mode"] = key(x, w, c)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        changed["autocast"] = key(x, w, c)
    changed["a parameter"] = key(x, torch.nn.Parameter(w, requires_grad=False), c)
    assert all(k is not None and k != base for k in changed.values()), changed
    assert len(set(changed.values())) == len(changed)


def test_a_graph_needing_aotautograd_s_runtime_is_not_kept(tmp_path, monkeypatch):
    from brrr.compile.runtime import aot_cache

    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BRRR_GRAPH_CACHE", "1")
    torch._dynamo.reset()

    def view_of_input(x):   # an output aliasing an input: AOTAutograd's runtime regenerates the view
        return x.view(-1), x.sin()

    x = torch.randn(4, 8, requires_grad=True)
    out = torch.compile(view_of_input, backend=brrr_backend, dynamic=False)(x)
    torch.testing.assert_close(out[1], x.sin())
    assert not list((tmp_path / "aot").glob("*.pkl"))


def _graph(x, w, c):
    return (torch.nn.functional.gelu(x @ w) * c).sum(-1)


def _gm(*args):
    gm = make_fx(_graph)(*args)
    return gm


def test_what_changes_the_plan_changes_the_key(monkeypatch):
    x, w, c = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    gm = _gm(x, w, c)
    base = graph_cache.key(gm, "inference")
    assert base is not None and graph_cache.key(_gm(x, w, c), "inference") == base   # the same graph, the same key
    first_op = next(n for n in gm.graph.nodes if n.op == "call_function")
    changed = {
        "sizes": graph_cache.key(_gm(torch.randn(5, 8), w, c), "inference"),
        "dtype": graph_cache.key(_gm(x.double(), w.double(), c.double()), "inference"),
        "strides": graph_cache.key(_gm(torch.randn(8, 4).t(), w, c), "inference"),
        "kind": graph_cache.key(gm, "forward"),
        "options": graph_cache.key(gm, "inference", options={"matmul_templates": "always"}),
        "forced to ATen": graph_cache.key(gm, "inference", forced=[first_op]),
        "split": graph_cache.key(gm, "inference", split=[first_op]),
    }
    monkeypatch.setenv("BRRR_PAD_MATMULS", "0")
    changed["a brrr setting"] = graph_cache.key(gm, "inference")
    monkeypatch.delenv("BRRR_PAD_MATMULS")
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    changed["torch"] = graph_cache.key(gm, "inference")
    monkeypatch.undo()
    monkeypatch.setattr(graph_cache, "brrr_digest", lambda: "another brrr")
    changed["brrr"] = graph_cache.key(gm, "inference")
    monkeypatch.undo()
    precision = torch.get_float32_matmul_precision()
    try:   # fp32 matmuls as TF32: matmul padding and templates decide otherwise
        torch.set_float32_matmul_precision("high")
        changed["TF32"] = graph_cache.key(gm, "inference")
    finally:
        torch.set_float32_matmul_precision(precision)
    assert graph_cache.key(gm, "inference") == base
    for what, k in changed.items():
        assert k is not None and k != base, what
    assert len(set(changed.values())) == len(changed)


def test_a_constant_s_value_is_in_the_key():
    def with_constant(value):
        gm = _gm(torch.randn(4, 8), torch.randn(8, 8), torch.randn(8))
        gm.register_buffer("_tensor_constant0", torch.full((3,), value))
        node = gm.graph.get_attr("_tensor_constant0")
        node.meta["val"] = gm._tensor_constant0
        gm.recompile()
        return graph_cache.key(gm, "inference")

    assert with_constant(1.0) == with_constant(1.0) != with_constant(2.0)


def test_symbolic_sizes_are_not_kept():
    gm = make_fx(_graph, tracing_mode="symbolic")(torch.randn(4, 8), torch.randn(8, 8), torch.randn(8))
    assert graph_cache.key(gm, "inference") is None


def _compile_and_check(fn, *args):
    torch._dynamo.reset()
    got = torch.compile(fn, backend=brrr_backend, dynamic=False)(*args)
    torch.testing.assert_close(got, fn(*args), rtol=1e-5, atol=1e-6)


def _damaged(kind):
    def damage(path):
        text = path.read_text()
        if kind == "truncated":
            path.write_text(text[: len(text) // 2])
        elif kind == "emptied":
            path.write_text("")
        elif kind == "garbage":
            path.write_bytes(b"\xff\xfe not json")
        elif kind == "edited":   # valid JSON whose content no longer matches its digest
            outer = json.loads(text)
            outer["entry"] = outer["entry"].replace("def call", "def kall")
            path.write_text(json.dumps(outer))
        elif kind == "other format":
            outer = json.loads(text)
            entry = json.loads(outer["entry"])
            entry["format"] = graph_cache.FORMAT + 1
            body = json.dumps(entry, sort_keys=True)
            import hashlib
            path.write_text(json.dumps({"digest": hashlib.sha256(body.encode()).hexdigest(), "entry": body}))
    return damage


@pytest.mark.parametrize("kind", ["truncated", "emptied", "garbage", "edited", "other format"])
def test_a_damaged_entry_is_planned_and_written_again(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BRRR_GRAPH_CACHE", "1")
    monkeypatch.setattr(graph_cache, "STATS", dict.fromkeys(graph_cache.STATS, 0))
    x, w, c = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    _compile_and_check(_graph, x, w, c)
    (path,) = entries(tmp_path)
    _damaged(kind)(path)
    _compile_and_check(_graph, x, w, c)
    assert graph_cache.STATS["planned"] == 2 and graph_cache.STATS["hits"] == 0
    assert_whole(tmp_path)
    _compile_and_check(_graph, x, w, c)   # the entry written again serves the next compile
    assert graph_cache.STATS["planned"] == 2 and graph_cache.STATS["hits"] == 1


def test_a_kept_graph_whose_first_call_fails_is_forgotten(tmp_path, monkeypatch):
    from brrr.compile.runtime import launch

    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BRRR_GRAPH_CACHE", "1")
    x, w, c = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    _compile_and_check(_graph, x, w, c)
    assert len(entries(tmp_path)) == 1

    def failing(self, *args, **kwargs):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(launch.Launcher, "__call__", failing)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="launch failed"):   # BRRR_DEBUG=1: brrr's errors raise
        torch.compile(_graph, backend=brrr_backend, dynamic=False)(x, w, c)
    assert entries(tmp_path) == []


def test_two_processes_writing_one_key_leave_one_whole_entry(tmp_path):
    cache = tmp_path / "cache"
    procs = [start("graph_cache_worker", ["race", tmp_path], tmp_path / f"race{i}.log", BRRR_CACHE_DIR=str(cache))
             for i in range(2)]
    (tmp_path / "go").touch()
    finish(procs, TIMEOUT_S)
    for proc in procs:
        assert_eager(torch.load(tmp_path / f"{proc.pid}.pt"))
    assert len(entries(cache)) == 3
    assert_whole(cache)
    warm = run_worker(tmp_path, cache, label="after")
    assert warm["stats"]["planned"] == 0
    assert_eager(warm)


def test_an_interrupted_compile_leaves_nothing_trusted(tmp_path):
    cache = tmp_path / "cache"
    proc = start("graph_cache_worker", ["pause", tmp_path], tmp_path / "pause.log", BRRR_CACHE_DIR=str(cache))
    wait_for(tmp_path / "paused", proc, TIMEOUT_S)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=TIMEOUT_S)
    assert "done" not in (tmp_path / "pause.log").read_text()
    assert entries(cache) == [] and not list((cache / "graphs").glob(".tmp-*"))
    after = run_worker(tmp_path, cache, label="after")
    assert after["stats"]["planned"] == 3
    assert_eager(after)
    assert_whole(cache)


def test_an_aot_entry_leaves_out_the_stack_traces_and_the_live_graph_keeps_them(tmp_path, monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from brrr.compile.runtime import aot_cache
    from brrr.compile.runtime.lean_autograd import LeanSpec

    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    gm = make_fx(lambda x: (x.sin() * 2,))(torch.randn(4))
    for n in gm.graph.nodes:
        n.meta["stack_trace"] = "File \"model.py\", line 3, in forward"
    code = gm.code
    assert aot_cache.store("k", LeanSpec("inference", (), ()), {"inference": gm}, ())
    spec, graphs, statics = aot_cache.load("k", FakeTensorMode())
    kept = graphs["inference"]
    assert kept.code == code and spec.kind == "inference"
    assert all("stack_trace" not in n.meta for n in kept.graph.nodes)
    assert all(n.meta["stack_trace"].startswith("File") for n in gm.graph.nodes)   # the live graph keeps them
    torch.testing.assert_close(kept(torch.ones(4))[0], torch.ones(4).sin() * 2)


def test_an_aot_entry_gives_back_each_fake_value_s_layout_and_shared_storages(tmp_path, monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from brrr.compile.runtime import aot_cache
    from brrr.compile.runtime.lean_autograd import LeanSpec

    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))

    def f(x, w, i):
        t = x.t()                       # a view: shares x's storage
        y = (t * 2)[1:, ::2]            # an offset, strided view of a fresh tensor
        return y, w.to(torch.bfloat16) + 1, i + 1, t
    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 6), torch.randn(3, requires_grad=True),
                                        torch.arange(5))
    w = next(n for n in gm.graph.nodes if n.name.startswith("w"))
    w.meta["val"] = w.meta["val"].detach().requires_grad_(True)   # a parameter's value, as AOTAutograd's has it
    before = [n.meta["val"] for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert aot_cache.store("k", LeanSpec("inference", (), ()), {"inference": gm}, ())
    mode = FakeTensorMode()
    _, graphs, _ = aot_cache.load("k", mode)
    after = [n.meta["val"] for n in graphs["inference"].graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert len(after) == len(before) > 6
    for a, b in zip(after, before):
        assert isinstance(a, FakeTensor) and a.fake_mode is mode
        assert (a.shape, a.stride(), a.storage_offset(), a.dtype, a.device, a.requires_grad) == \
            (b.shape, b.stride(), b.storage_offset(), b.dtype, b.device, b.requires_grad)
    same = [[x.untyped_storage()._cdata == y.untyped_storage()._cdata for y in vals] for vals in (before, after)
            for x in vals]
    n = len(before)
    assert same[:n] == same[n:] and any(s for i, row in enumerate(same[:n]) for j, s in enumerate(row) if i != j)
    assert any(v.requires_grad for v in after) and any(v.dtype == torch.bfloat16 for v in after)
