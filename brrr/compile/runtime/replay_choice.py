"""Launch or replay: the choice `cuda_graphs="auto"` (the default) makes for each compiled graph by timing both
(codegen -> **runtime**).

A CUDA-graph replay (cuda_graphs.py) launches a whole graph at once, but it copies the inputs that moved in and the
outputs out, and keeps the graph's memory. It pays when the host, launching kernel after kernel, keeps the
GPU waiting; it costs when the GPU is the bottleneck. Which one holds depends on the host as much as on the
graph: the seed MLP's train step is host-bound on one H100 host and nearly balanced on another, and a Python
backward runs slower on autograd's device thread than the same code on the main thread. So brrr does not
guess: after the first call (which checks the kernels) a graph launches its kernels for SAMPLES calls, is
captured, replays for SAMPLES calls, and keeps replaying when its cheapest replayed call costs less than MARGIN
of its cheapest launched one (a busy host only ever adds time: on the lent H100 hosts one step of the same
program varies by up to 2x from call to call). The launched calls come first so that the trial never holds two
copies of the graph's memory: taking turns, a ResNet-18 training step's launched activations were allocated
beside the replayed graph's pool, and the run peaked at 1967 MiB against 1118 launched and 977 replayed
(benchmarks/NOTES.md, 2026-11-28).

It also keeps replaying a graph whose replays cost no more than its launches when launching keeps the host busy
for at least HOST_BOUND of the launched period: the GPU then waits on the host as soon as the host slows (other
processes, a data loader, Python's collector), and a replay does not. Qwen2-0.5B's training step launched on a
4.6% saving, its trial's best periods 33.8 ms launched against 32.2 replayed; timed in the zoo beside three other
workers it then took 43.4 ms a step launched against 33.2 replayed (benchmarks/NOTES.md, 2026-11-27).

What a call costs is the loop's period, not the call alone: from the call's start, with the GPU idle (the trial
synchronizes there), to the start of the graph's next call, once the GPU has finished all the work queued
since. That takes in what the host does between calls (autograd's engine, gradients allocated afresh, the
user's own code), which a replay lets overlap with the GPU's work and a launched graph does not. Timed as the
call alone (the larger of its host time and its CUDA-event time, summed over a forward and its backward),
BERT MLM's training step read 10.5 ms launched against 10.2 replayed, and launched; its loop then took 11.9-16.2
ms a step against 10.2-10.4 replayed (benchmarks/NOTES.md, 2026-11-26).

A training forward leads its backward: the backward can replay only while its forward's replay lends it the
saved tensors, so it launches and replays in step with the forward, times nothing, and takes the forward's
verdict; the forward's periods span whole steps, its backward included, whichever way that ran. A graph with no leader
(inference, a backward whose forward decided before it first ran) times its own periods. Graphs take turns
(trial_turns.py): a whole step's periods carry every other graph of the step, so a trial starts only when no
other graph's trial is timing, and its graph launches, untimed, until then.
A replay also costs memory: the graph's pool keeps the memory of everything the graph allocated. With
cuda_graphs="auto" a graph replays only if the highest peak of allocated memory read after its capture and its
replays is within MEMORY_MARGIN of the highest read after its launched calls, or for an inference graph within
SMALL_GROWTH of it where that is more (`within_allowance`; a replay allocates nothing: its
memory was allocated, and counted, when the capture ran). The peak is the process's, read at the end of each
step's last graph (a backward, or a graph leading none) and never reset (the user's statistics stay theirs):
with no reset the launched calls' reading bounds the launched step, as they run first, and a caller that resets
the peak every step makes each reading that step's. A graph turned down gives its memory back before the
deciding call launches: left to the next call, a ResNet-18 training step launched beside its replayed graph's
pool and peaked at 1699 MiB against 977 replayed (benchmarks/NOTES.md). An inference graph's replay returns
copies of its outputs, so the outputs are held twice (the graph's own and the copies) once it has captured: where
the memory allocated before the capture plus both would already exceed MEMORY_MARGIN of the launched calls'
peak, the graph launches without capturing (fp32 DistilBERT inference's trial peaked at 1277 MiB against 779
launched, its 500 MB of logits held twice, and replay was then refused). With cuda_graphs="fastest" time alone
decides. Under several ranks the time rule alone decides, as the ranks agree.
A graph planned at symbolic sizes has a CUDA graph per shape, and a trial per shape: a short sequence can be
host-bound where a long one is not. Every verdict is logged (`DECISIONS`), and `brrr explain` lists them.
In a process group of several ranks (DDP, FSDP2) the ranks agree on each verdict, by the slowest rank's periods
(among_ranks.py): a rank launching a graph another replays would wait for it at every collective.
"""

