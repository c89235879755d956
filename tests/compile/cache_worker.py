"""A process compiling with brrr against a kernel cache another process uses too (test_cache_faults.py).

    BRRR_CACHE_DIR=DIR python -m tests.compile.cache_worker MODE OUT_DIR

MODE
  race   waits for OUT_DIR/go, then loads RACE_KERNELS kernels new to the cache, in the same order as the other
         process (each entry written by whichever gets there first while the other may be reading it), runs
         each, and compiles and runs `graph`; saves its outputs and the cache keys it loaded to OUT_DIR/<pid>.pt.
  pause  compiles `graph`, holding its first cache write between the temporary file and the rename (after
         touching OUT_DIR/paused) until SIGINT arrives, so the signal lands mid-write; prints "done" if the
         compile ever finishes.
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported anywhere
os.environ["BRRR_DEBUG"] = "1"

import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

RACE_KERNELS = 60
ADD_CONSTANT = """import triton
import triton.language as tl


@triton.jit
def add_constant(x_ptr, out_ptr, XBLOCK: tl.constexpr):
    i = tl.arange(0, XBLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i) + {value})
"""


def graph(x, w):
    h = F.layer_norm(x, (x.shape[-1],), w)
    return torch.softmax(F.gelu(h) * 2, dim=-1), (h.sigmoid() * x).sum(0)


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, 40, generator=g), torch.randn(40, generator=g)


def compiled_graph():
    from brrr.compile.backend import brrr_backend
    return torch.compile(graph, backend=brrr_backend, dynamic=False)


def race(out_dir):
    from brrr.compile import cache as kernel_cache
    while not os.path.exists(os.path.join(out_dir, "go")):
        time.sleep(0.005)
    x = torch.zeros(8)
    for value in range(RACE_KERNELS):
        kernel = kernel_cache.load_kernel(ADD_CONSTANT.format(value=value), "add_constant", "cpu")
        out = torch.empty(8)
        kernel[(1,)](x, out, XBLOCK=8)
        assert torch.equal(out, x + value), (value, out)
    outs = compiled_graph()(*inputs())
    torch.save({"outs": outs, "keys": sorted(kernel_cache._MODULES)}, os.path.join(out_dir, f"{os.getpid()}.pt"))


def pause(out_dir):
    interrupted = threading.Event()

    def on_sigint(signum, frame):   # Python's default handler, noting that the signal came
        interrupted.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    rename = os.replace

    def held_rename(src, dst, *args, **kwargs):
        if os.path.basename(src).startswith(".tmp-") and not os.path.exists(os.path.join(out_dir, "paused")):
            open(os.path.join(out_dir, "paused"), "w").close()
            interrupted.wait(timeout=60)
        return rename(src, dst, *args, **kwargs)

    os.replace = held_rename
    compiled_graph()(*inputs())
    print("done", flush=True)


if __name__ == "__main__":
    {"race": race, "pause": pause}[sys.argv[1]](sys.argv[2])
