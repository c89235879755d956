"""The lean runtime: plain graphs run from brrr's own autograd.Function (or directly, for inference) and give
eager's values and gradients; graphs that need AOTAutograd's wrappers keep them and stay correct."""

import pytest
import torch

from brrr.compile.backend import brrr_backend
from brrr.examples import bert, mlp
from tests.compile.helpers import Recording


def _compile(fn):
    torch._dynamo.reset()
    rec = Recording()
    return torch.compile(fn, backend=rec, dynamic=False), rec


def _grads(out_fn, leaves):
    for t in leaves:
        t.grad = None
    out_fn()
    return [None if t.grad is None else t.grad.clone() for t in leaves]


def test_seed_mlp_training_and_inference_run_lean():
    model, (x,) = mlp(batch=8, dim=32)
    x.requires_grad_()
    fn, rec = _compile(model)
    leaves = [x, *model.parameters()]
    got = _grads(lambda: fn(x).square().sum().backward(), leaves)
    ref = _grads(lambda: model(x).square().sum().backward(), leaves)
    assert rec.runtimes == ["training"]
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        out = fn(x)
    assert rec.runtimes == ["training", "inference"]
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert not out.requires_grad


def test_bert_training_runs_lean_and_matches_eager():
    model, (ids,) = bert()
    fn, rec = _compile(model)
    params = [p for p in model.parameters() if p.requires_grad]
    got = _grads(lambda: fn(ids).last_hidden_state.sum().backward(), params)
    ref = _grads(lambda: model(ids).last_hidden_state.sum().backward(), params)
    assert "training" in rec.runtimes
    scale = max(r.abs().max().item() for r in ref if r is not None)
    for a, b, p in zip(got, ref, params):
        # the pooler's output gets a zero gradient under torch.compile, none in eager
        zero = torch.zeros_like(p)
        torch.testing.assert_close(zero if a is None else a, zero if b is None else b, rtol=1e-4,
                                   atol=1e-5 * scale)