import time
from dataclasses import dataclass

import torch

from brrr.compile.runtime import among_ranks, trial_turns

SAMPLES = 5          # timed calls each way
TRIAL_CALLS = 1 + 1 + 2 * SAMPLES + 1   # the checking call, the capture, the timed calls each way, and the
                                        # call whose start ends the last period and takes the verdict
MARGIN = 0.95        # a replay must save 5%: less is within a host's noise, and replays hold memory ...
HOST_BOUND = 0.5     # ... unless launching holds the host this share of a launched period (a host at half the
                     # speed, as the lent hosts' steps vary, would then keep the GPU waiting)

MEMORY_MARGIN = 1.10   # with cuda_graphs="auto", a replay may raise the process's peak memory this much at most,
SMALL_GROWTH = 64 * 2**20   # or, for an inference graph, by this many bytes where that is more: its replay's output
                            # copies on a small graph, less than the CUDA context's own ~500 MiB. PoolFormer's mixer
                            # replayed in 105 us against 246 launched, refused for 12 MiB of copies over a 106 MiB
                            # peak (benchmarks/NOTES.md). A training step keeps the margin alone: its batch is sized
                            # to the memory it peaks at.
MEMORY = None          # a stand-in for the device's peak allocated bytes (tests)
ALLOCATED = None       # a stand-in for the device's allocated bytes now (tests)

DECISIONS = []       # Decision records, process-wide, in the order they were made


@dataclass(frozen=True)
class Decision:
    graph: str                 # inference | forward | backward
    replay: bool
    launch_s: float | None     # least period of a call launching the kernels
    replay_s: float | None     # least period of a call replaying the CUDA graph (None: it could not replay)
    reason: str
    sizes: tuple | None = None   # a graph planned at symbolic sizes decides per shape: this call's sizes
    host_s: float | None = None  # least host time of a launched period's calls (a forward's: with its backward)
    peaks: tuple | None = None   # the process's peak allocated bytes after the launched calls and after the replays

    def __str__(self):
        at = "" if self.sizes is None else f" at sizes {', '.join(map(str, self.sizes))}"
        if self.replay_s is None:
            return f"{self.graph} graph{at}: launches its kernels ({self.reason})"
        verb = "replays a CUDA graph" if self.replay else "launches its kernels"
        host = "" if self.host_s is None else f", the host busy {self.host_s * 1e6:.0f} us of a launched one"
        peaks = "" if self.peaks is None else \
            f"; peak memory {self.peaks[0] / 2**20:.0f} MiB launching, {self.peaks[1] / 2**20:.0f} MiB replaying"
        return (f"{self.graph} graph{at}: {verb} ({self.reason}: a call's period {self.launch_s * 1e6:.0f} us "
                f"launching, {self.replay_s * 1e6:.0f} us replaying{host}{peaks})")


def log(decision):
    DECISIONS.append(decision)
    del DECISIONS[:-1000]
    return decision


