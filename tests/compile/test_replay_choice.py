"""cuda_graphs="auto" (replay_choice.py) on the CPU: a compiled graph times launching against replaying and keeps
the faster. The CUDA graph is conftest's stand-in; the host clock and the CUDA events read one fake clock that
each call advances by what it would cost, launched or replayed."""

import pytest
import torch

import brrr
from brrr.compile.runtime import replay_choice
from brrr.compile.runtime.compiled import CompiledGraph


class Clock:
    """Host and device time in seconds; a call advances both by its cost (launched, or replayed)."""

    def __init__(self):
        self.host = self.device = 0.0

    def spend(self, host_s, device_s):
        start = max(self.device, self.host)   # the device starts the call's work once the host asks for it
        self.host += host_s
        self.device = start + device_s


@pytest.fixture
def clock(monkeypatch, fake_cuda_graphs):
    c = Clock()

    class Event:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = max(c.device, c.host)

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.at - self.at) * 1e3

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: setattr(c, "host", max(c.host, c.device)))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(replay_choice.time, "perf_counter", lambda: c.host)
    monkeypatch.setattr(replay_choice, "DECISIONS", [])
    monkeypatch.setattr(replay_choice, "MEMORY", lambda: 0)   # no GPU: the peak never moves unless a test says
    monkeypatch.setattr(replay_choice, "SMALL_GROWTH", 0)    # the tests' peaks are bytes: the margin alone
    return c


def costed_call(clock, fake_graph, launch, replay):
    """A graph computing x * w + 1, costing `launch` = (host s, device s) launched, `replay` replayed."""
    def call(args):
        x, w = args
        clock.spend(*(replay if fake_graph.replaying else launch))
        return (x * w + 1,)
    return call


def run_calls(graph, n, w):
    outs = []
    for i in range(n):
        x = torch.full((4,), float(i))
        (out,) = graph([x, w])
        torch.testing.assert_close(out, x * w + 1)   # right every call, launched or replayed
        outs.append(out)
    return outs


def test_a_host_bound_graph_keeps_replaying(clock, fake_cuda_graphs):
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto", kind="forward")
    run_calls(graph, replay_choice.TRIAL_CALLS, w)
    assert graph.trial is None and graph.graphed is not None
    (decision,) = replay_choice.DECISIONS
    assert decision.replay and decision.graph == "forward"
    assert decision.launch_s == pytest.approx(500e-6) and decision.replay_s == pytest.approx(210e-6)
    replays = fake_cuda_graphs.replays
    run_calls(graph, 5, w)
    assert fake_cuda_graphs.replays == replays + 5


