"""Session-3 probe 8: where brrr's BERT-base bf16 8x512 train step spends host time (lean runtime, no CUDA
graphs): back-to-back step times for eager and brrr, then cProfile of 10 brrr steps (tottime and cumulative)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from suite_sections import HiddenStates  # noqa: E402

from brrr.compile.backend import brrr_backend  # noqa: E402
from brrr.examples import build_example  # noqa: E402
from probe_common import back_to_back_s, host_seconds, profile_report  # noqa: E402

model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
model = HiddenStates(model, use_cache_kwarg=False)
params = [p for p in model.parameters() if p.requires_grad]
cot = None


def make_step(fn):
    def step():
        global cot
        for p in params:
            p.grad = None
        out = fn(ids)
        if cot is None:
            cot = torch.randn_like(out)
        torch.autograd.backward([out], [cot])
    return step


eager = make_step(model)
print(f"eager: back to back {back_to_back_s(eager, n=20, warmup=3) * 1e3:.2f} ms, host {host_seconds(eager, 10) * 1e3:.2f} ms per step", flush=True)
torch._dynamo.reset()
brrr = make_step(torch.compile(model, backend=brrr_backend))
print(f"brrr: back to back {back_to_back_s(brrr, n=20, warmup=3) * 1e3:.2f} ms, host {host_seconds(brrr, 10) * 1e3:.2f} ms per step", flush=True)
print(profile_report(brrr, 10, sorts=("tottime", "cumulative"), rows=28))
