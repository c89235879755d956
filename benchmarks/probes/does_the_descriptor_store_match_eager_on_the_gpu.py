"""Does a fused TMA kernel that stores its product through a descriptor train a block as eager does, on the GPU?

A bf16 MLP block (Linear 768 -> 3072, GELU, Linear 3072 -> 768) at 4096 tokens, trained one step under
`matmul_templates="always"` (the up-projection's product is saved for the backward, so its fused kernel stores it
through a descriptor) against eager, and against a float64 reference. Prints the errors and which kernels store
through descriptors.

    PYTHONPATH=$PWD python3 benchmarks/probes/does_the_descriptor_store_match_eager_on_the_gpu.py
"""

import copy
import os
import sys

import torch

import brrr


def main():
    os.environ["BRRR_MATMUL_TEMPLATES"] = "1"   # "always", for explain as for compile
    torch.manual_seed(0)
    dev = "cuda"
    model = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768))
    model = model.to(dev, torch.bfloat16)
    x = torch.randn(4096, 768, device=dev, dtype=torch.bfloat16)
    ref = copy.deepcopy(model).double()
    ours = copy.deepcopy(model)
    ex = brrr.explain(copy.deepcopy(model), x.clone().requires_grad_(), train=True)
    for m in ex.matmuls:
        print(f"{m.graph:9s} {m.runs_as:32s} epilogue {m.epilogue}")
    stored = [k.name for k in ex.kernels if "out_ptr0.store([" in k.source]
    print("stored through a descriptor:", stored)
    compiled = brrr.compile(ours)
    worst = 0.0
    for step in range(3):
        xs = [x.clone().requires_grad_() for _ in range(3)]
        outs = [compiled(xs[0]), model(xs[1]), ref(xs[2].double())]
        for o in outs:
            o.float().pow(2).mean().backward()
        rows = [("out", outs[0], outs[1], outs[2]), ("x.grad", xs[0].grad, xs[1].grad, xs[2].grad)]
        rows += [(n, p.grad, q.grad, r.grad)
                 for (n, p), q, r in zip(ours.named_parameters(), model.parameters(), ref.parameters())]
        for name, got, eager, want in rows:
            scale = want.abs().max().item()
            e_ours = (got.double() - want).abs().max().item() / scale
            e_eager = (eager.double() - want).abs().max().item() / scale
            worst = max(worst, e_ours / max(e_eager, 1e-6))
            print(f"step {step} {name:10s} brrr {e_ours:.2e}  eager {e_eager:.2e}")
        for mod in (ours, model, ref):
            mod.zero_grad()
    print(f"worst brrr / eager error ratio {worst:.2f}")
    return 0 if worst <= 3 and stored else 1


if __name__ == "__main__":
    sys.exit(main())