def test_a_device_bound_graph_goes_back_to_launching(clock, fake_cuda_graphs):
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(100e-6, 1000e-6), replay=(20e-6, 1080e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto", kind="backward")
    run_calls(graph, replay_choice.TRIAL_CALLS, w)
    (decision,) = replay_choice.DECISIONS
    assert not decision.replay and decision.replay_s == pytest.approx(1080e-6)
    assert graph.trial is None and graph.graphed is None
    replays = fake_cuda_graphs.replays
    run_calls(graph, 5, w)
    assert fake_cuda_graphs.replays == replays
    assert "launches its kernels" in str(decision) and "1080 us" in str(decision)


def test_a_saving_inside_the_margin_is_not_taken(clock, fake_cuda_graphs):
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(100e-6, 300e-6), replay=(20e-6, 290e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto")
    run_calls(graph, replay_choice.TRIAL_CALLS, w)
    (decision,) = replay_choice.DECISIONS
    assert not decision.replay   # 290 vs 300 us: inside MARGIN, and launching leaves the host idle 2/3 of a call
    assert decision.host_s == pytest.approx(100e-6) and "the host busy 100 us" in str(decision)


def test_a_graph_that_holds_the_host_replays_on_a_saving_inside_the_margin(clock, fake_cuda_graphs):
    """Launched, the host is the bottleneck (300 us of host a call): a host that slows would slow every launched
    call, and a replay that is no slower keeps the GPU fed whatever the host does."""
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(300e-6, 100e-6), replay=(20e-6, 290e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto")
    run_calls(graph, replay_choice.TRIAL_CALLS, w)
    (decision,) = replay_choice.DECISIONS
    assert decision.replay and "launching holds the host" in decision.reason
    assert decision.host_s == pytest.approx(300e-6)


def test_a_replay_slower_than_launching_is_never_taken_for_the_host(clock, fake_cuda_graphs):
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(300e-6, 100e-6), replay=(20e-6, 310e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto")
    run_calls(graph, replay_choice.TRIAL_CALLS, w)
    assert not replay_choice.DECISIONS[0].replay


def test_only_replays_lend_their_outputs_and_every_launch_comes_before_the_capture(clock, fake_cuda_graphs):
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto")
    graph.lend = (0,)
    lent = []
    for i in range(replay_choice.TRIAL_CALLS):
        graph([torch.full((4,), float(i)), w])
        lent.append(graph.lent)
    # the checking call and the timed launches, then the capture and the timed replays: no launched call runs while
    # the graph holds its memory; the last call ends the last period and, replaying being faster, replays
    n = replay_choice.SAMPLES
    assert lent == [False] + [False] * n + [True] + [True] * n + [True]


def test_a_graph_that_cannot_capture_launches(clock, fake_cuda_graphs, monkeypatch):
    from brrr.compile.runtime.cuda_graphs import GraphedCall

    monkeypatch.setattr(GraphedCall, "_capture", lambda self, args: False)
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto")
    run_calls(graph, 2 + replay_choice.SAMPLES, w)   # the checking call, the launches, the failed capture
    (decision,) = replay_choice.DECISIONS
    assert not decision.replay and decision.replay_s is None and graph.graphed is None
    assert "could not capture" in str(decision)


def test_inside_the_callers_own_capture_the_trial_waits(clock, fake_cuda_graphs, monkeypatch):
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto")
    run_calls(graph, 1, w)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    run_calls(graph, 10, w)
    assert graph.trial.launched == [] and fake_cuda_graphs.replays == 0


def test_cuda_graphs_false_and_true_never_time(clock, fake_cuda_graphs):
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))
    never, always = (CompiledGraph(call, None, "", cuda_graphs=c) for c in (False, True))
    run_calls(never, 10, w)
    assert never.graphed is None and fake_cuda_graphs.replays == 0
    run_calls(always, 10, w)
    assert always.trial is None and fake_cuda_graphs.replays == 9   # from the 2nd call on (it captures, then replays)
    assert replay_choice.DECISIONS == []


def test_explain_lists_the_decisions_of_this_process(clock):
    replay_choice.log(replay_choice.Decision("forward", True, 500e-6, 210e-6, "faster replayed"))
    text = str(brrr.explain(lambda x: x + 1, torch.randn(3)))
    assert ("forward graph: replays a CUDA graph (faster replayed: a call's period 500 us launching, 210 us "
            "replaying)") in text


def test_compile_rejects_an_unknown_cuda_graphs_value():
    with pytest.raises(ValueError, match="cuda_graphs"):
        brrr.compile(torch.nn.Linear(2, 2), cuda_graphs="sometimes")


def test_the_last_replay_of_a_rejected_graph_can_still_be_tracked(clock, fake_cuda_graphs):
    from brrr.compile.runtime.cuda_graphs import Loan

    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(100e-6, 1000e-6), replay=(20e-6, 1080e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto")
    graph.lend = (0,)
    for i in range(replay_choice.TRIAL_CALLS - 1):
        out = graph([torch.full((4,), float(i)), w])
    assert graph.lent and graph.graphed is not None   # the last timed call replayed and lent its outputs
    marker = torch.empty(0)   # its backward may still run
    loan = Loan(out, marker)
    graph.track(loan)
    graph([torch.full((4,), 0.0), w])   # the verdict: launch; the graph's memory goes, the loan gets copies first
    assert graph.graphed is None and not graph.lent and loan.copied
    graph.track(Loan(out, torch.empty(0)))   # nothing left to overwrite it: a no-op
    torch.testing.assert_close(loan.tensors[0], torch.full((4,), float(replay_choice.TRIAL_CALLS - 2)) * w + 1)


def test_early_slow_calls_do_not_decide_for_replaying(clock, fake_cuda_graphs):
    """The first calls of a training loop are slow (the caching allocator still grows), and they are launched
    ones: the least launched period is a warm one, so a graph whose launches are fast once warm keeps launching."""
    w, calls = torch.randn(4), [0]

    def call(args):
        calls[0] += 1
        warm = calls[0] > 3
        clock.spend(*((20e-6, 14.7e-3) if fake_cuda_graphs.replaying else (20e-6, 12e-3 if warm else 21e-3)))
        return (args[0] * args[1] + 1,)
    graph = CompiledGraph(call, None, "", cuda_graphs="auto")
    run_calls(graph, replay_choice.TRIAL_CALLS, w)
    (decision,) = replay_choice.DECISIONS
    assert not decision.replay and decision.launch_s == pytest.approx(12e-3)


def pair_of_graphs(clock, fake_cuda_graphs, forward_costs, backward_costs):
    """A training forward lending its saved tensor to a backward that pins it, wired as lean_autograd does."""
    def forward(args):
        x, w = args
        clock.spend(*forward_costs[fake_cuda_graphs.replaying])
        return (x * w + 1, x * 2)

    def backward(args):
        saved, g = args
        clock.spend(*backward_costs[fake_cuda_graphs.replaying])
        return (saved * g,)
    fw = CompiledGraph(forward, None, "", cuda_graphs="auto", kind="forward")
    bw = CompiledGraph(backward, None, "", cuda_graphs="auto", kind="backward")
    fw.lend, bw.pin, bw.lender = (1,), (0,), fw
    return fw, bw


def train_steps(fw, bw, n, w):
    # every step's tensors are held to the end: a new input at a freed input's address would read as the same
    # tensor in place (graphs compare addresses), which on the CPU depends on what earlier tests left in the heap
    held = []
    for i in range(n):
        x = torch.full((4,), float(i))
        out, saved = fw([x, w])
        torch.testing.assert_close(out, x * w + 1)
        bw.pinned_ready = fw.lent   # lean_autograd: the loan is still the forward's memory ...
        bw.lent_from = fw.graphed   # ... and the forward's recording it came through
        ones = torch.ones(4)
        (grad,) = bw([saved, ones])
        torch.testing.assert_close(grad, x * 2)
        held += [x, out, ones, grad]


def test_a_forward_times_whole_steps_and_its_backward_follows(clock, fake_cuda_graphs):
    """BERT MLM's numbers on one H100: launched, the forward's host time hides under its device time, so the
    graphs' own costs summed say 11.2 ms against 10.8 replayed (a tie); the step's period is 11.2 ms against
    10.3, and both replay."""
    w = torch.randn(4)
    fw, bw = pair_of_graphs(clock, fake_cuda_graphs, {False: (3.68e-3, 5.54e-3), True: (0.62e-3, 4.51e-3)},
                            {False: (5.40e-3, 5.64e-3), True: (50e-6, 5.74e-3)})
    train_steps(fw, bw, replay_choice.TRIAL_CALLS, w)
    forward, backward = replay_choice.DECISIONS
    assert (forward.graph, backward.graph) == ("forward", "backward")
    assert forward.replay and backward.replay
    assert forward.launch_s == pytest.approx(11.18e-3) and forward.replay_s == pytest.approx(10.25e-3)
    assert "over whole steps with its backward" in str(forward) and "as its forward graph" in str(backward)
    replays = fake_cuda_graphs.replays
    train_steps(fw, bw, 3, w)
    assert fake_cuda_graphs.replays == replays + 6
    assert fw.trial is None and bw.trial is None and fw.graphed is not None and bw.graphed is not None
    # the backward's buffers reuse the forward's pool; the forward's pool is its own
    assert bw.graphed.graph.captured_into == fw.graphed.graph.pool() and fw.graphed.graph.captured_into is None


def test_a_pair_whose_launches_hold_the_host_replays_both(clock, fake_cuda_graphs):
    """The host time of a step counts the backward's launched calls with the forward's: 4 + 3 ms of host in a
    10 ms period, a replay 1.5% faster."""
    w = torch.randn(4)
    fw, bw = pair_of_graphs(clock, fake_cuda_graphs, {False: (4e-3, 5e-3), True: (50e-6, 4.9e-3)},
                            {False: (3e-3, 5e-3), True: (50e-6, 4.9e-3)})
    train_steps(fw, bw, replay_choice.TRIAL_CALLS + 3, w)
    forward, backward = replay_choice.DECISIONS
    assert forward.replay and backward.replay and "launching holds the host" in forward.reason
    assert forward.launch_s == pytest.approx(10e-3) and forward.host_s == pytest.approx(7e-3)
    assert fw.graphed is not None and bw.graphed is not None


def test_one_pair_called_at_two_places_decides_each_over_whole_steps(clock, fake_cuda_graphs):
    """One forward and backward serving two layers (a graph break between them), the weight at each layer's own
    address: each place records, times and decides on its own, in step with the other, and both replay."""
    w1, w2 = torch.randn(4), torch.randn(4)
    fw, bw = pair_of_graphs(clock, fake_cuda_graphs, {False: (3e-3, 1e-3), True: (50e-6, 1e-3)},
                            {False: (2e-3, 1e-3), True: (50e-6, 1e-3)})
    fw.static_inputs = (1,)   # the weight is a parameter (AOTAutograd's static input)
    held = []
    for i in range(replay_choice.TRIAL_CALLS + 3):
        x = torch.full((4,), float(i))
        pending = []
        for w in (w1, w2):
            out, saved = fw([x, w])
            torch.testing.assert_close(out, x * w + 1)
            pending.append((saved, fw.lent, fw.graphed))
            held.append(out)
        for saved, lent, recording in reversed(pending):   # the backwards run in reverse, as autograd's
            bw.pinned_ready, bw.lent_from = lent, recording
            ones = torch.ones(4)
            (grad,) = bw([saved, ones])
            torch.testing.assert_close(grad, x * 2)
            held += [ones, grad]
    assert sorted((d.graph, d.replay) for d in replay_choice.DECISIONS) == \
        [("backward", True)] * 2 + [("forward", True)] * 2
    forwards = [r.graphed for r in fw.recordings.by_key.values()]
    backwards = [r.graphed for r in bw.recordings.by_key.values()]
    assert len(forwards) == len(backwards) == 2 and None not in forwards + backwards
    assert {b.after() for b in backwards} == set(forwards)
    assert not [g.failure for g in forwards + backwards if g.failure]


@pytest.mark.parametrize("why", ["device-bound", "replaying raises the peak"])
def test_a_pair_launches_both(clock, fake_cuda_graphs, monkeypatch, why):
    """A device-bound pair, or a host-bound one whose replays raise the peak by half: the forward and its backward
    decide together, and both launch."""
    if why == "device-bound":
        costs = ({False: (1e-3, 5e-3), True: (50e-6, 5.1e-3)}, {False: (1e-3, 8e-3), True: (50e-6, 8.1e-3)})
    else:
        start = fake_cuda_graphs.replays
        monkeypatch.setattr(replay_choice, "MEMORY", lambda: 1000 + (500 if fake_cuda_graphs.replays > start else 0))
        costs = ({False: (4e-3, 1e-3), True: (50e-6, 1e-3)}, {False: (4e-3, 1e-3), True: (50e-6, 1e-3)})
    w = torch.randn(4)
    fw, bw = pair_of_graphs(clock, fake_cuda_graphs, *costs)
    train_steps(fw, bw, replay_choice.TRIAL_CALLS + 3, w)
    assert [d.replay for d in replay_choice.DECISIONS] == [False, False]
    assert fw.graphed is None and bw.graphed is None


def test_a_backward_that_cannot_capture_launches_and_its_forward_still_decides(clock, fake_cuda_graphs,
                                                                             monkeypatch):
    from brrr.compile.runtime.cuda_graphs import GraphedCall

    capture = GraphedCall._capture
    monkeypatch.setattr(GraphedCall, "_capture", lambda self, args: False if self.pin else capture(self, args))
    w = torch.randn(4)
    fw, bw = pair_of_graphs(clock, fake_cuda_graphs, {False: (3e-3, 1e-3), True: (50e-6, 1e-3)},
                            {False: (1e-3, 2e-3), True: (50e-6, 2e-3)})
    train_steps(fw, bw, replay_choice.TRIAL_CALLS + 2, w)
    backward, forward = replay_choice.DECISIONS
    assert not backward.replay and "could not capture" in str(backward)
    assert forward.replay and bw.graphed is None and fw.graphed is not None   # 3 ms of launches saved per step


@pytest.mark.parametrize("mode, growth, replays", [("auto", 200, False), ("auto", 50, True), ("fastest", 200, True)])
def test_a_faster_replay_that_raises_the_peak_launches_unless_asked_for_speed(clock, fake_cuda_graphs, monkeypatch,
                                                                              mode, growth, replays):
    """Replaying saves time here, and raises the process's peak from 1000 bytes by `growth` once it ran: with
    "auto" more than 10% keeps launching, with "fastest" time alone decides."""
    start = fake_cuda_graphs.replays
    monkeypatch.setattr(replay_choice, "MEMORY", lambda: 1000 + (growth if fake_cuda_graphs.replays > start else 0))
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs=mode)
    run_calls(graph, replay_choice.TRIAL_CALLS, w)
    (decision,) = replay_choice.DECISIONS
    assert decision.replay is replays and decision.peaks == (1000, 1000 + growth)
    assert "peak memory" in str(decision)
    assert (graph.graphed is not None) is replays   # a graph turned down gives its memory back
    if mode == "auto" and not replays:
        assert "raised the peak memory" in decision.reason


@pytest.mark.parametrize("kind, small_growth, replays", [("inference", 300, True), ("inference", 100, False),
                                                         ("forward", 300, False)])
def test_an_inference_growth_within_small_growth_replays_though_over_the_margin(clock, fake_cuda_graphs, monkeypatch,
                                                                                kind, small_growth, replays):
    """Replaying raises the peak from 1000 bytes by 200, twice MEMORY_MARGIN's allowance: for an inference graph an
    absolute allowance (SMALL_GROWTH, 64 MiB on a GPU; bytes here) of 300 takes it in and the graph replays, one of
    100 does not; a training graph keeps the margin alone."""
    start = fake_cuda_graphs.replays
    monkeypatch.setattr(replay_choice, "MEMORY", lambda: 1000 + (200 if fake_cuda_graphs.replays > start else 0))
    monkeypatch.setattr(replay_choice, "ALLOCATED", lambda: 0)
    monkeypatch.setattr(replay_choice, "SMALL_GROWTH", small_growth)
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))
    graph = CompiledGraph(call, None, "", cuda_graphs="auto", kind=kind)
    run_calls(graph, replay_choice.TRIAL_CALLS, w)
    (decision,) = replay_choice.DECISIONS
    assert decision.replay is replays and decision.peaks == (1000, 1200)
    assert (graph.graphed is not None) is replays


