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


QUIET_CALLS = 2   # calls in a row with no trial timing (or none of the holder's) after which the trials left
                  # belong to graphs no longer called


def settle(step, at_least=TRIAL_CALLS, max_calls=MAX_CALLS, max_s=MAX_S):
    """Call `step` `at_least` times, then while a trial is timing or waiting, up to `max_calls` calls in all or
    `max_s` seconds; the number of calls made. A waiting graph begins its trial on its first call once the turn
    is free, and a holder's trial advances with each of its calls: QUIET_CALLS calls in a row with neither mean
    the graphs left waiting or holding the turn are not called any more."""
    start, calls, quiet = time.perf_counter(), 0, 0
    while calls < at_least or (trial_turns.pending() and quiet < QUIET_CALLS and calls < max_calls
                               and time.perf_counter() - start < max_s):
        before = trial_turns.progress()
        step()
        calls += 1
        quiet = 0 if trial_turns.timing() and trial_turns.progress() != before else quiet + 1
    return calls
