"""The floor's whole-graph trial (runtime/captured_choice.py) on the CPU, with a test-double clock: a graph brrr
compiled runs as Dynamo captured it when that measured faster, and stays compiled otherwise; results equal eager
either way."""

import contextlib
import copy
import functools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from brrr.compile.runtime import captured_choice, kernel_registry
from brrr.compile.backend import brrr_backend
from tests.compile.helpers import compiled


def brrr_backend_with(**options):
    return functools.partial(brrr_backend, **options)


def block(x, w):
    return torch.tanh(x @ w).sum(-1) * 2


class LaunchClock:
    """Time passes by `brrr_s` between two readings when a brrr kernel launched between them, else by `eager_s`
    (interpreted launches open kernel_registry.LAUNCH_HOOK)."""

    def __init__(self, brrr_s, eager_s):
        self.brrr_s, self.eager_s, self.t, self.launched = brrr_s, eager_s, 0.0, False

    def launch(self, name):
        self.launched = True
        return contextlib.nullcontext()

    def now(self):
        self.t += self.brrr_s if self.launched else self.eager_s
        self.launched = False
        return self.t

    def sync(self):
        pass


@pytest.fixture
def clock_of(monkeypatch):
    monkeypatch.setattr(captured_choice, "DECISIONS", [])

    def install(clock):
        monkeypatch.setattr(captured_choice, "CLOCK", clock)
        monkeypatch.setattr(kernel_registry, "LAUNCH_HOOK", clock.launch)
        return clock
    return install


@pytest.mark.parametrize("captured_faster", [True, False])
def test_the_faster_of_compiled_and_captured_is_kept(clock_of, captured_faster):
    clock = clock_of(LaunchClock(brrr_s=5.0, eager_s=3.0) if captured_faster else LaunchClock(1.0, 4.0))
    torch._dynamo.reset()
    fn = compiled(block)
    w = torch.randn(16, 8)
    calls = captured_choice.TRIAL_LENGTH + 3
    for _ in range(calls):
        x = torch.randn(4, 16)
        torch.testing.assert_close(fn(x, w), block(x, w))
    [decision] = captured_choice.DECISIONS
    assert decision.captured is captured_faster
    assert (decision.compiled_s, decision.captured_s) == ((5.0, 3.0) if captured_faster else (1.0, 4.0))
    clock.launched = False
    x = torch.randn(4, 16)
    torch.testing.assert_close(fn(x, w), block(x, w))
    assert clock.launched is not captured_faster   # the kept way runs: brrr's kernels only when compiled


def test_brrr_captured_trial_0_keeps_brrrs_kernels_untimed(clock_of, monkeypatch):
    """With BRRR_CAPTURED_TRIAL=0 the graph is never run as captured, however much faster that would be: every
    call launches brrr's kernels, and no verdict is logged."""
    monkeypatch.setenv("BRRR_CAPTURED_TRIAL", "0")
    clock = clock_of(LaunchClock(brrr_s=5.0, eager_s=3.0))
    torch._dynamo.reset()
    fn = compiled(block)
    w = torch.randn(16, 8)
    for _ in range(captured_choice.TRIAL_LENGTH + 3):
        clock.launched = False
        x = torch.randn(4, 16)
        torch.testing.assert_close(fn(x, w), block(x, w))
        assert clock.launched
    assert captured_choice.DECISIONS == []


def test_captured_calls_come_before_the_compiled_graph_settles_and_decide_once():
    """The first call checks brrr's kernels; the graph as captured is timed next, before the compiled graph's
    replay trial captures a CUDA graph (whose memory would otherwise be held beside eager's activations), then
    the compiled graph settles and is timed."""
    ran = []
    wrapper = captured_choice.CompiledOrCaptured(lambda x: ran.append("compiled") or x + 1,
                                                 lambda x: ran.append("captured") or x + 1)
    captured_choice.CLOCK = LaunchClock(0.0, 1.0)
    try:
        for i in range(captured_choice.TRIAL_LENGTH + 5):
            assert wrapper(i) == i + 1
    finally:
        captured_choice.CLOCK = None
    n = captured_choice.SAMPLES
    assert ran[:1 + n] == ["compiled"] + ["captured"] * n
    assert set(ran[1 + n:]) == {"compiled"}
    assert wrapper.chosen is not None   # equal periods: compiled stays (the captured graph must save 3%)
    assert ran[-1] == "compiled"


def test_two_graphs_time_their_captured_calls_in_turn():
    """Two graphs called each step: the second runs compiled, untimed, until the first has decided; then its own
    captured calls and periods come, with the first settled in every one of them (trial_turns.py)."""
    ran = []
    first, second = (captured_choice.CompiledOrCaptured(lambda x, n=n: ran.append((n, "compiled")) or x + 1,
                                                        lambda x, n=n: ran.append((n, "captured")) or x + 1)
                     for n in ("first", "second"))
    captured_choice.CLOCK = LaunchClock(0.0, 1.0)
    decided_at = None
    try:
        for i in range(2 * captured_choice.TRIAL_LENGTH + 4):
            assert first(i) == i + 1
            if decided_at is None and first.chosen is not None:
                decided_at = len(ran)
            assert second(i) == i + 1
    finally:
        captured_choice.CLOCK = None
    assert decided_at is not None and first.chosen is not None and second.chosen is not None
    assert ("second", "captured") not in ran[:decided_at]
    assert ran[decided_at:].count(("second", "captured")) == captured_choice.SAMPLES
    assert ("first", "captured") not in ran[decided_at:]


