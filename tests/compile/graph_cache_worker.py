"""A process compiling a training step with brrr against graph and AOT caches other processes use too
(test_graph_cache.py).

    BRRR_CACHE_DIR=DIR python -m tests.compile.graph_cache_worker MODE OUT_DIR

MODE
  run    compiles and runs `Block`'s training step, then its inference; saves the loss, the gradients, the
         inference's output, the graph and AOT caches' counters and how often AOTAutograd traced to
         OUT_DIR/<pid>.pt.
  race   waits for OUT_DIR/go, then does what `run` does (two at once write the same entries).
  pause  does what `run` does, holding its first graph entry's write between the temporary file and the rename
         (after touching OUT_DIR/paused) until SIGINT arrives; prints "done" if the compile ever finishes.
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported anywhere
os.environ["BRRR_DEBUG"] = "1"

import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402


class Block(nn.Module):
    """Linear, layer norm, GELU, a host constant moved to the device, linear: a plain forward and backward."""

    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(12, 24), nn.LayerNorm(24), nn.Linear(24, 6)

    def forward(self, x):
        h = nn.functional.gelu(self.norm(self.up(x)))
        return self.down(h * torch.tensor([0.5, 2.0]).repeat(12)).square().mean()


def model_and_input():
    torch.manual_seed(0)
    return Block(), torch.randn(5, 12)


def step(model, x):
    loss = model(x)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def run(out_dir):
    from torch._dynamo.backends import common

    from brrr.compile.backend import brrr_backend
    from brrr.compile.runtime import aot_cache, graph_cache

    traced = []
    aot = common.aot_module_simplified

    def counted(*args, **kwargs):
        traced.append(1)
        return aot(*args, **kwargs)

    common.aot_module_simplified = counted   # the backend's AOTAutograd looks it up there at each compile
    model, x = model_and_input()
    compiled = torch.compile(model, backend=brrr_backend, dynamic=False)
    loss, grads = step(compiled, x)
    with torch.no_grad():
        inference = compiled(x)
    torch.save({"loss": loss, "grads": grads, "inference": inference, "stats": dict(graph_cache.STATS),
                "aot": dict(aot_cache.STATS), "aot_traced": len(traced)}, os.path.join(out_dir, f"{os.getpid()}.pt"))


def race(out_dir):
    while not os.path.exists(os.path.join(out_dir, "go")):
        time.sleep(0.005)
    run(out_dir)


def pause(out_dir):
    interrupted = threading.Event()

    def on_sigint(signum, frame):
        interrupted.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    rename = os.replace

    def held_rename(src, dst, *args, **kwargs):
        graph_entry = os.path.basename(os.path.dirname(dst)) == "graphs"
        if graph_entry and not os.path.exists(os.path.join(out_dir, "paused")):
            open(os.path.join(out_dir, "paused"), "w").close()
            interrupted.wait(timeout=60)
        return rename(src, dst, *args, **kwargs)

    os.replace = held_rename
    run(out_dir)
    print("done", flush=True)


if __name__ == "__main__":
    os.environ["BRRR_GRAPH_CACHE"] = "1"   # here only: the tests import this module, and watch planning elsewhere
    {"run": run, "race": race, "pause": pause}[sys.argv[1]](sys.argv[2])
