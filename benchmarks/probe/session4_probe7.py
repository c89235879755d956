"""Session-4 probe 7: a training-step analysis on CUDA after the tracer changes (record_function off for the
step, step range, kernels outside ATen ops): op classes, kernel records, and the matmul FLOPs against
FlopCounterMode. BERT-base bf16, batch 8 x 512 (a forward and backward)."""
import torch
from torch.utils.flop_counter import FlopCounterMode

import brrr
from brrr.analyze.step import Step
from brrr.examples import build_example

model, (ids,) = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
model.train()
a = brrr.analyze(model, ids, train=True)
kernels = [op for op in a.ops if op.kernel]
counter = FlopCounterMode(display=False)
with counter:
    Step(model, (ids,), train=True)()
contraction = sum(op.flops for op in a.ops if op.op_class == "contraction")
print(f"train: {len(a.ops)} ops, {len(kernels)} kernel records "
      f"({sum(op.time_s for op in kernels) * 1e3:.3f} ms: {sorted({op.name for op in kernels})[:5]}); "
      f"wall {a.wall_time_s * 1e3:.2f} ms, busy {a.busy_time_s * 1e3:.2f} ms, "
      f"op time {sum(op.time_s for op in a.ops) * 1e3:.2f} ms")
print("matmul-family FLOPs brrr/FlopCounterMode:", contraction / counter.get_total_flops())
print("op classes:", {k: round(v["time_pct"], 1) for k, v in a.op_classes.items()})
print("backward ops with a module:", sum(1 for op in a.ops if op.phase == "backward" and op.module != "<backward>"),
      "of", sum(1 for op in a.ops if op.phase == "backward"))
