"""A training loop through brrr's lean runtime with CUDA graphs (conftest's stand-in graph on the CPU): the
backward's replays give the gradients out as the graph's memory (cuda_graphs.Given), and every way a loop keeps
gradients (zeroed each step, accumulated, a view kept) still equals eager."""

import copy

import pytest
import torch

from brrr.compile.backend import make_backend
from brrr.compile.runtime import compiled as runtime
from brrr.compile.runtime.cuda_graphs import GraphedCall


def _graphs_recorded(monkeypatch):
    """Every graph built with CUDA graphs on; returns the list the GraphedCalls made are appended to."""
    made = []
    init = GraphedCall.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(GraphedCall, "__init__", record)
    real_build = runtime.build
    monkeypatch.setattr(runtime, "build", lambda plan, gm, **kw: real_build(plan, gm, **{**kw, "cuda_graphs": True}))
    return made


@pytest.fixture
def graphed_training(fake_cuda_graphs, monkeypatch):
    """(compiled model, eager copy, the GraphedCalls made, FakeGraph)."""
    made = _graphs_recorded(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    eager = copy.deepcopy(model)
    return torch.compile(model, backend=make_backend(cuda_graphs=True)), model, eager, made, fake_cuda_graphs


def _step(compiled, eager, x):
    compiled(x).square().sum().backward()
    eager(x).square().sum().backward()


def _zero(*models):
    for m in models:
        for p in m.parameters():
            p.grad = None


def _assert_grads_equal(model, eager):
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def _backward_graph(made):
    return next(g for g in made if g.give or g.given)


def test_gradients_zeroed_each_step_are_the_graphs_memory(graphed_training):
    compiled, model, eager, made, fake = graphed_training
    for step in range(5):
        _zero(model, eager)
        _step(compiled, eager, torch.randn(5, 8))
        _assert_grads_equal(model, eager)
    assert fake.replays == 2 * 4          # forward and backward replay from the second step on
    backward = _backward_graph(made)
    graph_memory = {t.untyped_storage().data_ptr() for t in backward.static_out if isinstance(t, torch.Tensor)}
    assert all(p.grad.untyped_storage().data_ptr() in graph_memory for p in model.parameters())
    assert backward.give


def test_gradients_accumulated_over_steps_equal_eager_and_keep_replaying(graphed_training):
    compiled, model, eager, made, fake = graphed_training
    _step(compiled, eager, torch.randn(5, 8))
    for step in range(4):                 # no zeroing: each .grad holds the last replay's memory
        _step(compiled, eager, torch.randn(5, 8))
        _assert_grads_equal(model, eager)
    assert fake.replays == 2 * 4 and _backward_graph(made).give


def test_a_kept_view_of_a_gradient_is_not_overwritten(graphed_training):
    compiled, model, eager, made, fake = graphed_training
    for step in range(2):
        _zero(model, eager)
        _step(compiled, eager, torch.randn(5, 8))
    kept = model[0].weight.grad.view(-1)   # a view the runtime cannot turn into a copy
    expected = kept.clone()
    for step in range(3):
        _zero(model, eager)
        _step(compiled, eager, torch.randn(5, 8))
        _assert_grads_equal(model, eager)
        torch.testing.assert_close(kept, expected)
    assert not _backward_graph(made).give   # copies from the step that found the view held


def test_two_backwards_through_one_forward_equal_eager(graphed_training):
    """retain_graph: the second backward finds the first one's gradients in .grad, held: it launches, and adds."""
    compiled, model, eager, made, fake = graphed_training
    for step in range(4):
        _zero(model, eager)
        x = torch.randn(5, 8)
        loss, eager_loss = compiled(x).square().sum(), eager(x).square().sum()
        loss.backward(retain_graph=True)
        eager_loss.backward(retain_graph=True)
        loss.backward()
        eager_loss.backward()
        _assert_grads_equal(model, eager)


def test_gradients_kept_from_autograd_grad_are_not_overwritten(graphed_training):
    """A functional loop keeps each step's gradients (torch.autograd.grad) while the next step runs."""
    compiled, model, eager, made, fake = graphed_training
    params = list(model.parameters())
    kept = []
    for step in range(4):
        x = torch.randn(5, 8)
        grads = torch.autograd.grad(compiled(x).square().sum(), params)
        expected = torch.autograd.grad(eager(x).square().sum(), list(eager.parameters()))
        kept.append((grads, [g.clone() for g in expected]))
    for grads, expected in kept:
        for g, e in zip(grads, expected):
            torch.testing.assert_close(g, e)


def test_running_statistics_are_updated_inside_the_replayed_forward(fake_cuda_graphs, monkeypatch):
    """The buffers a training forward updates (batch norm's running statistics and counters) are copied into by
    the forward's CUDA graph, recorded at its capture: a replay writes nothing back on the host and clones none
    of their new values, and the buffers equal eager's at every step."""
    made = _graphs_recorded(monkeypatch)
    outside = []
    real_write_back = runtime.write_back
    monkeypatch.setattr(runtime, "write_back", lambda t, v: (outside.append(len(t)), real_write_back(t, v)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4), torch.nn.BatchNorm1d(4))
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend=make_backend(cuda_graphs=True))
    for step in range(5):
        _zero(model, eager)
        if step == 2:
            outside.clear()   # the first call launches and writes back; the second captures and replays
        _step(compiled, eager, torch.randn(6, 8))
        for p, q in zip(model.parameters(), eager.parameters()):   # batch statistics of 6 rows: float32 sums
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
        for (name, buf), ref in zip(model.named_buffers(), eager.buffers()):
            torch.testing.assert_close(buf, ref, rtol=1e-5, atol=1e-6, msg=name)
    assert int(model[1].num_batches_tracked) == 5
    assert fake_cuda_graphs.replays == 2 * 4
    forward = next(g for g in made if g.lend)
    assert len(forward.written) == 6   # two batch norms' mean, variance and counter
    assert not set(forward.written) & set(forward.cloned)
    assert outside == []


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x)) + x


class _LayerDropStack(torch.nn.Module):
    """Hugging Face's LayerDrop check before each layer: a data-dependent branch, so Dynamo breaks the graph at
    every layer and compiles one layer graph that every layer calls with its own parameters."""

    def __init__(self, layers=3):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Block() for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            if torch.rand([]) < 2.0:
                x = layer(x)
        return x


def test_one_graph_called_by_every_layer_replays_a_cuda_graph_per_layer(fake_cuda_graphs, monkeypatch):
    """Each layer's parameters live at their own addresses: each layer gets a recording of its own, forward and
    backward, and every step after the first replays all six; gradients equal eager's every step."""
    made = _graphs_recorded(monkeypatch)
    model = _LayerDropStack()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend=make_backend(cuda_graphs=True))
    steps = 4
    for step in range(steps):
        _zero(model, eager)
        x = torch.randn(4, 8)
        _step(compiled, eager, x)
        _assert_grads_equal(model, eager)
    assert len(made) == 6   # three places, forward and backward
    assert not [g.failure for g in made if g.failure]
    # the first step launches each place (the verifying call, then each new place's first call); from the
    # second on, each step captures or replays all six
    assert fake_cuda_graphs.replays == 6 * (steps - 1)
    forwards = [g for g in made if not g.pin]
    backwards = [g for g in made if g.pin]
    # each backward captured into the pool of the forward whose saved tensors it reads
    assert {b.after().serial for b in backwards} == {f.serial for f in forwards}
    assert all(b.graph.captured_into == b.after().graph.pool() for b in backwards)
