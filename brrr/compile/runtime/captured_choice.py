"""Compiled or as captured (backend -> **runtime**): a Dynamo graph that brrr compiled is timed against the same
graph run as Dynamo captured it, eager's own ops, and the faster one runs from then on.

Why. brrr's trial (replay_choice.py) chooses between launching its kernels and replaying a CUDA graph of them,
and both can still lose to eager: a host-bound speech model's training step whose CUDA graph could not be
captured ran 1.2-1.3x slower than eager (the GPU busy for less time than under eager, the host for longer).
Timing the captured graph beside the compiled one makes "never slower than eager" a measurement, not a hope.

How. The compiled callable's first call checks and measures its kernels (floor.py). The next SAMPLES calls run
as captured, each a timed period; then the compiled callable runs alone for SETTLE_CALLS calls (its replay trial
decides), and SAMPLES more timed periods. A call's period runs from its start, the GPU idle, to the start of the
next call of this graph, as replay_choice.py times them (what runs between calls, a training step's backward
included, counts). The captured calls come before the compiled graph's CUDA graph exists, so the trial never holds
that graph's memory beside eager's activations. The captured graph is kept when its least period is under MARGIN
of the compiled one's. The trial starts on its turn (trial_turns.py), and the replay trial inside shares it. A
graph called at several input shapes decides per shape (MAX_SHAPES; past them a new shape runs compiled). Every
verdict is logged (`DECISIONS`); `brrr explain` lists them.

Memory. Eager's ops save what eager saves for the backward, often far more than brrr's forward (a DistilBERT amp
step's captured calls peaked at eager's 3198 MiB, the whole run at 1.31x Inductor's; benchmarks/NOTES.md). So
before a training graph's first captured call, both ways' held bytes are counted on fake tensors
(held_for_backward.py); where the memory allocated now plus eager's would exceed MEMORY_MARGIN (replay_choice.py)
of it plus brrr's, the graph runs compiled without the captured calls ever running. What eager frees as it goes
is not held, but its step's peak becomes the process's: GAT's captured calls set its whole run's peak at eager's
1212 MiB, where brrr's own calls had peaked at 974 (Inductor 854). So on a GPU eager's step, forward and
backward, also runs on those fake tensors counting the bytes alive at once, and where that would peak more than
MEMORY_MARGIN over what the process has peaked at so far (PEAK, brrr's first call included), the captured calls
never run either. With cuda_graphs="fastest" time alone decides.

BRRR_CAPTURED_TRIAL=0 turns this trial off (BRRR_FLOOR=0 turns it off with the floor): what times brrr's kernels
themselves, such as the layout acceptance's one-op graphs, needs it off. On such a graph the trial's periods are the
host's: group norm's backward, five kernels in 24 us of GPU time against eager's 62, took 169 us a call compiled
and 162 as captured (a Dynamo call's own host time in both), and eager's kernels were kept.

`CLOCK`, where set (tests), replaces the GPU's synchronization and the host's clock; `MEMORY` the device's
allocated bytes.
"""

import os
import time
from dataclasses import dataclass

import torch

from brrr.compile.runtime import trial_turns
from brrr.compile.runtime.held_for_backward import graph_constants, held_and_peak, held_bytes
from brrr.compile.runtime.replay_choice import MEMORY_MARGIN, TRIAL_CALLS

SAMPLES = 5
SETTLE_CALLS = TRIAL_CALLS   # compiled calls before its periods: its replay trial past its first call, one more
TRIAL_LENGTH = 1 + SAMPLES + SETTLE_CALLS + SAMPLES   # calls before the one that decides
MARGIN = 0.97        # the captured graph must save 3%: brrr's kernels are not given up on the host's noise
MAX_SHAPES = 8

CLOCK = None         # a stand-in with now() and sync() (tests)
MEMORY = None        # a stand-in for the device's allocated bytes now (tests)
PEAK = None          # a stand-in for the device's peak allocated bytes so far (tests)
DECISIONS = []


@dataclass(frozen=True)
class Decision:
    compiled_s: float | None   # None: decided by memory, nothing timed
    captured_s: float | None
    captured: bool
    shapes: tuple = ()
    held: tuple | None = None  # (allocated before the call, held by brrr's call, held by eager's), bytes
    peaks: tuple | None = None  # (eager's step would peak at, the process has peaked at), bytes

    def __str__(self):
        way = "runs as Dynamo captured it (eager's ops)" if self.captured else "runs compiled"
        at = f" at shapes {', '.join(map(str, self.shapes))}" if self.shapes else ""
        if self.captured_s is None and self.peaks is not None:
            eager, process = (b / 2**20 for b in self.peaks)
            return (f"graph{at} {way}, as captured not tried: eager's step would peak at {eager:.0f} MiB (its "
                    f"forward and backward counted on fake tensors) against the {process:.0f} MiB this process "
                    f"has peaked at (more than {MEMORY_MARGIN - 1:.0%} over)")
        if self.captured_s is None:
            now, brrr, eager = (b / 2**20 for b in self.held)
            return (f"graph{at} {way}, as captured not tried: eager's ops would hold {eager:.0f} MiB for the "
                    f"backward against brrr's {brrr:.0f} MiB, beside {now:.0f} MiB allocated (more than "
                    f"{MEMORY_MARGIN - 1:.0%} over)")
        return (f"graph{at} {way}: a call's period {self.compiled_s * 1e6:.0f} us compiled, "
                f"{self.captured_s * 1e6:.0f} us as captured")


class _Clock:
    def now(self):
        return time.perf_counter()

    def sync(self):
        torch.cuda.synchronize()