def test_running_statistics_are_written_back_by_the_lean_runtime():
    """Batch norm in training updates its buffers: the graph returns their new values and the lean runtime
    writes them back (one multi-tensor copy), in training and under no_grad, as eager does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3), torch.nn.BatchNorm2d(4))
    ref = __import__("copy").deepcopy(model)
    fn, rec = _compile(model)
    for step in range(3):
        x = torch.randn(4, 3, 10, 10, requires_grad=True)
        got = _grads(lambda: fn(x).square().sum().backward(), [x, *model.parameters()])
        want = _grads(lambda: ref(x).square().sum().backward(), [x, *ref.parameters()])
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        x = torch.randn(4, 3, 10, 10)
        torch.testing.assert_close(fn(x), ref(x), rtol=1e-4, atol=1e-4)
    assert rec.runtimes == ["training", "inference"]
    for name, buf in model.named_buffers():
        torch.testing.assert_close(buf, dict(ref.named_buffers())[name], rtol=1e-5, atol=1e-6, msg=name)
    assert int(model[1].num_batches_tracked) == 4


def test_a_graph_updating_a_plain_tensor_input_runs_lean_and_updates_it():
    def f(x, counter):
        counter.add_(1)
        return x * counter
    fn, rec = _compile(f)
    counter, ref_counter = torch.zeros(3), torch.zeros(3)
    x = torch.randn(3, requires_grad=True)
    for _ in range(2):
        out = fn(x, counter)
        torch.testing.assert_close(out, f(x, ref_counter))
    torch.testing.assert_close(counter, torch.full((3,), 2.0))
    out.sum().backward()
    torch.testing.assert_close(x.grad, counter)
    assert rec.runtimes == ["training"]


def test_an_update_autograd_must_see_keeps_aot_runtime():
    def scales(x):
        x.mul_(2)   # the update of a non-leaf input that requires grad is part of its autograd history
        return x.sum()
    fn, rec = _compile(scales)
    a = torch.randn(3, requires_grad=True)
    b, b_ref = a * 1, (a * 1).detach().requires_grad_()
    fn(b).backward()
    assert rec.runtimes == ["aot"]
    torch.testing.assert_close(a.grad, torch.full((3,), 2.0))


def test_output_aliasing_an_input_keeps_aot_runtime():
    def f(x, w):
        return x.view(-1), (x * w).sin()

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    fn, rec = _compile(f)
    a, b = fn(x, w)
    assert rec.runtimes == ["aot"]
    (a.sum() + b.sum()).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    a, b = f(x, w)
    (a.sum() + b.sum()).backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)


def test_non_differentiable_and_unused_outputs():
    def f(x, w):
        y = (x * w).tanh()
        return y, y.argmax(dim=1), (x + w).exp()

    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, requires_grad=True)
    fn, rec = _compile(f)
    y, idx, unused = fn(x, w)
    assert rec.runtimes == ["training"]
    assert not idx.requires_grad and unused.requires_grad
    torch.testing.assert_close(idx, f(x, w)[1])
    got = _grads(lambda: fn(x, w)[0].sum().backward(), [x, w])   # no gradient flows into the third output
    ref = _grads(lambda: f(x, w)[0].sum().backward(), [x, w])
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("make_grad", [
    lambda shape: torch.randn(shape[::-1]).t(),                      # transposed
    lambda shape: torch.randn(shape[1]).expand(shape),                # broadcast row, stride 0
    lambda shape: torch.randn(shape[0], 2 * shape[1])[:, ::2],        # every other column
])
def test_strided_gradients_reach_the_backward_in_its_layout(make_grad):
    def f(x, w):
        return (x * w).sin() * 2, (x.sum(dim=1) * 3).cos()

    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, requires_grad=True)
    g2 = torch.randn(8)[::2]   # 1-D with stride 2
    g1 = make_grad((4, 6))
    fn, rec = _compile(f)
    got = _grads(lambda: torch.autograd.backward(fn(x, w), [g1, g2]), [x, w])
    ref = _grads(lambda: torch.autograd.backward(f(x, w), [g1, g2]), [x, w])
    assert rec.runtimes == ["training"]
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)


def test_outputs_that_are_views_of_intermediates_are_plain_tensors():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 5, 4, requires_grad=True)   # 3-D: the matmul's result is reshaped on the way out
    fn, rec = _compile(lambda t: lin(t).view(10, 3))
    out = fn(x)
    assert rec.runtimes == ["training"]
    assert not out._is_view()
    out.mul_(2)   # in place on the output is allowed, as in eager
    torch.testing.assert_close(out, lin(x).view(10, 3) * 2)


def test_retain_graph_accumulates_like_eager():
    def f(x):
        return (x * x).sum(dim=0)

    x = torch.randn(3, 4, requires_grad=True)
    fn, _ = _compile(f)
    out = fn(x)
    out.sum().backward(retain_graph=True)
    out.sum().backward()
    torch.testing.assert_close(x.grad, 4 * x.detach())


def test_double_backward_raises_instead_of_a_wrong_gradient():
    x = torch.randn(3, requires_grad=True)
    fn, rec = _compile(lambda t: (t * t).sin())
    out = fn(x)
    assert rec.runtimes == ["training"]
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), x, create_graph=True)


def test_autocast_regions_keep_their_dtypes():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)

    def f(t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = lin(t)
        return h.float().relu()

    fn, rec = _compile(f)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(x)
        ref = f(x)
    assert rec.runtimes == ["training"]
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)


def test_outputs_that_are_not_tensors_and_buffers_that_need_no_grad():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)
            self.register_buffer("scale", torch.full((6,), 0.5))

        def forward(self, x):
            y = self.lin(x) * self.scale
            return y, y.shape[0], None

    model = Scaled()
    x = torch.randn(3, 6)
    fn, rec = _compile(model)
    out, rows, nothing = fn(x)
    assert rows == 3 and nothing is None
    got = _grads(lambda: fn(x)[0].sum().backward(), list(model.parameters()))
    ref = _grads(lambda: model(x)[0].sum().backward(), list(model.parameters()))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)
    assert model.scale.grad is None


def test_non_leaf_inputs_get_their_gradient_through_the_graph():
    w = torch.randn(5, requires_grad=True)
    fn, rec = _compile(lambda t: (t * t).sum(-1))
    x = w.expand(4, 5) * 2            # not a leaf: the gradient flows on to w
    fn(x).sum().backward()
    torch.testing.assert_close(w.grad, (8 * w * 4).detach())


def test_the_same_model_without_grad_after_training():
    model, (x,) = mlp(batch=4, dim=16)
    fn, rec = _compile(model)
    fn(x).sum().backward()
    with torch.no_grad():
        out = fn(x)
    assert rec.runtimes == ["training", "inference"] and not out.requires_grad
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)


def test_a_call_on_fake_tensors_runs_no_kernel_and_gives_the_outputs_metadata(monkeypatch):
    # Dynamo's DDPOptimizer calls each bucket's compiled graph once on fake tensors, under its fake mode, to get
    # the next bucket's example inputs
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from brrr.compile.runtime.launch import Launcher

    compiled = []

    def backend(gm, example_inputs):
        fn = brrr_backend(gm, example_inputs)
        compiled.append((fn, list(example_inputs)))
        return fn

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).t() * 2, x.sum(1).argmax()

    x, w = torch.randn(4, 8), torch.randn(8, 6, requires_grad=True)
    fn = torch.compile(f, backend=backend, dynamic=False)
    fn(x, w)
    with torch.no_grad():
        fn(x, w)
    monkeypatch.setattr(Launcher, "__call__", lambda *a: pytest.fail("a kernel ran on fake tensors"))
    for (lean, inputs), grad in zip(compiled, (True, False)):
        assert lean._brrr_lean == ("training" if grad else "inference")
        with FakeTensorMode() as mode, torch.set_grad_enabled(grad):
            outs = lean(*[mode.from_tensor(t) for t in inputs])
        with torch.set_grad_enabled(grad):
            refs = f(x, w)
        for out, ref in zip(outs, refs):
            assert isinstance(out, FakeTensor)
            assert (out.shape, out.stride(), out.dtype, out.requires_grad) == \
                (ref.shape, ref.stride(), ref.dtype, ref.requires_grad)


def test_which_input_updates_the_lean_runtime_writes_back():
    from types import SimpleNamespace as NS

    from brrr.compile.runtime.lean_autograd import _mutation_reason

    def meta(*infos, mutated=(0,)):
        plain = dict(mutates_data=False, mutates_metadata=False, mutates_storage_metadata=False, requires_grad=False)
        full = [NS(**{**plain, **info}) for info in infos]
        return NS(input_info=full, mutated_inp_runtime_indices=list(mutated), mutated_inp_stream_indices=None)

    assert _mutation_reason(meta({"mutates_data": True})) is None            # batch norm's running statistics
    assert _mutation_reason(meta({}, mutated=())) is None                      # no update at all
    assert "sizes" in _mutation_reason(meta({"mutates_data": True, "mutates_metadata": True}))
    assert "storage" in _mutation_reason(meta({"mutates_data": True, "mutates_storage_metadata": True}))
    assert "requires grad" in _mutation_reason(meta({"mutates_data": True, "requires_grad": True}))
    assert "inside itself" in _mutation_reason(meta({"mutates_data": True}, mutated=()))


def test_explain_names_the_runtime_each_graph_takes():
    import brrr

    bn = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    ex = brrr.explain(bn, torch.randn(3, 4), train=True)
    assert ex.runtimes == [("training", None)] and "[training] brrr's lean runtime" in str(ex)

    def scales(x):
        x.mul_(2)
        return x.sum()
    ex = brrr.explain(scales, torch.randn(3, requires_grad=True) * 1, train=True)
    assert ex.runtimes == [("training", "the graph updates an input that requires grad")]
    assert "AOTAutograd's runtime wrappers" in str(ex)


def _backward_frees(monkeypatch, owns):
    """(steps the backward graph ran, steps run when each saved tensor was freed) for a three-matmul MLP; a step
    is a kernel launch or an ATen call."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    from brrr.compile.runtime import compiled as runtime, launch, lean_autograd

    events = []

    class Steps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            events.append("step")
            return func(*args, **(kwargs or {}))

    real_launch = launch.Launcher.__call__

    def counted(self, *args, **kwargs):
        events.append("step")
        return real_launch(self, *args, **kwargs)

    monkeypatch.setattr(launch.Launcher, "__call__", counted)
    real_call = runtime.CompiledGraph.__call__

    def marked(self, *args):
        out = real_call(self, *args)
        events.append(f"end of {self.kind}")
        return out

    monkeypatch.setattr(runtime.CompiledGraph, "__call__", marked)
    if not owns:
        real_training = lean_autograd._training_callable

        def keeping(spec, fw_gm, fw_call, bw_call):
            run = real_training(spec, fw_gm, fw_call, bw_call)
            bw_call.owns_inputs = False
            return run
        monkeypatch.setattr(lean_autograd, "_training_callable", keeping)

    def pack(t):
        weakref.finalize(t, events.append, "freed")
        return t

    torch.manual_seed(0)
    w1, w2, w3 = (torch.randn(32, 32, requires_grad=True) for _ in range(3))
    fn, _ = _compile(lambda x: (torch.tanh(torch.tanh(x @ w1) @ w2) @ w3).sum())
    x = torch.randn(16, 32)
    fn(x).backward()   # the first call checks what brrr made: it keeps its inputs
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(x)
    del events[:]
    with Steps():
        loss.backward()
    steps = events[:events.index("end of backward")].count("step")
    freed_at = [events[:i].count("step") for i, e in enumerate(events) if e == "freed"]
    return steps, freed_at


