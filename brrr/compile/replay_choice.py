"""Launch or replay: the choice `cuda_graphs="auto"` (the default) makes for each compiled graph by timing both
(codegen -> **runtime**).

A CUDA-graph replay (graphs.py) launches a whole graph at once, but it copies the inputs that moved in and the
outputs out, and keeps the graph's memory. It pays when the host, launching kernel after kernel, keeps the
GPU waiting; it costs when the GPU is the bottleneck. Which one holds depends on the host as much as on the
graph: the seed MLP's train step is host-bound on one H100 host and nearly balanced on another, and a Python
backward runs slower on autograd's device thread than the same code on the main thread. So brrr does not
guess: after the first call (which checks the kernels) a graph is captured, then launches its kernels and
replays in turn, SAMPLES calls each way, each timed on the host (perf_counter) and on the device (CUDA events
on the current stream, which include any wait for the host). A call costs the larger of
the two, and each way is judged by its cheapest call (a busy host only ever adds time: on the lent H100 hosts
one step of the same program varies by up to 2x from call to call). The graph keeps replaying only when its
cheapest replay costs less than MARGIN of its cheapest launch.

A training forward and its backward decide together. The backward can replay only while its forward's replay
lends it the saved tensors, so its replays are timed only then, and "forward launches, backward replays" is no
option: with the forward launching, the backward launches too, holding its graph's memory for nothing. Decided
apart, a forward whose two ways tie (BERT-MLM's, 4.65 against 4.63 ms) launched and took its backward's
2.5 ms saving down with it (15.5 ms a step against 10.4 with both replayed). So the forward waits, replaying,
for its backward's samples, and the pair takes the cheapest of: both launch, the forward replays, both replay,
each step towards more replays taken only when it saves MARGIN.
Every verdict is logged (`DECISIONS`), and `brrr explain` lists them.
"""

import time
from dataclasses import dataclass

import torch

SAMPLES = 5                        # timed calls each way
TRIAL_CALLS = 1 + 1 + 2 * SAMPLES   # the checking call, the capture, then launches and replays in turn
MARGIN = 0.95        # a replay must save 5%: less is within a host's noise, and replays hold memory
PATIENCE = 2 * SAMPLES   # calls a forward waits for its backward's samples before deciding alone

DECISIONS = []       # Decision records, process-wide, in the order they were made


@dataclass(frozen=True)
class Decision:
    graph: str                 # inference | forward | backward
    replay: bool
    launch_s: float | None     # least cost of a call launching the kernels
    replay_s: float | None     # least cost of a call replaying the CUDA graph (None: it could not replay)
    reason: str
    pair: str = ""             # decided with its forward or backward: the pair's costs each way

    def __str__(self):
        if self.replay_s is None:
            return f"{self.graph} graph: launches its kernels ({self.reason})"
        verb = "replays a CUDA graph" if self.replay else "launches its kernels"
        pair = f"; {self.pair}" if self.pair else ""
        return (f"{self.graph} graph: {verb} (launching {self.launch_s * 1e6:.0f} us per call, replaying "
                f"{self.replay_s * 1e6:.0f} us{pair})")


def log(decision):
    DECISIONS.append(decision)
    del DECISIONS[:-1000]
    return decision


class Sample:
    """One call timed on the host and, through two events, on the device."""

    def __init__(self):
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.start.record()
        self.t0 = time.perf_counter()

    def stop(self):
        self.host_s = time.perf_counter() - self.t0
        self.end.record()

    def cost_s(self):
        """Host or device time, whichever the call was bound by (the events are complete by now)."""
        return max(self.host_s, self.start.elapsed_time(self.end) / 1e3)


def least_cost(samples):
    samples[-1].end.synchronize()   # events on one stream complete in order: the others are done too
    return min(s.cost_s() for s in samples)


class ReplayTrial:
    """Runs a verified graph's next calls until a verdict (`replay` becomes True or False): the capture, then
    launches and replays in turn, so both ways see the same host and allocator (the first calls of a training
    loop still grow the caching allocator, which slows whichever way runs then). A forward and its backward
    take their turns in step: a backward replays only while its forward's replay lent it the saved tensors.
    `partner`: on a backward's trial, its forward's, which then waits for this one to decide for both.
    `run(call, graphed, args)` returns (outputs, whether they came from a replay)."""

    def __init__(self, kind, partner=None):
        self.kind, self.partner, self.waits = kind, partner, False
        if partner is not None:
            partner.waits = True
        self.launched, self.replayed = [], []
        self.captured = False
        self.replay = None
        self.launch_s = self.replay_s = None   # least costs, once sampled
        self.waited = 0

    def run(self, call, graphed, args):
        if self.replay_s is not None:   # sampled, waiting for the backward's verdict: replay meanwhile
            out = graphed(args)
            self.waited += 1
            if out is None or self.waited >= PATIENCE:
                self.decide_alone()
            return (out, True) if out is not None else (call(args), False)
        if self.captured and len(self.launched) <= len(self.replayed):
            sample = Sample()
            out = call(args)
            sample.stop()
            self.launched.append(sample)
            return out, False
        sample = Sample() if self.captured else None   # the capturing call is not a replay's cost
        out = graphed(args)
        if out is None:   # capture failed, or an input read in place has moved
            self._decide(False, "its CUDA graph could not capture or replay these inputs")
            if self.partner is not None and self.partner.replay is None and self.partner.replay_s is not None:
                self.partner.decide_alone()
            return call(args), False
        if sample is None:
            self.captured = True
            return out, True
        sample.stop()
        self.replayed.append(sample)
        if len(self.replayed) == SAMPLES:
            self.launch_s, self.replay_s = least_cost(self.launched), least_cost(self.replayed)
            forward = self.partner
            if forward is not None and forward.replay is None and forward.replay_s is not None:
                self.decide_pair(forward)
            elif not self.waits:
                self.decide_alone()
        return out, True

    def decide_alone(self):
        wins = self.replay_s < MARGIN * self.launch_s
        self._decide(wins, "faster replayed" if wins else "not faster replayed", self.launch_s, self.replay_s)

    def decide_pair(self, forward):
        """This backward's verdict and its forward's, from the pair's costs (see the module docstring)."""
        ways = [(False, False, forward.launch_s + self.launch_s), (True, False, forward.replay_s + self.launch_s),
                (True, True, forward.replay_s + self.replay_s)]
        chosen = ways[0]
        for way in ways[1:]:
            if way[2] < MARGIN * chosen[2]:
                chosen = way
        costs = (f"the pair costs {ways[0][2] * 1e6:.0f} us launched, {ways[1][2] * 1e6:.0f} with the forward "
                 f"replayed, {ways[2][2] * 1e6:.0f} both replayed")
        forward._decide(chosen[0], "decided with its backward", forward.launch_s, forward.replay_s, costs)
        self._decide(chosen[1], "decided with its forward", self.launch_s, self.replay_s, costs)

    def _decide(self, replay, reason, launch_s=None, replay_s=None, pair=""):
        self.replay = replay
        log(Decision(self.kind, replay, launch_s, replay_s, reason, pair))
