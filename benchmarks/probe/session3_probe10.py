"""Session-3 probe 10: torch's static CUDA launcher for brrr's kernels (one C++ call per launch) against
Triton's launcher (BRRR_STATIC_LAUNCH=0 while compiling), same process: seed MLP bf16 16384 train step and
BERT-base bf16 8x512 train step, plus how many launchers took the static path."""
import os
import sys

import torch

from brrr.bench import bench
from brrr.compile import launch
from brrr.examples import build_example, mlp
from probe_common import brrr_with_env

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from suite_sections import HiddenStates  # noqa: E402

made = []
real_init = launch.Launcher.__init__


def counting_init(self, *a, **kw):
    real_init(self, *a, **kw)
    made.append(self)


launch.Launcher.__init__ = counting_init


triton_launch_backend = brrr_with_env("brrr-triton-launch", BRRR_STATIC_LAUNCH="0")
ms = lambda v: "-" if v is None else f"{v*1e3:.3f}"  # noqa: E731
for label, build in (("mlp", lambda: mlp(device="cuda", dtype=torch.bfloat16, batch=16384)),
                     ("bert-base", lambda: build_example("bert-base", device="cuda", dtype=torch.bfloat16,
                                                         batch=8, seq=512))):
    model, inputs = build()
    if label != "mlp":
        model = HiddenStates(model, use_cache_kwarg=False)
    made.clear()
    r = bench(model, *inputs, backends=["eager", "brrr", triton_launch_backend], train=True, warmup=25, rep=100,
              compile_warm=False)
    for row in r.rows:
        print(f"{label} train {row.backend:20s} {row.status:6s} median {ms(row.median_s)} steady "
              f"{ms(row.steady_s)} ms {row.reason or ''}", flush=True)
    static = sum(1 for l in made if l.static is not None)
    fast = sum(1 for l in made if l.fast)
    print(f"{label}: {len(made)} launchers, {fast} direct, {static} through torch's static launcher", flush=True)
