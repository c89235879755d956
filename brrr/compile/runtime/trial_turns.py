"""One trial at a time (runtime): which graph may time whole steps now.

Why. A trial (replay_choice.py: launched against replayed; captured_choice.py: compiled against as captured)
times a call's *period*, the whole step between two calls of its graph, so every other graph of the step is in
each sample. Run side by side, one graph's samples each way saw the others in different states: Whisper's
training step has a graph whose captured trial was skipped (memory) beside graphs running theirs, so its
launched periods were timed while the others ran eager's ops and its replayed ones while they launched and
captured. Its big graphs read 46.6 ms a step launched against 50.1 replayed and launched; in the next compile,
in the same process, 45.3 against 41.4 and replayed, and the step took 43.9 ms against 40.3 (H200,
benchmarks/NOTES.md). So trials take turns: a trial starts timing only when no other graph's trial is timing,
and until then its graph runs as it would untried (compiled, launching), every step the same.

The turn belongs to an *owner*: a compiled graph (all its places and shapes trial in step, as recordings.py
says), or the Dynamo graph's compiled-or-captured wrapper while its trial runs, so that the replay trial its
compiled graph runs inside it shares its turn (`calling`). A backward follows its forward's trial and never
asks. The turn goes back when the owner's last started trial decides; an owner that stops being called (a
graph run once, in a warm-up) loses it after MAX_WAIT calls of another graph waiting with no call of the
holder between them.

`timing()` and `pending()` say whether a trial is timing, or timing or waiting; `settle(step)` calls a step until
neither holds, so that a benchmark (brrr.bench, the sweep, `analyze --verify`) times the steady state.
"""

import contextlib
import threading
import time
import weakref

MAX_WAIT = 512  # a waiting graph's calls, none of the holder's between them, before the holder is taken as gone:
                # one layer graph a step's 80 layers call (a graph break before each) waits 80 calls a step

_state = {"holder": None, "active": 0, "holder_calls": 0}
_waits = weakref.WeakKeyDictionary()      # waiting owner -> (holder_calls seen, its calls since then)
_calls = threading.local()                # .owners: the owners whose calls run on this thread, innermost last


def _holder():
    ref = _state["holder"]
    return ref() if ref is not None else None


def owner_of(own):
    """The owner a trial asks for its turn with: the wrapper whose call is running (its replay trial inside
    shares the wrapper's turn), else `own`."""
    owners = getattr(_calls, "owners", None)
    return owners[-1] if owners else own


@contextlib.contextmanager
def calling(owner):
    """Calls inside run under `owner`'s turn (captured_choice.py's wrapper around its compiled graph)."""
    owners = _calls.__dict__.setdefault("owners", [])
    owners.append(owner)
    try:
        yield
    finally:
        owners.pop()


def begin(owner):
    """Whether `owner` may start a trial now; if so it holds the turn until each trial it began has `end`ed."""
    holder = _holder()
    if holder is owner:
        _state["holder_calls"] += 1
        _state["active"] += 1
        _waits.pop(owner, None)
        return True
    if holder is not None and not _gone(owner):
        return False
    _state.update(holder=weakref.ref(owner), active=1, holder_calls=0)
    _waits.pop(owner, None)
    return True


def touch(owner):
    """A call of `owner`'s whose trial is timing: the holder is still being called."""
    if _holder() is owner:
        _state["holder_calls"] += 1


def end(owner):
    """One trial `owner` began has decided; the turn is free once none is left."""
    if _holder() is owner:
        _state["active"] -= 1
        if _state["active"] <= 0:
            _state.update(holder=None, active=0)


def _gone(owner):
    seen, waited = _waits.get(owner, (None, 0))
    if seen != _state["holder_calls"]:
        seen, waited = _state["holder_calls"], 0
    _waits[owner] = (seen, waited + 1)
    return waited + 1 > MAX_WAIT


def timing():
    """Whether a trial holds the turn."""
    return _holder() is not None


def progress():
    """What changes with each call of the holder's trials: (the holder, its calls since it took the turn)."""
    return id(_holder()), _state["holder_calls"]


def pending():
    """Whether a trial is timing, or a graph waits for its turn (one may have stopped being called: a waiter
    begins on its first call once the turn is free)."""
    return _holder() is not None or len(_waits) > 0


def reset():
    """Forget every turn (tests; a process that drops its compiled graphs mid-trial frees them by itself)."""
    _state.update(holder=None, active=0, holder_calls=0)
    _waits.clear()
    _calls.__dict__.pop("owners", None)


MAX_CALLS = 2000
MAX_S = 120.0
QUIET_CALLS = 2   # calls in a row with no trial timing (or none of the holder's) after which the trials left
                  # belong to graphs no longer called


def settle(step, at_least=0, max_calls=MAX_CALLS, max_s=MAX_S):
    """Call `step` `at_least` times (a caller whose graphs may not have begun their trials yet passes one
    graph's, replay_choice.TRIAL_CALLS), then while a trial is timing or waiting, up to `max_calls` calls in all
    or `max_s` seconds; the number of calls made. A waiting graph begins its trial on its first call once the
    turn is free, and a holder's trial advances with each of its calls: QUIET_CALLS calls in a row with neither
    mean the graphs left waiting or holding the turn are not called any more."""
    start, calls, quiet = time.perf_counter(), 0, 0
    while calls < at_least or (pending() and quiet < QUIET_CALLS and calls < max_calls
                               and time.perf_counter() - start < max_s):
        before = progress()
        step()
        calls += 1
        quiet = 0 if timing() and progress() != before else quiet + 1
    return calls
