"""Session-3 probe 7: does a profiler session leave the process slower (CUPTI not torn down), and what does
TEARDOWN_CUPTI=1 change? BERT-base bf16 8x512 inference: eager step medians before and after analyses, and
each analysis's time. Run once with TEARDOWN_CUPTI unset and once with it set to 1 (separate processes)."""
import os
import statistics
import time

import torch

import brrr
from brrr.examples import build_example

model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
from brrr.cost.device import get_ceilings  # noqa: E402
get_ceilings("cuda", progress=False)


def eager_ms(n=20):
    ts = []
    with torch.no_grad():
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


tag = f"TEARDOWN_CUPTI={os.environ.get('TEARDOWN_CUPTI', 'unset')}"
eager_ms(5)
print(f"{tag} eager before any profiler: {eager_ms():.2f} ms", flush=True)
for i in range(3):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    a = brrr.analyze(model, ids)
    torch.cuda.synchronize()
    t = (time.perf_counter() - t0) * 1e3
    print(f"{tag} analyze #{i}: {t:.1f} ms (its wall time {a.wall_time_s*1e3:.2f} ms); eager after: {eager_ms():.2f} ms",
          flush=True)
