"""Session-4 probe 6 (torch 2.11 on the device): the analyzer's Dynamo frame skip without importing torch._dynamo,
and analyzing a torch.compile'd model (brrr and Inductor backends) against the eager analysis, on CUDA."""
import sys

import torch

import brrr
from brrr.analyze import capture
from brrr.examples import build_example

print("torch", torch.__version__, "| can skip code:", capture._CAN_SKIP_CODE,
      "| torch._dynamo imported by brrr.analyze:", "torch._dynamo" in sys.modules, flush=True)
model, (x,) = build_example("mlp", device="cuda", dtype=torch.bfloat16, batch=512)
eager = brrr.analyze(model, x)
names = sorted(op.name for op in eager.ops if op.op_class != "view")
from brrr.compile.backend import brrr_backend  # noqa: E402  (no entry point without pip install)

for backend in ("brrr", "inductor"):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=brrr_backend if backend == "brrr" else backend)
    a = brrr.analyze(compiled, x)
    got = sorted(op.name for op in a.ops if op.op_class != "view")
    print(f"{backend}: {len(a.ops)} ops, wall {a.wall_time_s * 1e3:.3f} ms (eager {eager.wall_time_s * 1e3:.3f}); "
          f"busy {a.busy_time_s * 1e3:.3f} ms (eager {eager.busy_time_s * 1e3:.3f}); regimes "
          f"{ {k: round(v * 1e3, 3) for k, v in a.regimes.items()} }; kernels outside ATen ops: "
          f"{[(op.name, round(op.time_s * 1e6, 1), op.regime) for op in a.ops if op.kernel]}; "
          f"ATen ops: {sorted(set(got))}", flush=True)