def train_beside_eager(model):
    """Steps through the trial and after, compiled beside an eager copy: every loss and gradient equal eager's."""
    reference = copy.deepcopy(model)
    torch._dynamo.reset()
    fn = compiled(model)
    for _ in range(captured_choice.TRIAL_LENGTH + 3):
        x = torch.randn(8, 16)
        loss, expected = fn(x).square().mean(), reference(x).square().mean()
        loss.backward()
        expected.backward()
        torch.testing.assert_close(loss, expected)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None


@pytest.mark.parametrize("captured_faster", [True, False])
def test_training_steps_stay_equal_to_eager_through_the_trial_and_after(clock_of, captured_faster):
    """Steps run brrr's forward (its own backward) or the graph as captured (eager's autograd) during the trial:
    every step's loss and gradients equal eager's, whichever way ran."""
    clock_of(LaunchClock(5.0, 3.0) if captured_faster else LaunchClock(1.0, 4.0))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    train_beside_eager(model)
    [decision] = captured_choice.DECISIONS
    assert decision.captured is captured_faster


def pointwise_chain():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Sigmoid(), torch.nn.SiLU(),
                               torch.nn.Linear(64, 16))


def count_captured_calls(monkeypatch):
    """A list that grows by one at each real call of a graph as captured (the fake-tensor counts run it too)."""
    ran = []
    make = captured_choice.CompiledOrCaptured.__init__

    def counting(self, compiled, captured, *a, **k):
        real = lambda *args: not isinstance(args[0], FakeTensor) and ran.append(1)   # noqa: E731
        make(self, compiled, lambda *args: real(*args) or captured(*args), *a, **k)
    monkeypatch.setattr(captured_choice.CompiledOrCaptured, "__init__", counting)
    return ran


@pytest.mark.parametrize("allocated, tried", [(0, False), (1 << 40, True)])
def test_a_training_graph_whose_captured_calls_would_hold_too_much_runs_compiled_untimed(
        clock_of, monkeypatch, allocated, tried):
    """Eager's ops save more for the backward than brrr's forward here (every pointwise op's result, where brrr
    saves the first and recomputes the rest): beside nothing else allocated that is over MEMORY_MARGIN, and the
    captured calls never run; beside a large allocation it is within it, and the trial runs as before. Steps
    equal eager's either way."""
    clock_of(LaunchClock(5.0, 3.0))   # the captured graph would win on time
    monkeypatch.setattr(captured_choice, "MEMORY", lambda: allocated)
    ran = count_captured_calls(monkeypatch)
    model = pointwise_chain()
    train_beside_eager(model)
    [decision] = captured_choice.DECISIONS
    assert bool(ran) is tried
    if tried:
        assert decision.captured and decision.held is None
    else:
        now, brrr, eager = decision.held
        assert now == 0 and eager > captured_choice.MEMORY_MARGIN * brrr > 0
        assert (decision.compiled_s, decision.captured_s, decision.captured) == (None, None, False)
        assert "as captured not tried" in str(decision)


class Broadcasting(torch.nn.Module):
    """A step whose eager ops make a tensor 64 times its input and free it at once: little held for the
    backward either way, a high peak only eager's way (brrr's kernel reduces it as it goes). Small integers
    throughout, so that every order of the sums is exact."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 16)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randint(-2, 3, (16, 16)))
            self.lin.bias.zero_()

    def forward(self, x):
        return (self.lin(x.round())[:, None, :].expand(-1, 64, -1) * 2.0).sum(1)


@pytest.mark.parametrize("peaked, tried", [(0, False), (1 << 40, True)])
def test_a_training_graph_whose_eager_step_would_peak_higher_runs_compiled_untimed(
        clock_of, monkeypatch, peaked, tried):
    """Counted on fake tensors, eager's step would peak at its [8, 64, 16] temporary, over MEMORY_MARGIN of what
    the process has peaked at so far when that is little: the captured calls never run, and the verdict says
    why. Where the process has already peaked far higher, they run as before. Steps equal eager's either way."""
    from brrr.compile.runtime.held_for_backward import held_and_peak

    clock_of(LaunchClock(5.0, 3.0))   # the captured graph would win on time
    monkeypatch.setattr(captured_choice, "MEMORY", lambda: 0)
    monkeypatch.setattr(captured_choice, "PEAK", lambda: peaked)
    ran = count_captured_calls(monkeypatch)
    model = Broadcasting()
    x = torch.randn(8, 16)
    held, peak = held_and_peak(lambda x: model(x).square().mean(), [x])
    assert peak >= 8 * 64 * 16 * 4 > 4 * held   # the temporary, not held
    train_beside_eager(model)
    [decision] = captured_choice.DECISIONS
    assert bool(ran) is tried
    if not tried:
        eager, process = decision.peaks
        assert eager >= 8 * 64 * 16 * 4 > captured_choice.MEMORY_MARGIN * process
        assert "would peak at" in str(decision) and decision.captured_s is None


def test_with_cuda_graphs_fastest_time_alone_decides(clock_of, monkeypatch):
    clock_of(LaunchClock(5.0, 3.0))
    monkeypatch.setattr(captured_choice, "MEMORY", lambda: 0)
    model = pointwise_chain()
    torch._dynamo.reset()
    fn = torch.compile(model, backend=brrr_backend_with(cuda_graphs="fastest"), dynamic=False)
    for _ in range(captured_choice.TRIAL_LENGTH + 3):
        fn(torch.randn(8, 16)).sum().backward()
    [decision] = captured_choice.DECISIONS
    assert decision.captured and decision.captured_s == 3.0