def test_a_pair_turned_down_gives_its_memory_back_before_the_deciding_step_launches(clock, fake_cuda_graphs):
    """The verdict comes at the start of a forward call: both graphs' outputs (the saved tensors lent, the
    gradients given) are released before that call launches, so the launched step never sits beside them."""
    import gc
    import weakref

    w = torch.randn(4)
    fw, bw = pair_of_graphs(clock, fake_cuda_graphs, {False: (1e-3, 5e-3), True: (50e-6, 5.1e-3)},
                            {False: (1e-3, 8e-3), True: (50e-6, 8.1e-3)})
    bw.give = True
    forward = fw.call
    held_when_launching = []

    def watched_forward(args):
        if fw.trial is not None and fw.trial.replay is False:   # the deciding call, launching
            gc.collect()
            held_when_launching.extend(r() is not None for r in graph_outputs)
        return forward(args)
    graph_outputs = []
    fw.call = watched_forward
    for i in range(replay_choice.TRIAL_CALLS + 1):
        x = torch.full((4,), float(i))
        out, saved = fw([x, w])
        bw.pinned_ready, bw.lent_from = fw.lent, fw.graphed
        (grad,) = bw([saved, torch.ones(4)])
        torch.testing.assert_close(grad, x * 2)
        if fw.graphed is not None and fw.graphed.graph is not None and not graph_outputs:
            graph_outputs = [weakref.ref(t) for g in (fw.graphed, bw.graphed) for t in g.static_out]
        del out, saved, grad
    assert [d.replay for d in replay_choice.DECISIONS] == [False, False]
    assert graph_outputs and held_when_launching == [False] * len(graph_outputs)


