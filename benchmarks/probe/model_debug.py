"""Run one brrr-compiled GPT-2 small / BERT-base step (bf16, 8x512) on the GPU and keep its plan.

    CUDA_LAUNCH_BLOCKING=1 BRRR_DEBUG=1 BRRR_DUMP_DIR=$OUT PYTHONPATH=$PWD \
        python3 benchmarks/probe/model_debug.py train|infer [gpt2-small|bert-base]

Writes the explanation (kernels with their Triton source) under $OUT; with BRRR_DUMP_DIR the generated call
too, so a traceback's `<brrr call ...>` line can be read.
"""
import os
import sys
import traceback

import torch

import brrr
from brrr.examples import build_example

out_dir = os.environ.get("OUT", ".")
which = sys.argv[1] if len(sys.argv) > 1 else "train"
name = sys.argv[2] if len(sys.argv) > 2 else "gpt2-small"
model, (ids,) = build_example(name, device="cuda", dtype=torch.bfloat16)
ex = brrr.explain(model, ids, train=(which == "train"))
with open(os.path.join(out_dir, f"{name}-{which}-explain.txt"), "w") as f:
    f.write(str(ex))
    for k in ex.kernels:
        f.write(f"\n\n# ---- {k.name} ops={k.ops}\n{k.source}")
print(f"explain: {len(ex.kernels)} kernels, {len(ex.fallbacks)} fallbacks")
from brrr.compile.backend import brrr_backend
compiled = torch.compile(model, backend=brrr_backend)
try:
    if which == "train":
        out = compiled(ids).last_hidden_state
        out.float().sum().backward()
    else:
        with torch.no_grad():
            out = compiled(ids).last_hidden_state
    torch.cuda.synchronize()
    print(which, "ok", out.shape)
except Exception:
    traceback.print_exc()
