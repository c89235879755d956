"""CUDA graphs of a graph planned at symbolic sizes (runtime/compiled.py's CompiledGraph with a shape key,
cuda_graphs.SharedPool) on the CPU, with conftest's stand-in graph: one graph per shape seen, captured into one
shared pool, up to recordings.MAX_GRAPH_SHAPES; every replay equals eager's result."""

import pytest
import torch

from brrr.compile import fallbacks
from brrr.compile.backend import make_backend
from brrr.compile.runtime import compiled as runtime, recordings, replay_choice
from brrr.compile.runtime.compiled import CompiledGraph


def scale_and_sum(args):
    x, w = args
    y = x * w
    return y + 1, y.sum(0)


def first_dim(args):
    return (args[0].shape[0],)


def graph(cuda_graphs=True, lend=()):
    g = CompiledGraph(scale_and_sum, None, "", cuda_graphs=cuda_graphs, kind="inference", shape_key=first_dim)
    g.lend = lend
    return g


def check(g, rows, w):
    x = torch.randn(rows, 4)
    out = g([x, w])
    torch.testing.assert_close(out[0], x * w + 1)
    torch.testing.assert_close(out[1], (x * w).sum(0))
    return out


def test_each_shape_captures_its_own_graph_into_one_pool(fake_cuda_graphs):
    g, w = graph(), torch.randn(4)
    for rows in (3, 3, 3, 5, 5, 5, 3, 5, 3):
        check(g, rows, w)
    assert {shape for shape, _ in g.recordings.by_key} == {(3,), (5,)}
    first, second = (g.recordings.by_key[k, None].graphed for k in ((3,), (5,)))
    assert first.graph is not second.graph
    # per shape: the first call launches, the second captures (and replays), the later ones replay
    assert fake_cuda_graphs.replays == 2 + 2 + 1 + 1 + 1
    assert first.graph.captured_into is None and second.graph.captured_into == first.graph.pool()


def test_past_the_bound_a_new_shape_launches_with_one_warning(fake_cuda_graphs, monkeypatch):
    monkeypatch.setattr(recordings, "MAX_GRAPH_SHAPES", 2)
    warned = []
    monkeypatch.setattr(recordings, "warn_once", warned.append)
    g, w = graph(), torch.randn(4)
    for rows in (2, 2, 3, 3, 4, 4, 4, 2):
        check(g, rows, w)
    assert {shape for shape, _ in g.recordings.by_key} == {(2,), (3,)}
    assert fake_cuda_graphs.replays == 1 + 1 + 1   # captures at 2 and 3, the last call at 2; 4 never
    assert len(warned) >= 1 and "2 shapes" in warned[0]


def test_a_replay_at_one_shape_settles_the_loans_of_another(fake_cuda_graphs):
    """Graphs sharing a pool may overwrite each other's memory: a pending loan of shape 3 gets its copies before
    shape 5 replays."""
    from brrr.compile.runtime.cuda_graphs import Loan

    g, w = graph(lend=(1,)), torch.randn(4)
    check(g, 3, w)
    out = check(g, 3, w)                # captured and replayed: output 1 is lent, the graph's own memory
    assert g.lent and out[1] is g.graphed.static_out[1]
    pending = torch.empty(0)
    loan = Loan([out[1]], pending)
    g.track(loan)
    want = out[1].clone()
    check(g, 5, w)
    check(g, 5, w)                      # shape 5 replays into the shared pool
    assert loan.copied
    torch.testing.assert_close(loan.tensors[0], want)


def test_auto_decides_per_shape_and_says_at_which_sizes(fake_cuda_graphs, monkeypatch):
    monkeypatch.setattr(replay_choice, "DECISIONS", [])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    g, w = graph(cuda_graphs="auto"), torch.randn(4)
    for rows in [3] * (replay_choice.TRIAL_CALLS + 1) + [5] * (replay_choice.TRIAL_CALLS + 1):
        check(g, rows, w)
    decided = [str(d) for d in replay_choice.DECISIONS]
    assert len(decided) == 2 and "at sizes 3" in decided[0] and "at sizes 5" in decided[1]


def test_a_compiled_model_replays_each_length_and_equals_eager(fake_cuda_graphs, monkeypatch):
    """End to end: Dynamo's symbolic graph, planned once, with its CUDA graphs per length (the CPU stands in for
    the GPU: the graph is built with CUDA graphs on)."""
    from tests.compile.test_dynamic_shapes import Attention

    real_build = runtime.build
    monkeypatch.setattr(runtime, "build", lambda plan, gm, **kw: real_build(plan, gm, **{**kw, "cuda_graphs": True}))
    torch.manual_seed(0)
    model = Attention().eval()
    compiled = torch.compile(model, backend=make_backend(symbolic_sizes=True, cuda_graphs=True))
    last = fallbacks.LOG[-1] if fallbacks.LOG else None
    with torch.no_grad():
        for length in (1, 7, 7, 7, 20, 20, 7, 20):
            x = torch.randn(2, length, 32)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-5, rtol=2e-5)
    assert (fallbacks.LOG[-1] if fallbacks.LOG else None) is last
    # lengths 7 and 20 share the symbolic graph, each with its own CUDA graph: 7 replays from its second call
    # on (3 calls), 20 from its second (2)
    assert fake_cuda_graphs.replays == 5


@pytest.mark.parametrize("placeholders_symbolic", [False, True])
def test_only_a_graph_with_size_symbols_gets_a_shape_key(placeholders_symbolic):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    n = env.create_symintnode(env.create_symbol(6, ConstantSource("n")), hint=6) if placeholders_symbolic else 6
    fx_graph = torch.fx.Graph()
    x = fx_graph.placeholder("x")
    x.meta["val"] = torch.empty(n, 4, device="meta")
    key = runtime.shape_key_function([x])
    if not placeholders_symbolic:
        assert key is None
    else:
        assert key([torch.empty(9, 4)]) == (9,)


@pytest.mark.parametrize("replays", [True, False])
def test_a_graph_its_trial_turns_down_is_let_go_at_once(fake_cuda_graphs, monkeypatch, replays):
    """A shape whose trial decides to launch drops its CUDA graph (and the outputs it holds) then, not at the next
    change of shape; a shape that replays keeps it."""
    import gc
    import weakref

    monkeypatch.setattr(replay_choice, "DECISIONS", [])
    monkeypatch.setattr(replay_choice, "MARGIN", 1e9 if replays else 0.0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    g, w = graph(cuda_graphs="auto"), torch.randn(4)
    check(g, 3, w)
    graphed = weakref.ref(g.recordings.by_key[(3,), None].graphed)
    for _ in range(replay_choice.TRIAL_CALLS):
        check(g, 3, w)
    (decision,) = replay_choice.DECISIONS
    assert decision.replay == replays
    gc.collect()
    assert (graphed() is not None) == replays and (g.recordings.by_key[(3,), None].graphed is not None) == replays
    assert g.recordings.by_key[(3,), None].trial is None   # decided: no trial left
    before = fake_cuda_graphs.replays
    for _ in range(2):
        check(g, 3, w)
    assert fake_cuda_graphs.replays - before == (2 if replays else 0)   # shape 3 replays only if it won