def test_a_backwards_launched_calls_free_their_inputs_in_the_trial_too(clock, fake_cuda_graphs):
    """A backward hands its saved tensors over (owns_inputs): every launched call after the checking one, the
    trial's included, may free each at its last use, and so may its capture."""
    w = torch.randn(4)
    fw, bw = pair_of_graphs(clock, fake_cuda_graphs, {False: (1e-3, 5e-3), True: (50e-6, 5.1e-3)},
                            {False: (1e-3, 8e-3), True: (50e-6, 8.1e-3)})
    backward, owned = bw.call, []

    def owning_backward(args, owned_now=False):
        owned.append((owned_now, "capture" if fake_cuda_graphs.capturing else
                      "replay" if fake_cuda_graphs.replaying else None))
        out = backward(args)
        if owned_now:
            args.clear()
        return out
    bw.call, bw.owns_inputs = owning_backward, True
    train_steps(fw, bw, replay_choice.TRIAL_CALLS + 2, w)
    launched = [o for o, graphed in owned if not graphed]
    # the checking call keeps them: a kernel failing half-way has the call run again
    assert launched[0] is False and len(launched) >= 1 + replay_choice.SAMPLES + 2 and all(launched[1:])
    # the capture consumes them into the forward's pool (cuda_graphs.GraphedCall.consume); a replay reads them
    assert [o for o, graphed in owned if graphed == "capture"] == [True]
    assert not any(o for o, graphed in owned if graphed == "replay")


