"""Session-4 probe 5: does CUPTI left attached (TEARDOWN_CUPTI=0) slow the process's later steps? Eager
BERT-base bf16 8x512 inference before any profiler session, then after each of three analyses, in blocks
that alternate with a plain busy loop so host phases show up in both."""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import brrr  # noqa: E402
from probe_common import bert_base_inference, median_ms  # noqa: E402

model, ids, step, ceil = bert_base_inference()
x = torch.randn(1024, device="cuda")


def eager_ms(n=40):
    return median_ms(step, n)


def launches_us(n=2000):
    """Host cost of one tiny launch (x.add_(1)), the thing CUPTI instruments."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


for _ in range(5):
    step()
tag = f"TEARDOWN_CUPTI={os.environ.get('TEARDOWN_CUPTI', 'unset')}"
print(f"{tag} before any profiler: eager {eager_ms():.2f} ms, launch {launches_us():.2f} us", flush=True)
for i in range(3):
    brrr.analyze(model, ids, ceilings=ceil)
    print(f"{tag} after analysis {i}: eager {eager_ms():.2f} ms, launch {launches_us():.2f} us", flush=True)
