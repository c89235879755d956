"""The calls a compiled step makes before it is timed: until brrr's graphs have decided how to run.

Each graph's trials (replay_choice.py, captured_choice.py) take turns (runtime/trial_turns.py), so a step of
several graphs decides over more calls than one graph's trial: the steady state starts once no trial is timing
or waiting, which `settle` runs to, within a bound.
"""

import time

from brrr.compile.runtime import trial_turns
from brrr.compile.runtime.replay_choice import TRIAL_CALLS

MAX_CALLS = 2000
MAX_S = 120.0


QUIET_CALLS = 2   # calls with no trial timing after which a graph still waiting is one no longer called


def settle(step, at_least=TRIAL_CALLS, max_calls=MAX_CALLS, max_s=MAX_S):
    """Call `step` `at_least` times, then while a trial is timing or waiting, up to `max_calls` calls in all or
    `max_s` seconds; the number of calls made. A waiting graph begins its trial on its first call once the turn
    is free, so waiting with no trial timing for QUIET_CALLS calls means the waiter is not called any more."""
    start, calls, quiet = time.perf_counter(), 0, 0
    while calls < at_least or (trial_turns.pending() and quiet < QUIET_CALLS and calls < max_calls
                               and time.perf_counter() - start < max_s):
        step()
        calls += 1
        quiet = 0 if trial_turns.timing() else quiet + 1
    return calls
