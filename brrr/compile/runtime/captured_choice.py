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
of the compiled one's. A graph called at several input shapes decides per shape (MAX_SHAPES; past them a new
shape runs compiled). Every verdict is logged (`DECISIONS`); `brrr explain` lists them.

`CLOCK`, where set (tests), replaces the GPU's synchronization and the host's clock.
"""

import os
import time
from dataclasses import dataclass

import torch

from brrr.compile.runtime.replay_choice import TRIAL_CALLS

SAMPLES = 5
SETTLE_CALLS = TRIAL_CALLS   # compiled calls before its periods: its replay trial past its first call, one more
TRIAL_LENGTH = 1 + SAMPLES + SETTLE_CALLS + SAMPLES   # calls before the one that decides
MARGIN = 0.97        # the captured graph must save 3%: brrr's kernels are not given up on the host's noise
MAX_SHAPES = 8

CLOCK = None         # a stand-in with now() and sync() (tests)
DECISIONS = []


@dataclass(frozen=True)
class Decision:
    compiled_s: float
    captured_s: float
    captured: bool
    shapes: tuple = ()

    def __str__(self):
        way = "runs as Dynamo captured it (eager's ops)" if self.captured else "runs compiled"
        at = f" at shapes {', '.join(map(str, self.shapes))}" if self.shapes else ""
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


class CompiledOrCaptured:
    """Calls `compiled` or `captured` (the same graph, same arguments), whichever measured faster. `per_shape`:
    the graph has symbolic sizes, and each shape it is called at decides for itself."""

    def __init__(self, compiled, captured, per_shape=False):
        self.compiled, self.captured, self.per_shape = compiled, captured, per_shape
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
        trial.calls += 1
        n = trial.calls
        if n == 1 or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            return self.compiled(*args)   # the first call checks the kernels; nothing is timed inside a capture
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
        trial.open = (now, captured)
        return self.captured(*args) if captured else self.compiled(*args)

    def _trial(self, args):
        key = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)) if self.per_shape else ()
        trial = self.trials.get(key)
        if trial is None and len(self.trials) < MAX_SHAPES:
            trial = self.trials[key] = _Trial()
        return trial

    def _decide(self, trial, args):
        compiled_s, captured_s = min(trial.periods[False]), min(trial.periods[True])
        trial.verdict = captured_s < MARGIN * compiled_s
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)) if self.per_shape else ()
        DECISIONS.append(Decision(compiled_s, captured_s, trial.verdict, shapes))
        del DECISIONS[:-1000]
        chosen = self.captured if trial.verdict else self.compiled
        if not self.per_shape:
            self.chosen = chosen
        return chosen(*args)


def enabled(devices):
    if os.environ.get("BRRR_FLOOR") == "0":
        return False
    return CLOCK is not None or ("cuda" in devices and torch.cuda.is_available())
