"""trial_turns.settle: a benchmark's compiled step runs until no trial of brrr's is timing or waiting."""

from brrr.compile.runtime import trial_turns
from brrr.compile.runtime.trial_turns import settle


class Owner:
    pass


def test_settle_runs_until_the_trial_holding_the_turn_and_the_one_waiting_have_decided():
    trial_turns.reset()
    first, second = Owner(), Owner()
    calls = []

    def step():
        calls.append(1)
        n = len(calls)
        if n == 1:
            assert trial_turns.begin(first) and not trial_turns.begin(second)   # second waits its turn
        for owner in (first, second):   # a trial's calls while it holds the turn
            trial_turns.touch(owner)
        if n == 30:
            trial_turns.end(first)
        if n == 31:
            assert trial_turns.begin(second)
        if n == 50:
            trial_turns.end(second)

    assert settle(step, at_least=3) == 50
    assert not trial_turns.pending()


def test_settle_stops_at_its_bound_when_a_trial_never_decides():
    trial_turns.reset()
    holder = Owner()
    assert trial_turns.begin(holder)
    assert settle(lambda: trial_turns.touch(holder), at_least=2, max_calls=7) == 7   # called, never deciding
    assert settle(lambda: None, at_least=2) == 2   # the holder no longer called: two quiet calls
    trial_turns.reset()
    assert settle(lambda: None, at_least=2) == 2


def test_settle_stops_once_the_only_graph_waiting_is_no_longer_called():
    trial_turns.reset()
    holder, gone = Owner(), Owner()
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 1:
            assert trial_turns.begin(holder) and not trial_turns.begin(gone)   # gone waits, then is never called
        trial_turns.touch(holder)
        if len(calls) == 10:
            trial_turns.end(holder)

    assert settle(step, at_least=3) == 11   # the call ending the holder's trial and one more are quiet
    assert trial_turns.pending() and not trial_turns.timing()