@pytest.mark.parametrize("captured, replays", [(1050, True), (1500, False)])
def test_a_caller_resetting_the_peak_each_step_is_judged_by_each_steps_peak(clock, fake_cuda_graphs, monkeypatch,
                                                                           captured, replays):
    """A harness resets the peak before every step (it then reads the 100 bytes alive between steps). Launched
    steps peak at 1000 bytes; a replay allocates nothing (its memory is the pool's, allocated while capturing),
    so the capture's step is what replaying costs: at 1050 the graph replays, at 1500 it launches."""
    state = {"peak": 0}
    costed = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))

    def call(args):
        level = captured if fake_cuda_graphs.capturing else 100 if fake_cuda_graphs.replaying else 1000
        state["peak"] = max(state["peak"], level)
        return costed(args)
    monkeypatch.setattr(replay_choice, "MEMORY", lambda: state["peak"])
    w = torch.randn(4)
    graph = CompiledGraph(call, None, "", cuda_graphs="auto")
    for i in range(replay_choice.TRIAL_CALLS):
        state["peak"] = 100
        graph([torch.full((4,), float(i)), w])
    (decision,) = replay_choice.DECISIONS
    assert decision.replay is replays and decision.peaks == (1000, captured)


@pytest.mark.parametrize("allocated, captures", [(0, True), (1000, False)])
def test_an_inference_graph_whose_replay_would_hold_its_outputs_twice_past_the_margin_never_captures(
        clock, fake_cuda_graphs, monkeypatch, allocated, captures):
    """The launched calls peak at 40 bytes; the graph's output, 16 bytes, is held twice once it has captured (the
    graph's and the copy a replay returns). Beside nothing else allocated that is 32 bytes, within the margin: it
    captures, and replays as the faster. Beside 1000 bytes allocated it would reach 1032: it launches without ever
    capturing. Every call equals eager either way."""
    monkeypatch.setattr(replay_choice, "MEMORY", lambda: 40)
    monkeypatch.setattr(replay_choice, "ALLOCATED", lambda: allocated)
    w = torch.randn(4)
    call = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))
    graph = CompiledGraph(call, None, "", kind="inference", cuda_graphs="auto")
    run_calls(graph, replay_choice.TRIAL_CALLS + 2, w)
    (decision,) = replay_choice.DECISIONS
    assert decision.replay is captures
    assert ("holds its outputs twice" in decision.reason) is not captures
    assert (fake_cuda_graphs.replays > 0) is captures
    assert (graph.graphed is not None) is captures


