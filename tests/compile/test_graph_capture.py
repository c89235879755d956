"""The common ways a CUDA graph's capture failed, on the CPU (conftest.fake_cuda_graphs): a copy from host memory
inside the graph (runtime/host_copies.py, passes/device_constants.py, cuda_graphs.GraphedCall's staged inputs),
and tensors whose elements share memory (an expanded input or output)."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from brrr.compile.passes.device_constants import move_host_constants
from brrr.compile.runtime import replay_choice
from brrr.compile.runtime.compiled import layout
from brrr.compile.runtime.cuda_graphs import GraphedCall
from brrr.compile.runtime.host_copies import HostCopies, host_copies

CAPTURE_ERROR = "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned."


class HostMemory(TorchDispatchMode):
    """On a machine where every tensor is on the CPU, tells host memory from the graph's device memory: tensors
    `mark`ed as host, and whatever an op makes from them on the host, are host memory; a copy to the device
    (`_to_copy` given a device) or a tensor made by a factory is device memory. Copying between the two while
    FakeGraph captures fails as CUDA's capture does."""

    def __init__(self, fake_graph):
        super().__init__()
        self.fake_graph, self.kept, self.host = fake_graph, [], set()

    def mark(self, t):
        self.kept.append(t.untyped_storage())   # kept alive: its address never comes back as device memory
        self.host.add(t.untyped_storage().data_ptr())
        return t

    def on_host(self, t):
        return isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.host

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        to_device = name == "_to_copy" and "device" in kwargs
        if to_device:
            crosses = self.on_host(args[0])
        elif name in ("copy_", "copy"):
            crosses = self.on_host(args[0]) != self.on_host(args[1])
        else:
            crosses = False
        if crosses and self.fake_graph.capturing:
            raise RuntimeError(CAPTURE_ERROR)
        out = func(*args, **kwargs)
        reads_host = any(self.on_host(t) for t in tree_leaves((args, kwargs)))
        if reads_host and not to_device and name not in ("copy_", "copy"):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.mark(t)
        return out


DEVICE = torch.device("cpu")   # the graph's device, in this double


def scale_by_host_tensor(args):
    """A generated call's steps for `x * c.to(x.device)` with c on the host: ATen's copy, then the kernel."""
    x, c = args
    c_on_device = torch.ops.aten._to_copy.default(c, device=DEVICE)   # fallback: copy across devices
    return (x * c_on_device + 1,)


def test_a_host_input_copied_to_the_device_is_staged_before_each_replay(fake_cuda_graphs):
    with HostMemory(fake_cuda_graphs) as host:
        x0, c0 = torch.randn(3, 4), host.mark(torch.randn(4))
        g = GraphedCall(scale_by_host_tensor, [x0, c0], host=HostCopies(DEVICE, staged=(1,)))
        for step in range(4):
            x, c = torch.randn(3, 4), host.mark(torch.randn(4))
            out = g([x, c])
            assert out is not None and g.slots == ["copy", "stage"]
            assert not host.on_host(g.static[1])           # the graph reads device memory
            torch.testing.assert_close(out[0], x * c + 1)
        assert fake_cuda_graphs.replays == 4


@pytest.mark.filterwarnings("ignore:brrr")
def test_the_double_fails_a_capture_that_copies_host_memory(fake_cuda_graphs):
    """Without the staging, the capture copies host memory, as the unfixed runtime did: CUDA's error."""
    with HostMemory(fake_cuda_graphs) as host:
        x, c = torch.randn(3, 4), host.mark(torch.randn(4))
        g = GraphedCall(scale_by_host_tensor, [x, c])
        assert g([x, c]) is None
        assert g.failed and CAPTURE_ERROR[:60] in g.failure


@pytest.mark.filterwarnings("ignore:brrr")
def test_a_graph_that_cannot_be_captured_launches_with_its_reason(fake_cuda_graphs):
    why = "cannot capture: aten._ctc_loss copies its lengths to the device"
    calls = []

    def call(args):
        calls.append(1)
        return (args[0] * 2,)

    x = torch.randn(3)
    g = GraphedCall(call, [x], host=HostCopies(DEVICE, blocker=why))
    trial = replay_choice.ReplayTrial("forward")
    out, replayed = trial.run(call, g, [x])
    torch.testing.assert_close(out[0], x * 2)
    assert not replayed and trial.replay is False and g.failure == why
    assert calls == [1]   # never run inside a capture
    assert replay_choice.DECISIONS[-1].reason == why and why in str(replay_choice.DECISIONS[-1])


