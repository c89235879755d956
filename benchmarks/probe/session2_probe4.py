"""Session-2 probe 4: (I) where the host time of brrr's BERT-base bf16 inference call goes (cProfile of 20
calls, and how many kernel launches take the direct path); (J) BERT-base train step with brrr-cudagraphs
beside brrr and eager (do_bench and back-to-back)."""
import cProfile
import pstats
import sys
import time

import torch
import triton

from brrr.bench.backends import resolve_backend
from brrr.compile import launch
from brrr.examples import build_example

part = sys.argv[1] if len(sys.argv) > 1 else "IJ"
model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)

if "I" in part:
    launchers = []
    real_init = launch.Launcher.__init__

    def spy(self, *a, **k):
        real_init(self, *a, **k)
        launchers.append(self)
    launch.Launcher.__init__ = spy
    torch._dynamo.reset()
    fn = torch.compile(model, backend=resolve_backend("brrr"))
    with torch.no_grad():
        for _ in range(3):
            fn(ids)
        torch.cuda.synchronize()
        print("I launchers", len(launchers), "direct", sum(1 for k in launchers if k.fast),
              "refused", [(k.grid, k.meta) for k in launchers if not k.fast][:5])
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            fn(ids)
        pr.disable()
        torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)

if "J" in part:
    params = list(model.parameters())
    for name in ("eager", "brrr", "brrr-cudagraphs"):
        torch._dynamo.reset()
        fn = model if name == "eager" else torch.compile(model, backend=resolve_backend(name))

        def step():
            for p in params:
                p.grad = None
            fn(ids).last_hidden_state.float().sum().backward()
        for _ in range(4):
            step()
        ms = triton.testing.do_bench(step, warmup=50, rep=400)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        print(f"J {name}: do_bench {ms:.2f} ms, back-to-back {(time.perf_counter() - t0) / 20 * 1e3:.2f} ms, "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