def test_with_cuda_graphs_fastest_the_outputs_memory_does_not_stop_the_capture(clock, fake_cuda_graphs,
                                                                               monkeypatch):
    monkeypatch.setattr(replay_choice, "MEMORY", lambda: 40)
    monkeypatch.setattr(replay_choice, "ALLOCATED", lambda: 1000)
    call = costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6))
    graph = CompiledGraph(call, None, "", kind="inference", cuda_graphs="fastest")
    run_calls(graph, replay_choice.TRIAL_CALLS + 2, torch.randn(4))
    (decision,) = replay_choice.DECISIONS
    assert decision.replay and fake_cuda_graphs.replays > 0


def test_two_graphs_take_turns_so_each_times_the_others_in_one_state(clock, fake_cuda_graphs):
    """Two graphs called each step, A then B: A host-bound (a replay saves 90% of its period), B device-bound
    (launched or replayed, the same). Timed side by side, B's launched periods would carry A launching and its
    replayed ones A replaying, and B would replay on A's saving; taking turns, B waits (launching, untimed)
    until A has decided, then times both ways with A replaying in every period, and launches."""
    from brrr.compile.runtime import trial_turns

    w = torch.randn(4)
    a = CompiledGraph(costed_call(clock, fake_cuda_graphs, launch=(2e-3, 200e-6), replay=(30e-6, 210e-6)), None,
                      "", cuda_graphs="auto", kind="inference")
    b = CompiledGraph(costed_call(clock, fake_cuda_graphs, launch=(50e-6, 1e-3), replay=(10e-6, 1e-3)), None,
                      "", cuda_graphs="auto", kind="inference")
    b_waited = 0
    for i in range(2 * replay_choice.TRIAL_CALLS + 1):
        x = torch.full((4,), float(i))
        for graph in (a, b):
            (out,) = graph([x, w])
            torch.testing.assert_close(out, x * w + 1)
        b_waited += b.trial is not None and not b.trial.launched and b.trial.turn is None
        if len(replay_choice.DECISIONS) == 2:
            break
    first, second = replay_choice.DECISIONS
    assert first.replay and a.graphed is not None            # A, decided first
    assert not second.replay and b.graphed is None           # B: launches
    assert second.launch_s == pytest.approx(second.replay_s, rel=0.05)   # A replayed in both of B's ways
    assert second.launch_s < 1.3e-3                          # ... never A's 2 ms launched host time
    assert b_waited >= replay_choice.TRIAL_CALLS - 2
    assert not trial_turns.pending()