def held_expanded(args):
    """A call whose input was traced expanded (a mask broadcast before the graph): the call holds it to those
    strides, as generated calls do (compiled.layout)."""
    mask, w = args
    mask = layout(mask, (1, 0))
    return (mask * w,)


def test_an_expanded_input_keeps_its_strides_in_the_graphs_copy(fake_cuda_graphs):
    """A dense copy made layout() copy it into an expanded buffer inside the capture: 'more than one element of
    the written-to tensor refers to a single memory location'."""
    w = torch.randn(4, 3)
    g = GraphedCall(held_expanded, [torch.randn(4, 1).expand(4, 3), w], static=(1,))
    for step in range(3):
        mask = torch.randn(4, 1).expand(4, 3)
        out = g([mask, w])
        assert out is not None and g.static[0].stride() == (1, 0)
        torch.testing.assert_close(out[0], mask * w)
    assert g([torch.randn(4, 3), w]) is None   # laid out otherwise: that call launches, the graph stays
    assert g.usable and fake_cuda_graphs.replays == 3


def sum_broadcast(args):
    x, w = args
    y = x * w
    return y, y.sum(1, keepdim=True).expand(4, 3)


def test_an_expanded_output_is_copied_out_keeping_its_strides(fake_cuda_graphs):
    w = torch.randn(4, 3)
    g = GraphedCall(sum_broadcast, [torch.randn(4, 3), w], static=(1,))
    kept = []
    for step in range(3):
        x = torch.randn(4, 3)
        out = g([x, w])
        eager = sum_broadcast([x, w])
        assert out[1].stride() == eager[1].stride() == (1, 0)
        assert out[1].untyped_storage().nbytes() == 4 * 4   # the span it covers, not more
        torch.testing.assert_close(out[1], eager[1])
        kept.append((out[1], eager[1]))
    for got, want in kept:   # each replay's outputs are the caller's own: later replays left them alone
        torch.testing.assert_close(got, want)


def _fake_cuda_graph(fn, *shapes_and_devices):
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in shapes_and_devices]
    return make_fx(fn, tracing_mode="fake")(*args)


def test_host_inputs_only_copied_to_the_device_are_staged():
    gm = _fake_cuda_graph(lambda x, c: x * c.view(1, 4).to(x.device),
                          ((3, 4), torch.float32, "cuda"), ((4,), torch.float32, "cpu"))
    found = host_copies(gm)
    assert found.device.type == "cuda" and found.staged == (1,) and found.blocker is None


def test_a_host_input_read_on_the_host_blocks_the_capture():
    gm = _fake_cuda_graph(lambda x, s: x * s, ((3, 4), torch.float32, "cuda"), ((), torch.float32, "cpu"))
    found = host_copies(gm)
    assert found.staged == () and "host input s_1 is read by aten.mul" in found.blocker


def test_a_copy_back_to_the_host_blocks_the_capture():
    gm = _fake_cuda_graph(lambda x: (x * 2).cpu() + 1, ((3,), torch.float32, "cuda"))
    assert "brings mul back to the host" in host_copies(gm).blocker


