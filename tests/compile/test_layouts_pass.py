"""The layout pass (passes/layouts.py) on the CPU, with a test-double timer: a convolution graph passed NCHW runs
channels_last when the timer says its convolutions are faster so, and not otherwise; results, gradients and
output strides equal eager's in both layouts, forward and backward, at fixed and changing shapes."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from brrr.compile import backend
from brrr.compile.backend import brrr_backend
from brrr.compile.explain import explain
from brrr.compile.passes import conv_timing, layouts

aten = torch.ops.aten


class Timer:
    """Convolutions take `as_is_s` as the graph passes them and `channels_last_s` converted; copies cost bytes at
    `bandwidth`. `calls` counts the convolutions timed."""

    def __init__(self, as_is_s=2e-3, channels_last_s=1e-3, bandwidth=1e12):
        self.times = {"as_is": as_is_s, "channels_last": channels_last_s}
        self.bandwidth, self.calls = bandwidth, 0

    def conv(self, call, layout):
        self.calls += 1
        return self.times[layout]

    def copy(self, nbytes):
        return 2 * nbytes / self.bandwidth


@pytest.fixture
def timer(monkeypatch):
    monkeypatch.setattr(layouts, "DECISIONS", [])

    def install(t):
        monkeypatch.setattr(layouts, "TIMER", t)
        return t
    return install


class ConvBlock(nn.Module):
    """conv -> batch norm -> ReLU -> max pool, then a residual conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = F.max_pool2d(F.relu(self.norm(self.conv(x))), 2)
        return y + self.conv2(y)


class Separable(nn.Module):
    """depthwise 3x3 -> pointwise 1x1 -> GELU, twice."""

    def __init__(self, c=8):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList([nn.Conv2d(c, c, 3, padding=1, groups=c), nn.Conv2d(c, c, 1)])
                                    for _ in range(2))

    def forward(self, x):
        for depthwise, pointwise in self.layers:
            x = F.gelu(pointwise(depthwise(x)))
        return x


class ConvInputs:
    """Records, for each convolution of each graph brrr compiles, whether its first tensor is channels_last (and
    not also contiguous): what the graph's ATen call is handed, since Externs keep their arguments' strides."""

    def __init__(self, monkeypatch):
        self.channels_last = []
        original = backend.compile_graph

        def recording(gm, example_inputs, *args, **kwargs):
            for node in gm.graph.nodes:
                if node.target in (aten.convolution.default, aten.convolution_backward.default):
                    val = node.args[0].meta["val"]
                    self.channels_last.append(val.is_contiguous(memory_format=torch.channels_last)
                                              and not val.is_contiguous())
            return original(gm, example_inputs, *args, **kwargs)
        monkeypatch.setattr(backend, "compile_graph", recording)


@pytest.fixture
def seen(monkeypatch):
    return ConvInputs(monkeypatch)


def _train(model, x, dynamic=False):
    """(eager's output, input grad, param grads) and brrr's."""
    model.zero_grad(set_to_none=True)
    ref_model = copy.deepcopy(model)
    torch._dynamo.reset()
    fn = torch.compile(model, backend=brrr_backend, dynamic=dynamic)
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = ref_model(xr)
    g = torch.randn_like(ref)
    out = fn(xc)
    out.backward(g)
    ref.backward(g)
    return (ref, xr.grad, [p.grad for p in ref_model.parameters()]), \
           (out, xc.grad, [p.grad for p in model.parameters()])


def _assert_same(ref, got):
    for r, o in zip([ref[0], ref[1]] + ref[2], [got[0], got[1]] + got[2]):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)
        assert o.stride() == r.stride()