def test_a_trial_whose_graph_is_never_called_again_gives_up_its_turn(clock, fake_cuda_graphs, monkeypatch):
    """A graph called a few times (a warm-up) holds the turn mid-trial and is never called again: the next graph
    waits MAX_WAIT of its calls, then takes the turn and decides."""
    from brrr.compile.runtime import trial_turns

    monkeypatch.setattr(trial_turns, "MAX_WAIT", 4)
    w = torch.randn(4)
    warmup = CompiledGraph(costed_call(clock, fake_cuda_graphs, launch=(1e-3, 1e-3), replay=(10e-6, 1e-3)), None,
                           "", cuda_graphs="auto", kind="inference")
    run_calls(warmup, 3, w)
    assert warmup.trial is not None and warmup.trial.turn is warmup   # mid-trial, holding the turn
    graph = CompiledGraph(costed_call(clock, fake_cuda_graphs, launch=(500e-6, 200e-6), replay=(30e-6, 210e-6)),
                          None, "", cuda_graphs="auto", kind="inference")
    run_calls(graph, 1 + 4, w)
    assert graph.trial.turn is None and not graph.trial.launched   # waited its 4 calls
    run_calls(graph, replay_choice.TRIAL_CALLS, w)
    (decision,) = replay_choice.DECISIONS
    assert decision.replay and graph.graphed is not None