def test_ctc_loss_blocks_the_capture():
    """CUDA's ctc_loss copies its lengths to the device itself (Dynamo keeps it in a graph only with
    capture_dynamic_output_shape_ops: its output's size depends on the targets, so no fake tensor can trace it)."""
    gm = _fake_cuda_graph(lambda lp, targets: (lp.log_softmax(-1), targets),
                          ((6, 2, 5), torch.float32, "cuda"), ((2, 3), torch.int64, "cuda"))
    nodes = {n.name: n for n in gm.graph.nodes}
    log_probs, targets = nodes["_log_softmax"], nodes["targets_1"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        loss = gm.graph.call_function(torch.ops.aten._ctc_loss.default, (log_probs, targets, [6, 5], [3, 2]))
    loss.meta["val"] = (log_probs.meta["val"].new_empty(2), log_probs.meta["val"].new_empty(2, 6, 7))
    assert "aten._ctc_loss copies its lengths to the device" in host_copies(gm).blocker


@pytest.mark.parametrize("dropout_p", [0.1, 0.0])
def test_efficient_attention_with_dropout_blocks_the_capture(dropout_p):
    """Memory-efficient attention returns its RNG seed and offset as host tensors when launched and as device
    tensors when captured; its backward, launched, reads them on the host. A replayed forward beside a launched
    backward made that a read of device memory on the host: wav2vec2's fp32 training crashed. Without dropout there
    is no RNG state, and the graph captures."""
    gm = _fake_cuda_graph(lambda q: q * 2, ((2, 4, 8, 16), torch.float32, "cuda"))
    doubled = next(n for n in gm.graph.nodes if n.op == "call_function")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        attention = gm.graph.call_function(torch.ops.aten._scaled_dot_product_efficient_attention.default,
                                           (doubled, doubled, doubled, None, True, dropout_p))
    q = doubled.meta["val"]
    attention.meta["val"] = (q.new_empty(q.shape), q.new_empty(2, 4, 8), q.new_empty((), dtype=torch.int64,
                             device="cpu"), q.new_empty((), dtype=torch.int64, device="cpu"))
    blocker = host_copies(gm).blocker
    if dropout_p:
        assert "aten._scaled_dot_product_efficient_attention with dropout keeps its RNG state" in blocker
    else:
        assert blocker is None


def test_a_graph_on_the_host_alone_has_nothing_to_stage():
    gm = make_fx(lambda x: (x * 2,))(torch.randn(3))
    assert host_copies(gm) == HostCopies(None)


def test_a_host_constant_copied_to_the_device_is_moved_once():
    """`meta` stands in for the device (the pass runs the copy, which needs the device)."""
    def f(x):
        return x + torch.tensor([1.0, 2.0]).to(x.device)
    gm = make_fx(f)(torch.empty(3, 2, device="meta"))
    unmoved = _fake_cuda_graph(f, ((3, 2), torch.float32, "cuda"))
    assert "copies host tensor" in host_copies(unmoved).blocker   # left in a graph, it would block the capture
    assert any(n.target is torch.ops.aten._to_copy.default for n in gm.graph.nodes)
    assert move_host_constants(gm) == 1
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.aten.add.Tensor]
    constant = getattr(gm, next(n.target for n in gm.graph.nodes if n.op == "get_attr"))
    assert constant.device.type == "meta" and constant.shape == (2,)
    assert gm(torch.empty(3, 2, device="meta")).shape == (3, 2)
    assert move_host_constants(gm) == 0


def test_move_host_constants_leaves_host_work_on_inputs_and_random_values():
    def f(x, c):
        return x + c.to(x.device) + torch.rand(2).to(x.device)
    gm = make_fx(f)(torch.empty(3, 2, device="meta"), torch.randn(2))
    assert move_host_constants(gm) == 0


def test_a_compiled_graph_with_expanded_inputs_and_outputs_replays_and_equals_eager(fake_cuda_graphs, monkeypatch):
    """Through brrr: a mask broadcast before the graph comes in expanded, and the graph returns an expanded sum."""
    from brrr.compile.backend import make_backend
    from brrr.compile.runtime import compiled as runtime

    real_build = runtime.build
    monkeypatch.setattr(runtime, "build", lambda plan, gm, **kw: real_build(plan, gm, **{**kw, "cuda_graphs": True}))

    def f(mask, w):
        y = mask * w + 1
        return y, y.sum(1, keepdim=True).expand(4, 3)

    compiled = torch.compile(f, backend=make_backend(cuda_graphs=True))
    w = torch.randn(4, 3)
    for step in range(4):
        mask = torch.randn(4, 1).expand(4, 3)
        got, want = compiled(mask, w), f(mask, w)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        assert got[1].stride() == want[1].stride()
    assert fake_cuda_graphs.replays == 3   # captured on the second call (which replays it), then two more


def test_host_constants_moved_inside_aotautogradss_fake_mode_are_real_tensors():
    """Planning runs with AOTAutograd's fake mode active: the moved constant must still hold its values. Also the
    functional form of `device_tensor.copy_(host_constant)`, `aten.copy`, moves once."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    def f(x):
        buf = torch.empty(2, device=x.device)
        buf.copy_(torch.tensor([3.0, 4.0]))
        return x + buf + torch.tensor([1.0, 2.0]).to(x.device)
    gm = make_fx(torch.func.functionalize(f))(torch.empty(3, 2, device="meta"))
    assert any(n.target is torch.ops.aten.copy.default for n in gm.graph.nodes)
    with FakeTensorMode():
        assert move_host_constants(gm) == 2
    constants = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    assert len(constants) == 2 and not any(isinstance(c, FakeTensor) for c in constants)
    assert not any(n.target in (torch.ops.aten.copy.default, torch.ops.aten._to_copy.default)
                   for n in gm.graph.nodes)