class Classifier(nn.Module):
    """VGG's head: convolutions, then the feature map flattened (a view) into a linear layer."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
        self.head = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


MODELS = {"conv-bn-relu-pool": ConvBlock, "separable": lambda: Separable(), "flatten-classifier": Classifier}
FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", list(MODELS))
def test_blocks_equal_eager_when_converted(timer, seen, name, fmt):
    timer(Timer(as_is_s=2e-3, channels_last_s=1e-3))
    torch.manual_seed(0)
    model = MODELS[name]()
    x = torch.randn(2, 8 if name == "separable" else 3, 8, 8).to(memory_format=FORMATS[fmt])
    ref, got = _train(model, x)
    _assert_same(ref, got)
    assert seen.channels_last and all(seen.channels_last)   # every convolution, forward and backward
    if fmt == "nchw":
        [decision] = layouts.DECISIONS
        assert decision.graph == "training" and decision.converted


def test_a_converted_training_graph_is_kept_and_a_second_compile_traces_nothing(timer, seen, monkeypatch, tmp_path):
    """The conversion leaves fake views in the graphs' metadata (values re-propagated), which torch's GraphPickler
    cannot write: the AOT cache keeps the graphs all the same, so a warm start skips AOTAutograd and this pass, and
    its results equal eager's in the converted layout."""
    from torch._dynamo.backends import common

    from brrr.compile.runtime import aot_cache

    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BRRR_GRAPH_CACHE", "1")
    monkeypatch.setattr(aot_cache, "STATS", dict.fromkeys(aot_cache.STATS, 0))
    traced, aot = [], common.aot_module_simplified
    monkeypatch.setattr(common, "aot_module_simplified", lambda *a, **k: traced.append(1) or aot(*a, **k))
    timer(Timer(as_is_s=2e-3, channels_last_s=1e-3))
    torch.manual_seed(0)
    model, x = ConvBlock(), torch.randn(2, 3, 8, 8)
    _assert_same(*_train(model, x))
    assert layouts.DECISIONS[0].converted and traced == [1]
    assert aot_cache.STATS["stored"] == 1 and aot_cache.STATS["refused"] == 0
    seen.channels_last.clear()
    _assert_same(*_train(model, x))
    assert traced == [1] and aot_cache.STATS["hits"] == 1 and len(layouts.DECISIONS) == 1
    assert seen.channels_last and all(seen.channels_last)   # the kept graphs run channels_last


@pytest.mark.parametrize("name", list(MODELS))
def test_blocks_stay_nchw_when_the_timer_says_channels_last_is_slower(timer, seen, name):
    timer(Timer(as_is_s=1e-3, channels_last_s=1.2e-3))
    torch.manual_seed(0)
    model = MODELS[name]()
    x = torch.randn(2, 8 if name == "separable" else 3, 8, 8)
    ref, got = _train(model, x)
    _assert_same(ref, got)
    assert seen.channels_last and not any(seen.channels_last)
    [decision] = layouts.DECISIONS
    assert not decision.converted and decision.channels_last_s > decision.as_is_s
    assert decision.copies == 0 and "not faster" in decision.why   # no candidate graph built


def test_copies_count_against_channels_last(timer, seen):
    """Convolutions 5% faster channels_last do not pay for their conversions at a slow copy bandwidth."""
    timer(Timer(as_is_s=1e-6, channels_last_s=0.95e-6, bandwidth=1e9))
    _train(ConvBlock(), torch.randn(2, 3, 8, 8))
    assert not any(seen.channels_last)
    [decision] = layouts.DECISIONS
    assert decision.copy_bytes > 0 and not decision.converted


def _converted_joint(monkeypatch, model, x):
    """The training graph the layout pass returned (AOTAutograd's joint graph, rewritten)."""
    chosen = []
    original = layouts.choose

    def keep(gm, graph):
        out = original(gm, graph)
        chosen.append(out)
        return out
    monkeypatch.setattr(layouts, "choose", keep)
    _train(model, x)
    [joint] = chosen
    return joint


