"""Distributed training over brrr-compiled models: two CPU processes with gloo (distributed_worker.py) train a
small transformer eagerly and compiled, and brrr's gradients, losses and updated parameters must be eager's.

DDP: Dynamo's DDPOptimizer splits the graph at bucket boundaries and compiles each piece, first running it on
fake tensors to get the next piece's inputs. FSDP2 (`fully_shard` per block and on the root): each block's
call is a graph break where FSDP's hooks all-gather and free parameters, and brrr compiles the pieces between.
"""

import socket

import pytest
import torch
import torch.distributed as dist

from tests.compile.helpers import rel_err
from tests.compile.workers import finish, start

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch built without gloo")

TIMEOUT_S = 240


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(kind, tmp_path, world=2):
    """Run `world` ranks of distributed_worker.py (killed at TIMEOUT_S) and return their results."""
    port = _free_port()
    procs = [start("distributed_worker", [kind, tmp_path], tmp_path / f"rank{rank}.log", RANK=str(rank),
                   WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   BRRR_CACHE_DIR=str(tmp_path / f"cache{rank}"))
             for rank in range(world)]
    finish(procs, TIMEOUT_S)
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(world)]


def assert_same_training(eager, brrr):
    for step, (a, b) in enumerate(zip(brrr["losses"], eager["losses"])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"loss at step {step}")
    for step, (got, ref) in enumerate(zip(brrr["grads"], eager["grads"])):
        assert got.keys() == ref.keys()
        for name in ref:
            assert rel_err(got[name], ref[name]) < 1e-5, f"grad of {name} at step {step}"
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"grad of {name} at step {step}: {m}")
    for name, ref in eager["params"].items():
        torch.testing.assert_close(brrr["params"][name], ref, rtol=1e-5, atol=1e-6, msg=f"{name} after training")


def assert_synchronized(ranks):
    """Both ranks hold the same gradients though each saw its own batches: the reduction happened."""
    for got, other in zip(ranks[0]["brrr"]["grads"], ranks[1]["brrr"]["grads"]):
        for name in got:
            torch.testing.assert_close(got[name], other[name], rtol=0, atol=0)
    assert not torch.equal(ranks[0]["brrr"]["losses"][0], ranks[1]["brrr"]["losses"][0])


def assert_brrr_ran(rank, min_graphs):
    assert len(rank["runtimes"]) >= min_graphs, rank["runtimes"]
    # every graph ran from brrr's lean runtime (so brrr's kernels, not AOTAutograd's fallback wrappers) ...
    assert set(rank["runtimes"]) == {"training"}, rank["runtimes"]
    # ... and every compiled step launched brrr's kernels (BRRR_DEBUG=1: a failing one raises, never runs ATen)
    assert all(n > 0 for n in rank["brrr"]["launches"]), rank["brrr"]["launches"]
    assert rank["eager"]["launches"] == [0] * len(rank["eager"]["launches"])


@pytest.mark.parametrize("kind", ["ddp", "ddp-bucket-view"])
def test_ddp_gradients_match_eager_ddp(kind, tmp_path):
    ranks = run_ranks(kind, tmp_path)
    # both ranks took the slowest rank's periods and the busiest host through the process group's store
    assert [rank["agreed"] for rank in ranks] == [(2e-3, 1.5e-3, 2, 8e-4)] * 2
    for rank in ranks:
        assert rank["brrr"]["sharded"] == []
        assert_same_training(rank["eager"], rank["brrr"])
        assert_brrr_ran(rank, min_graphs=2)   # DDPOptimizer split the model at its bucket boundary
    assert_synchronized(ranks)


def test_fsdp2_gradients_match_eager_fsdp2(tmp_path):
    ranks = run_ranks("fsdp2", tmp_path)
    for rank in ranks:
        assert rank["brrr"]["sharded"] == list(rank["brrr"]["params"])   # every parameter a DTensor shard
        assert_same_training(rank["eager"], rank["brrr"])
        assert_brrr_ran(rank, min_graphs=3)   # the input layer, a block (both share it), the head and loss
    assert_synchronized(ranks)