class _Trial:
    def __init__(self):
        self.calls = 0
        self.periods = {False: [], True: []}   # captured? -> seconds
        self.open = None                       # (start, captured) of the period still running
        self.verdict = None
        self.began = False                     # whether it holds its turn (trial_turns.py)


class CompiledOrCaptured:
    """Calls `compiled` or `captured` (the same graph, same arguments), whichever measured faster. `per_shape`:
    the graph has symbolic sizes, and each shape it is called at decides for itself. `memory_bound`: a training
    graph whose captured calls would hold more than MEMORY_MARGIN runs compiled untimed."""

    def __init__(self, compiled, captured, per_shape=False, memory_bound=True):
        self.compiled, self.captured, self.per_shape = compiled, captured, per_shape
        self.memory_bound = memory_bound
        self.trials = {}
        self.chosen = None   # a static graph's verdict: the callable that runs from then on

    def __getattr__(self, name):   # what callers read off the compiled callable (`_brrr_lean`, ...)
        return getattr(self.__dict__["compiled"], name)

    def __call__(self, *args):
        if self.chosen is not None:
            return self.chosen(*args)
        trial = self._trial(args)
        if trial is None:
            return self.compiled(*args)
        if trial.verdict is not None:
            return self.captured(*args) if trial.verdict else self.compiled(*args)
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return self.compiled(*args)   # nothing is timed inside a capture
        with trial_turns.calling(self):   # the replay trial of the compiled graph inside shares this one's turn
            return self._timed_call(trial, args)

    def _timed_call(self, trial, args):
        trial.calls += 1
        n = trial.calls
        if n == 1:
            return self.compiled(*args)   # the first call checks the kernels
        if n == 2 and not trial.began:
            if not trial_turns.begin(self):   # another graph's trial is timing whole steps: this call waits
                trial.calls = 1
                return self.compiled(*args)
            trial.began = True
        else:
            trial_turns.touch(self)
        settling = 1 + SAMPLES < n <= 1 + SAMPLES + SETTLE_CALLS
        if settling and trial.open is None:
            return self.compiled(*args)
        clock = CLOCK or _Clock()
        clock.sync()
        now = clock.now()
        if trial.open is not None:
            start, was_captured = trial.open
            trial.periods[was_captured].append(now - start)
            trial.open = None
        if n > TRIAL_LENGTH:
            return self._decide(trial, args)
        if settling:
            return self.compiled(*args)
        captured = n <= 1 + SAMPLES
        if n == 2 and self.memory_bound and self._holds_too_much(args):
            trial.verdict = False
            trial_turns.end(self)
            if not self.per_shape:
                self.chosen = self.compiled
            return self.compiled(*args)
        trial.open = (now, captured)
        return self.captured(*args) if captured else self.compiled(*args)

    def _holds_too_much(self, args):
        """Whether eager's ops, on `args`, would hold more for the backward than MEMORY_MARGIN allows beside
        brrr's call (logged as the verdict when so). Only a training call (grad on, an input needing it) of a
        compiled callable that can run on fake tensors (brrr's lean training runtime) is counted."""
        if getattr(self.compiled, "_brrr_lean", None) != "training" or not torch.is_grad_enabled() or \
                not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return False
        peaked = PEAK() if PEAK is not None else _peaked(args)   # brrr's first call included; None off CUDA
        constants = graph_constants(self.captured)
        counted = held_and_peak(self.captured, args, constants) if peaked is not None else None
        if counted is None:   # off CUDA, or the backward cannot run on fake tensors: the held bytes alone
            counted = (held_bytes(self.captured, args, constants), None)
        eager, step = counted
        brrr = held_bytes(self.compiled, args) if eager is not None else None
        if eager is None or brrr is None:
            return False
        now = MEMORY() if MEMORY is not None else _allocated(args)
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)) if self.per_shape else ()
        if now + eager > MEMORY_MARGIN * (now + brrr):
            DECISIONS.append(Decision(None, None, False, shapes, (now, brrr, eager)))
            del DECISIONS[:-1000]
            return True
        # what eager's ops free as they go is not held, but their step's peak is the process's from then on
        if step is None:
            return False
        process = max(peaked, now + brrr)
        if now + step <= MEMORY_MARGIN * process:
            return False
        DECISIONS.append(Decision(None, None, False, shapes, (now, brrr, eager), (now + step, process)))
        del DECISIONS[:-1000]
        return True

    def _trial(self, args):
        key = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)) if self.per_shape else ()
        trial = self.trials.get(key)
        if trial is None and len(self.trials) < MAX_SHAPES:
            trial = self.trials[key] = _Trial()
        return trial

    def _decide(self, trial, args):
        compiled_s, captured_s = min(trial.periods[False]), min(trial.periods[True])
        trial.verdict = captured_s < MARGIN * compiled_s
        trial_turns.end(self)
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)) if self.per_shape else ()
        DECISIONS.append(Decision(compiled_s, captured_s, trial.verdict, shapes))
        del DECISIONS[:-1000]
        chosen = self.captured if trial.verdict else self.compiled
        if not self.per_shape:
            self.chosen = chosen
        return chosen(*args)


def _cuda_device(args):
    return next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)


def _peaked(args):
    """The device's peak allocated bytes so far, or None off CUDA (nothing to weigh a step's peak against)."""
    device = _cuda_device(args)
    return torch.cuda.max_memory_allocated(device) if device is not None else None


def _allocated(args):
    device = _cuda_device(args)
    return torch.cuda.memory_allocated(device) if device is not None else 0


def enabled(devices):
    if os.environ.get("BRRR_FLOOR") == "0" or os.environ.get("BRRR_CAPTURED_TRIAL") == "0":
        return False
    return CLOCK is not None or ("cuda" in devices and torch.cuda.is_available())