def test_each_graph_input_is_converted_once(timer, monkeypatch):
    timer(Timer())
    model = ConvBlock()
    joint = _converted_joint(monkeypatch, model, torch.randn(2, 3, 8, 8))
    clones = [n for n in joint.graph.nodes if n.target == aten.clone.default
              and n.kwargs.get("memory_format") == torch.channels_last]
    sources = [n.args[0] for n in clones]
    assert len(sources) == len(set(sources))
    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder" and n.name.startswith("primals")]
    # the input and the two weights, each once though each feeds a forward and a backward convolution
    assert sum(s in placeholders for s in sources) == 3
    # one conversion back per output that changed: the forward's output and the gradients of the input and weights
    restored = [n for n in joint.graph.nodes if n.target == aten.clone.default
                and n.kwargs.get("memory_format") == torch.contiguous_format]
    assert len(restored) == 4 and len({n.args[0] for n in restored}) == 4


class Residual(nn.Module):
    """Separable blocks with skip connections from the graph's input on: x + block(x), three times."""

    def __init__(self, c=8):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c), nn.Conv2d(c, c, 1),
                                                  nn.ReLU()) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def test_a_residual_stays_channels_last_between_blocks(timer, monkeypatch):
    """Only graph inputs are converted: the skip reads the input's converted copy, so no block converts again."""
    timer(Timer())
    model = Residual()
    x = torch.randn(2, 8, 6, 6)
    joint = _converted_joint(monkeypatch, copy.deepcopy(model), x)
    sources = [n.args[0] for n in joint.graph.nodes if n.target == aten.clone.default
               and n.kwargs.get("memory_format") == torch.channels_last]
    assert sources and all(s.op == "placeholder" for s in sources)
    ref, got = _train(model, x)
    _assert_same(ref, got)


def _infer_equals_eager(fn, x):
    """brrr's inference result equals eager's, in values and strides."""
    torch._dynamo.reset()
    with torch.no_grad():
        out, ref = torch.compile(fn, backend=brrr_backend)(x), fn(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert out.stride() == ref.stride()


class TwoBranches(nn.Module):
    """Two convolution stacks on two inputs, joined only through their flattened features."""

    def __init__(self):
        super().__init__()
        self.wide = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.narrow = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1))

    def forward(self, a, b):
        return self.wide(a).flatten(1).sum(1) + self.narrow(b).flatten(1).sum(1)


class ByChannels(Timer):
    """Convolutions over 8 channels run faster channels_last, those over 6 slower."""

    def conv(self, call, layout):
        self.calls += 1
        wide = call.tensors[0][0][1] == 8
        return {"as_is": 2e-3, "channels_last": 1e-3 if wide else 3e-3}[layout]


def test_groups_of_convolutions_decide_apart(timer, seen):
    timer(ByChannels())
    torch.manual_seed(0)
    model = TwoBranches().eval()
    a, b = torch.randn(2, 8, 6, 6), torch.randn(2, 6, 6, 6)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend=brrr_backend)(a, b)
        torch.testing.assert_close(out, model(a, b), rtol=1e-4, atol=1e-4)
    wide, narrow = layouts.DECISIONS
    assert "group 1 of 2" in wide.graph and "group 2 of 2" in narrow.graph
    assert wide.converted and not narrow.converted
    assert seen.channels_last == [True, True, False, False]


def test_inference_graph_converts_and_keeps_its_output_layout(timer, seen):
    timer(Timer())
    _infer_equals_eager(ConvBlock().eval(), torch.randn(2, 3, 8, 8))
    assert seen.channels_last and all(seen.channels_last)
    [decision] = layouts.DECISIONS
    assert decision.graph == "inference" and decision.converted


def test_changing_shapes_follow_the_converted_graph(timer, seen):
    timer(Timer())
    torch.manual_seed(0)
    model = ConvBlock()
    for batch in (2, 3, 5):
        ref, got = _train(model, torch.randn(batch, 3, 8, 8), dynamic=True)
        _assert_same(ref, got)
        assert all(seen.channels_last)


