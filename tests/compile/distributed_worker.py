"""One rank of the distributed tests (test_distributed.py starts two): a few training steps of a small
transformer under DDP or FSDP2, eagerly and compiled by brrr, on CPU with gloo; saves what the test compares.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=... python -m tests.compile.distributed_worker ddp OUT_DIR

Writes OUT_DIR/rank<RANK>.pt: per run ("eager", "brrr") the loss and every parameter's full gradient at each
step and the parameters after the last one; which runtime brrr returned for each graph Dynamo handed it; how
many brrr kernels each compiled step launched; and a launch-or-replay agreement made through the group's store.
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported anywhere
os.environ["BRRR_DEBUG"] = "1"         # a failure inside brrr raises instead of quietly running ATen

import datetime  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from brrr.compile.runtime import among_ranks  # noqa: E402
from brrr.compile.runtime.launch import Launcher  # noqa: E402
from tests.compile.helpers import Recording  # noqa: E402

STEPS = 2
DIM, HEADS, CLASSES = 128, 4, 8   # two blocks of dim 128 hold ~1.6 MB of fp32 parameters: two DDP buckets of 1 MiB


class Block(nn.Module):
    """Pre-norm transformer block: causal attention and a GELU MLP, each behind a LayerNorm and a residual."""

    def __init__(self):
        super().__init__()
        self.norm1, self.qkv, self.proj = nn.LayerNorm(DIM), nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.norm2, self.fc1, self.fc2 = nn.LayerNorm(DIM), nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, h):
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.fc2(F.gelu(self.fc1(self.norm2(h))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, CLASSES)

    def forward(self, x, target):
        # no loop over the blocks: under FSDP2 each block's call is a graph break (its hooks run eagerly), and
        # Dynamo skips a whole frame that breaks inside a loop, which would leave the root's layers uncompiled
        h = self.inp(x)
        h = self.blocks[0](h)
        h = self.blocks[1](h)
        return F.cross_entropy(self.head(self.norm(h)).flatten(0, 1), target.flatten())


class LaunchCount:
    """Counts brrr's kernel launches (every generated kernel goes through a Launcher)."""

    def __init__(self):
        self.n = 0
        launch, count = Launcher.__call__, self

        def counted(launcher, *args):
            count.n += 1
            return launch(launcher, *args)

        Launcher.__call__ = counted


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def wrap(model, kind):
    if kind in ("ddp", "ddp-bucket-view"):
        from torch.nn.parallel import DistributedDataParallel
        # 1 MiB buckets (the size of DDP's and DDPOptimizer's first bucket): the graph splits in two; with
        # bucket views, each .grad is DDP's bucket memory that the compiled backward's gradients are copied into
        return DistributedDataParallel(model, bucket_cap_mb=1, gradient_as_bucket_view=kind == "ddp-bucket-view")
    assert kind == "fsdp2", kind
    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def train(kind, backend, launches):
    torch.manual_seed(0)
    model = Net()
    wrapped = wrap(model, kind)
    step_fn = torch.compile(wrapped, backend=backend, dynamic=False) if backend is not None else wrapped
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(1 + dist.get_rank())   # each rank its own batches
    out = {"losses": [], "grads": [], "launches": []}
    for _ in range(STEPS):
        x, target = torch.randn(2, 4, 16, generator=data), torch.randint(0, CLASSES, (2, 4), generator=data)
        before = launches.n
        opt.zero_grad(set_to_none=True)
        loss = step_fn(x, target)
        loss.backward()
        out["launches"].append(launches.n - before)
        out["losses"].append(loss.detach().clone())
        out["grads"].append({n: full(p.grad).clone() for n, p in model.named_parameters()})
        opt.step()
    out["params"] = {n: full(p.detach()).clone() for n, p in model.named_parameters()}
    out["sharded"] = [n for n, p in model.named_parameters() if hasattr(p, "full_tensor")]
    return out


def main(kind, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    launches, recording = LaunchCount(), Recording()
    result = {"eager": train(kind, None, launches), "brrr": train(kind, recording, launches),
              "runtimes": recording.runtimes}
    # launch or replay agreed through the group's own store: each rank's periods and host time, the slowest's
    rank = dist.get_rank()
    result["agreed"] = among_ranks.agree("forward:test", 1e-3 * (rank + 1), 5e-4 * (rank + 2), 4e-4 * (2 - rank))
    torch.save(result, os.path.join(out_dir, f"rank{dist.get_rank()}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
