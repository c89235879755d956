"""Where does a two-layer GAT training step (bf16, 50k nodes, 500k edges) lose to Inductor?

Every kernel of one step under brrr, Inductor and Inductor reduce-overhead (torch.profiler, device time per
step, summed by name), with the step's do_bench median, so each brrr kernel can be set beside the one that
does its work in Inductor. Run on the GPU machine:

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_gat_training_lose_to_inductor.py
"""

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "acceptance"), str(HERE.parent / "sweep"), str(HERE.parent / "zoo"),
                str(HERE.parent)]

import floor_models  # noqa: E402
from kernels import top_kernels  # noqa: E402


def main():
    from triton.testing import do_bench

    import brrr  # noqa: F401  (registers the backend)
    from brrr.compile.backend import brrr_backend

    quick = "--quick" in sys.argv   # CPU smoke run: tiny graph, eager and brrr
    device = "cpu" if quick else "cuda"
    work = floor_models._gat_build(device, quick)
    model, inputs = work.model, work.inputs
    params = [p for p in model.parameters() if p.requires_grad]

    def stepper(fn):
        def step():
            for p in params:
                p.grad = None
            fn(*inputs).backward()
        return step

    backends = {"eager": lambda: model,
                "brrr": lambda: torch.compile(model, backend=brrr_backend),
                "inductor": lambda: torch.compile(model),
                "inductor-reduce-overhead": lambda: torch.compile(model, mode="reduce-overhead")}
    for name, make in list(backends.items())[:2 if quick else 4]:
        torch._dynamo.reset()
        step = stepper(make())
        for _ in range(3 if quick else 30):
            step()
        if quick:
            print(f"== {name}: ran")
            continue
        torch.cuda.synchronize()
        ms = do_bench(step, rep=300)
        kernels = top_kernels(step, device, calls=5, count=40)
        print(f"== {name}: {ms:.3f} ms a step, kernels {sum(k['device_ms'] for k in kernels):.3f} ms")
        for k in kernels:
            print(f"   {k['device_ms'] * 1e3:8.1f} us  {k['name'][:110]}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
