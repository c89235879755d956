"""Launch-or-replay verdicts agreed among data-parallel ranks (replay_choice's trial -> **here** -> its verdict).

Each process times its own graphs (replay_choice.py), and its host decides the times. Under DDP or FSDP2 a rank
that launches a graph while another replays it is out of step with it, and the faster one waits at the next
collective: on two H200s, GPT-2 under FSDP2 had rank 0 replay a forward and its backward while rank 1 launched
them, and rank 0 then spent 59.8 ms a step in NCCL kernels waiting (benchmarks/NOTES.md). So a trial in a
process group of several ranks publishes its periods in the group's key-value store, reads every rank's, and
each takes the verdict of the slowest: the largest replayed period against the largest launched one. A rank
whose graph cannot replay makes every rank launch.

No collective is used: a rank that runs a graph alone (an evaluation on rank 0) would hang in one. The store is
read with a timeout instead; when a peer does not answer in time, or answered for another graph, the rank keeps
its own verdict and says so. Keys name the graph (its kind, a digest of its generated code, its sizes) and count
that graph's verdicts, so graphs deciding in different orders on different ranks still meet.
"""

import hashlib
import json
import re
from datetime import timedelta

TIMEOUT_S = 10.0     # how long a rank waits for its peers' periods; the ranks of a data-parallel step are within
                     # a step of each other, a rank running a graph alone pays this once per graph and shape
_COUNTS = {}         # (graph label, rank) -> verdicts published for it by this process


def signature(kind, source, sizes=None):
    """A label the same on every rank for the same graph: its kind, a digest of its generated call (device
    ordinals removed) and the sizes of the shape deciding."""
    digest = hashlib.sha1(re.sub(r"cuda:\d+", "cuda", source).encode()).hexdigest()[:16]
    at = "" if sizes is None else "@" + ",".join(map(str, sizes))
    return f"{kind}:{digest}{at}"


def process_group():
    """(store, rank, world size) of the default process group when it has several ranks, else None."""
    try:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        from torch.distributed.distributed_c10d import _get_default_store
        return _get_default_store(), dist.get_rank(), dist.get_world_size()
    except Exception:   # a backend without a store, or a group torn down: decide alone
        return None


def agree(label, launch_s, replay_s, host_s=None, group=None, timeout_s=TIMEOUT_S):
    """Publish this rank's least periods for the graph `label` (replay_s None: it cannot replay) and the host
    time of its launched calls, and return (largest launched period, largest replayed period or None if some
    rank cannot replay, ranks, largest host time or None if some rank has none), or None when there is no
    group of several ranks or a peer did not answer for this graph within `timeout_s`."""
    group = group if group is not None else process_group()
    if group is None:
        return None
    store, rank, world = group
    count = _COUNTS.get((label, rank), 0)
    _COUNTS[label, rank] = count + 1
    prefix = f"brrr/replay/{label}/{count}/"
    store.set(prefix + str(rank), json.dumps({"label": label, "launch": launch_s, "replay": replay_s,
                                                   "host": host_s}))
    if replay_s is None:   # this rank launches whatever the others timed; they read that here
        return None
    launches, replays, hosts = [], [], []
    for peer in range(world):
        key = prefix + str(peer)
        try:
            store.wait([key], timedelta(seconds=timeout_s))
            got = json.loads(store.get(key))
        except Exception:   # timed out (a peer not running this graph now), or the store went away
            return None
        if got.get("label") != label:
            return None
        launches.append(got["launch"])
        replays.append(got["replay"])
        hosts.append(got.get("host"))
    replay_all = None if any(r is None for r in replays) else max(replays)
    host_all = None if any(h is None for h in hosts) else max(hosts)
    # launches: None from a rank that never timed launching
    return max(t for t in launches if t is not None), replay_all, world, host_all