def test_a_launched_backward_frees_each_saved_tensor_at_its_last_use(monkeypatch):
    steps, freed_at = _backward_frees(monkeypatch, owns=True)
    assert len(freed_at) >= 2 and min(freed_at) < steps   # some saved tensor went before the backward's end


def test_a_backward_keeping_its_inputs_frees_them_only_after_it_returns(monkeypatch):
    steps, freed_at = _backward_frees(monkeypatch, owns=False)
    assert len(freed_at) >= 2 and min(freed_at) >= steps


def test_updated_inputs_are_written_back_one_copy_per_dtype(monkeypatch):
    """Mixed dtypes (float32 statistics, int64 counters) in one _foreach_copy_ copy tensor by tensor: grouped,
    each group is one multi-tensor copy, and every target gets its value."""
    from brrr.compile.runtime.write_back import write_back

    copies = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda t, v: (copies.append(len(t)), real(t, v)))
    targets = [torch.zeros(4), torch.zeros((), dtype=torch.long), torch.zeros(3), torch.zeros((), dtype=torch.long)]
    values = [torch.arange(4.0), torch.tensor(7), torch.full((3,), 2.0), torch.tensor(9)]
    write_back(targets, values)
    assert sorted(copies) == [2, 2]
    for t, v in zip(targets, values):
        torch.testing.assert_close(t, v)
