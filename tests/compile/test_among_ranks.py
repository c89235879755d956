"""Launch-or-replay verdicts agreed among ranks through the process group's store (among_ranks.py), and the
trial that takes them (replay_choice.py). Ranks are threads sharing one in-memory store here."""

import threading
import time

import pytest
import torch.distributed as dist

from brrr.compile.runtime import among_ranks, replay_choice
from brrr.compile.runtime.replay_choice import ReplayTrial


def _in_ranks(*calls):
    """Run calls[r]() as rank r, each in its own thread; their results, by rank."""
    results = [None] * len(calls)

    def run(r):
        results[r] = calls[r]()
    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def test_every_rank_takes_the_slowest_ranks_periods():
    store = dist.HashStore()
    got = _in_ranks(lambda: among_ranks.agree("forward:a", 2.0e-3, 1.5e-3, 1.9e-3, group=(store, 0, 2)),
                    lambda: among_ranks.agree("forward:a", 3.0e-3, 2.9e-3, 0.5e-3, group=(store, 1, 2)))
    assert got == [(3.0e-3, 2.9e-3, 2, 1.9e-3), (3.0e-3, 2.9e-3, 2, 1.9e-3)]   # the busiest host too


def test_a_rank_that_cannot_replay_makes_every_rank_launch():
    store = dist.HashStore()
    got = _in_ranks(lambda: among_ranks.agree("forward:b", 2.0e-3, None, group=(store, 0, 2)),
                    lambda: among_ranks.agree("forward:b", 2.0e-3, 1.0e-3, group=(store, 1, 2)))
    assert got[0] is None                     # it launches anyway
    assert got[1] == (2.0e-3, None, 2, None)  # the other learns that some rank cannot replay


def test_a_peer_that_never_answers_leaves_the_rank_its_own_verdict():
    store = dist.HashStore()
    start = time.perf_counter()
    assert among_ranks.agree("forward:c", 2.0e-3, 1.0e-3, group=(store, 0, 2), timeout_s=0.2) is None
    assert time.perf_counter() - start < 5


def test_each_verdict_of_a_graph_meets_its_own_keys():
    """A graph deciding again (a new shape, a new trial) never reads the periods of its earlier verdict."""
    store = dist.HashStore()
    first = _in_ranks(lambda: among_ranks.agree("inference:d", 1.0, 0.5, group=(store, 0, 2)),
                      lambda: among_ranks.agree("inference:d", 1.0, 0.5, group=(store, 1, 2)))
    second = _in_ranks(lambda: among_ranks.agree("inference:d", 1.0, 2.0, group=(store, 0, 2)),
                       lambda: among_ranks.agree("inference:d", 3.0, 0.5, group=(store, 1, 2)))
    assert first == [(1.0, 0.5, 2, None)] * 2 and second == [(3.0, 2.0, 2, None)] * 2


def test_labels_name_the_graph_not_the_device():
    src = "def call(args):\n    x = empty_strided((4,), (1,), device='cuda:1')\n"
    assert among_ranks.signature("forward", src) == among_ranks.signature("forward", src.replace("cuda:1", "cuda:0"))
    assert among_ranks.signature("forward", src) != among_ranks.signature("backward", src)
    assert among_ranks.signature("forward", src, (8, 128)) != among_ranks.signature("forward", src, (8, 256))


def test_no_process_group_means_no_agreement():
    assert not dist.is_initialized()
    assert among_ranks.process_group() is None
    assert among_ranks.agree("forward:e", 1.0, 0.5) is None


@pytest.mark.parametrize("own,slowest,replays", [((2.0, 1.0), (2.0, 1.0), True), ((2.0, 1.0), (2.0, 1.95), False),
                                                 ((2.0, 1.0), (2.0, None), False)])
def test_the_trial_decides_by_the_slowest_rank(monkeypatch, own, slowest, replays):
    """Rank 0 alone would replay (1.0 against 2.0); the ranks' slowest periods decide instead."""
    seen = []

    def agree(label, launch_s, replay_s, host_s=None):
        seen.append((label, launch_s, replay_s))
        return (*slowest, 2, None)
    monkeypatch.setattr(among_ranks, "agree", agree)
    trial = ReplayTrial("forward", label="forward:f")
    trial.launched, trial.replayed = [own[0], own[0] * 1.1], [own[1], own[1] * 1.1]
    trial._decide_by_periods()
    assert seen == [("forward:f", own[0], own[1])]
    assert trial.replay is replays
    decision = replay_choice.DECISIONS[-1]
    assert "2 ranks" in decision.reason, decision
    if slowest[1] is not None:
        assert (decision.launch_s, decision.replay_s) == slowest


def test_a_trial_that_cannot_capture_tells_the_other_ranks(monkeypatch):
    seen = []
    monkeypatch.setattr(among_ranks, "agree", lambda label, launch_s, replay_s, host_s=None: seen.append(replay_s))
    trial = ReplayTrial("forward", label="forward:g")
    trial.launched = [1.0] * replay_choice.SAMPLES   # the launched calls done: the capture comes next, and fails
    out, replayed = trial.run(lambda args: "launched", lambda args: None, [])
    assert (out, replayed, trial.replay) == ("launched", False, False)
    assert seen == [None]


def test_a_trial_whose_peers_do_not_answer_says_it_decided_alone(monkeypatch):
    monkeypatch.setattr(among_ranks, "agree", lambda label, launch_s, replay_s, host_s=None: None)
    trial = ReplayTrial("inference", label="inference:h")
    trial.launched, trial.replayed = [2.0], [1.0]
    trial._decide_by_periods()
    assert trial.replay is True
    assert "did not answer" in replay_choice.DECISIONS[-1].reason