class ReplayTrial:
    """Runs a verified graph's next calls until a verdict (`replay` becomes True or False): SAMPLES launched
    calls, then the capture and SAMPLES replays, so the graph's memory is never held beside a launched call's
    (the least period each way discounts the first calls of a training loop, slower while the caching allocator
    grows). A graph the verdict turns down is dropped at once (compiled.py). `leader`: on a backward's
    trial, its forward's, which times the steps and decides for both. `run(call, graphed, args)` returns
    (outputs, whether they came from a replay). `label` (among_ranks.signature), given in a process group of
    several ranks: the name under which the ranks agree on this graph's verdict."""

    def __init__(self, kind, leader=None, sizes=None, label=None, memory_bound=True, release=None, owner=None):
        self.kind, self.leader, self.followers, self.sizes, self.label = kind, leader, [], sizes, label
        self.owner = owner       # whose turn this trial times in (trial_turns.py); None: it never waits
        self.turn = None         # the owner it began under, until it decides
        self.memory_bound = memory_bound   # whether a replay must keep the peak within MEMORY_MARGIN
        self.peaks = {False: None, True: None}   # launched? replayed? -> the highest peak read after such periods
        self.release = release   # called on a verdict to launch, before anything launches: drops the CUDA graph
        if leader is not None:
            leader.followers.append(self)
        self.launched, self.replayed = [], []   # periods, seconds
        self.hosts = []          # host seconds in the launched calls of each launched period
        self.host_open = 0.0     # ... of the period still running
        self.captured = False
        self.paused = 0.0   # seconds of the open period spent reading the peak
        self.replaying = False   # whether this call of the trial replays (a follower reads its leader's)
        self.replay = None
        self.open = None   # (start, replayed) of the call whose period is still running
        self.outputs = None   # an inference graph's launched outputs: (bytes of their buffers, bytes of them)

    def run(self, call, graphed, args):
        out = self._run(call, graphed, args)
        timing = self if self.leader is None else self.leader
        if timing.replay is None and (self.leader is not None or not self.followers):
            # the end of a step's last graph (a backward, or a graph leading none): the step's peak, read however
            # the caller resets the statistics between steps; the reading's time leaves the period
            started = time.perf_counter()
            timing._read_peak(timing.replaying)
            timing.paused += time.perf_counter() - started
        return out

    def _run(self, call, graphed, args):
        if self.leader is None and not self._has_turn():   # another graph's trial is timing whole steps
            return call(args), False
        if self.leader is None:
            refused = graphed.refused() if not (self.launched or self.open or self.captured) else None
            if refused:   # no launched call timed against a replay that can never be
                self._cannot_replay(refused)
                return call(args), False
            self._close_period()
            if len(self.launched) >= SAMPLES and len(self.replayed) >= SAMPLES:
                self._decide_by_periods()
                out = graphed(args) if self.replay else None
                return (out, True) if out is not None else (call(args), False)
            # every launched period first, before the capture: a graph's memory (a training step's activations
            # in its pool) is never held while launched calls allocate their own
            self.replaying = len(self.launched) >= SAMPLES
        else:
            self.replaying = self.leader.replaying   # in step with its forward
        if not self.replaying:
            if self.leader is None:
                self.open, self.paused, self.host_open = (time.perf_counter(), False), 0.0, 0.0
            started = time.perf_counter()
            out = call(args)
            timing = self if self.leader is None else self.leader
            timing.host_open += time.perf_counter() - started
            if self.kind == "inference":
                self.outputs = _output_bytes(out, args)
            return out, False
        if not self.captured:
            held = self._replay_holds_too_much()
            if held:
                self._decide(False, held)
                return call(args), False
            out = graphed(args)
            if out is None:   # capture failed, or an input read in place has moved
                self._cannot_replay(getattr(graphed, "failure", None))
                return call(args), False
            self.captured = True
            return out, True
        if self.leader is None:
            self.open, self.paused = (time.perf_counter(), True), 0.0
        out = graphed(args)
        if out is not None:
            return out, True
        if self.leader is None:   # an input read in place has moved: this graph cannot replay these inputs
            self.open = None
            self._cannot_replay(getattr(graphed, "failure", None))
        return call(args), False   # a follower out of step (its forward launched): the forward's periods see it

    def _has_turn(self):
        if self.owner is None or self.label is not None:   # ranks keep their trials in step among themselves
            return True
        if self.turn is not None:
            trial_turns.touch(self.turn)
            return True
        owner = trial_turns.owner_of(self.owner)
        if not trial_turns.begin(owner):
            return False
        self.turn = owner
        return True

    def _replay_holds_too_much(self):
        """Why an inference graph's capture would already raise the peak past MEMORY_MARGIN (its outputs held
        twice beside what is allocated now), or None."""
        if self.kind != "inference" or not self.memory_bound or self.label is not None or self.outputs is None \
                or not self.peaks[False]:   # no reading (no device memory statistics): nothing to judge by
            return None
        now = ALLOCATED() if ALLOCATED is not None else torch.cuda.memory_allocated()
        buffers, copies = self.outputs
        if within_allowance(now + buffers + copies, self.peaks[False], self.kind):
            return None
        return (f"not captured: a replay holds its outputs twice (the graph's and the copies returned), "
                f"{(now + buffers + copies) / 2**20:.0f} MiB at least against {self.peaks[False] / 2**20:.0f} MiB "
                f"launched, more than {MEMORY_MARGIN - 1:.0%} and {SMALL_GROWTH / 2**20:.0f} MiB over "
                f"(cuda_graphs=\"fastest\" replays anyway)")

    def _close_period(self):
        if self.open is None:
            return
        torch.cuda.synchronize()   # the period ends once the GPU has done everything queued since it began
        start, replayed = self.open
        (self.replayed if replayed else self.launched).append(time.perf_counter() - start - self.paused)
        if not replayed:
            self.hosts.append(self.host_open)
        self.open, self.host_open, self.paused = None, 0.0, 0.0

    def _read_peak(self, replayed):
        peak = _peak()
        self.peaks[replayed] = peak if self.peaks[replayed] is None else max(self.peaks[replayed], peak)

    def _cannot_replay(self, why=None):
        if self.leader is None and self.label is not None:   # the other ranks then launch it too
            among_ranks.agree(self.label, None, None)
        self._decide(False, why or "its CUDA graph could not capture or replay these inputs")

    def _decide_by_periods(self):
        launch_s, replay_s = min(self.launched), min(self.replayed)
        host_s = min(self.hosts) if self.hosts else None
        ranks = ""
        agreed = among_ranks.agree(self.label, launch_s, replay_s, host_s) if self.label is not None else None
        if self.label is not None and agreed is None:
            ranks = ", by this rank's periods alone: the other ranks did not answer for this graph"
        elif agreed is not None:
            launch_s, replay_s, world, host_s = agreed
            if replay_s is None:
                self._decide(False, f"a rank cannot capture or replay its CUDA graph: all {world} ranks launch")
                return
            ranks = f", the slowest of {world} ranks"
        faster = replay_s < MARGIN * launch_s
        host_bound = host_s is not None and replay_s <= launch_s and host_s >= HOST_BOUND * launch_s
        with_backward = " over whole steps with its backward" if self.followers else ""
        reason = ("faster replayed" if faster else "as fast replayed, and launching holds the host" if host_bound
                  else "not faster replayed") + with_backward + ranks
        peaks = (self.peaks[False], self.peaks[True]) if None not in self.peaks.values() else None
        costly = peaks is not None and not within_allowance(peaks[1], peaks[0], self.kind)
        # ranks decide by one rule and their periods alone: a rank launching where another replays waits on it
        if (faster or host_bound) and costly and self.memory_bound and self.label is None:
            small = f" and {SMALL_GROWTH / 2**20:.0f} MiB" if self.kind == "inference" else ""
            reason = (f"{reason}, but replaying raised the peak memory by more than "
                      f"{MEMORY_MARGIN - 1:.0%}{small} (cuda_graphs=\"fastest\" replays anyway)")
            self._decide(False, reason, launch_s, replay_s, host_s, peaks)
            return
        self._decide(faster or host_bound, reason, launch_s, replay_s, host_s, peaks)

    def _decide(self, replay, reason, launch_s=None, replay_s=None, host_s=None, peaks=None):
        self.replay = replay
        if self.turn is not None:
            trial_turns.end(self.turn)
            self.turn = None
        log(Decision(self.kind, replay, launch_s, replay_s, reason, self.sizes, host_s, peaks))
        if not replay and self.release is not None:
            self.release()   # before the deciding call launches: never a launched step beside the graph's memory
        for follower in self.followers:   # they replay only beside this graph's replays
            if follower.replay is None:
                follower._decide(replay, f"as its {self.kind} graph", launch_s, replay_s, host_s, peaks)


def within_allowance(new, old, kind):
    """Whether a replay peaking at `new` bytes is within what it may hold over `old` launched: MEMORY_MARGIN of it,
    or for an inference graph SMALL_GROWTH more where that is more."""
    return new <= max(MEMORY_MARGIN * old, old + (SMALL_GROWTH if kind == "inference" else 0))


def _output_bytes(out, args):
    """(bytes of the buffers behind `out`'s tensors, bytes of the tensors themselves), leaving out those over an
    input's memory (a replay returns those as they are)."""
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    buffers, copies = {}, 0
    for o in out if isinstance(out, (list, tuple)) else (out,):
        if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs:
            buffers[o.untyped_storage().data_ptr()] = o.untyped_storage().nbytes()
            copies += o.numel() * o.element_size()
    return sum(buffers.values()), copies


def _peak():
    """The process's peak allocated bytes on the current device so far, as the caller left the statistics."""
    return MEMORY() if MEMORY is not None else torch.cuda.max_memory_allocated()