def test_an_output_it_cannot_restore_leaves_the_graph_as_passed(timer):
    """A permuted (non-contiguous) output of a convolution: converting would change its strides."""
    timer(Timer())
    conv = nn.Conv2d(3, 8, 3, padding=1)

    def f(x):
        return conv(x).permute(0, 2, 3, 1) * 2
    _infer_equals_eager(f, torch.randn(2, 3, 6, 6))
    [decision] = layouts.DECISIONS
    assert not decision.converted and "strides" in decision.why


def test_explain_shows_each_decision_with_its_times(timer):
    timer(Timer(as_is_s=3e-3, channels_last_s=1e-3))
    torch._dynamo.reset()
    ex = explain(ConvBlock(), torch.randn(2, 3, 8, 8, requires_grad=True), train=True)
    [decision] = ex.layouts
    text = str(ex)
    assert "layouts chosen" in text and "converted to channels_last" in text
    assert f"{decision.as_is_s * 1e3:.3f} ms as passed" in text and "convolution_backward" in text


def test_the_device_timer_caches_its_times_on_disk(monkeypatch, tmp_path):
    """A second timer (another process's) reads the first one's measurement instead of timing again."""
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    measured = []

    class Counting(conv_timing.DeviceConvTimer):
        def _measure(self, call, layout):
            measured.append((call, layout))
            return 1.5e-3 if layout == "as_is" else 0.5e-3

    call = conv_timing.ConvCall("convolution", (((2, 3, 8, 8), (192, 64, 8, 1)), ((8, 3, 3, 3), (27, 9, 3, 1)),
                                                None), "torch.float32", "cpu", ((1, 1), (1, 1), (1, 1), False,
                                                                                  (0, 0), 1))
    first, second = Counting(torch.device("cpu")), Counting(torch.device("cpu"))
    assert first.conv(call, "channels_last") == 0.5e-3 and first.conv(call, "as_is") == 1.5e-3
    assert second.conv(call, "channels_last") == 0.5e-3 and second.conv(call, "as_is") == 1.5e-3
    assert len(measured) == 2
    # the timed function runs the call in the layout asked for
    out = conv_timing.runner(call, "channels_last", "cpu")()
    assert out.shape == (2, 8, 8, 8) and out.is_contiguous(memory_format=torch.channels_last)


def test_the_copy_bandwidth_is_measured_outside_fake_mode(monkeypatch):
    """Compiling runs under AOTAutograd's fake mode; the device's ceilings, where none are on disk yet, are
    measured on real tensors."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    import brrr.cost.device as device

    class Ceilings:
        bandwidth = 1e12

    def measure(dev):
        assert not isinstance(torch.ones(1), FakeTensor)
        return Ceilings()
    monkeypatch.setattr(device, "get_ceilings", measure)
    with FakeTensorMode():
        assert conv_timing.DeviceConvTimer(torch.device("cpu")).copy(1e6) == pytest.approx(2e-6)


def test_a_failing_timer_leaves_the_graph_as_passed_and_says_why(timer, seen, monkeypatch):
    monkeypatch.setenv("BRRR_DEBUG", "0")

    class Broken(Timer):
        def copy(self, nbytes):
            raise RuntimeError("no bandwidth")
    timer(Broken())
    ref, got = _train(ConvBlock(), torch.randn(2, 3, 8, 8))
    _assert_same(ref, got)
    assert not any(seen.channels_last)
    [decision] = layouts.DECISIONS
    assert not decision.converted and "no bandwidth" in decision.why


def test_the_pass_is_off_with_brrr_layouts_0(timer, seen, monkeypatch):
    monkeypatch.setenv("BRRR_LAYOUTS", "0")
    timer(Timer())
    _train(ConvBlock(), torch.randn(2, 3, 8, 8))
    assert not any(seen.channels_last) and not layouts.DECISIONS
