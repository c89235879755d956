"""Probe: what holds brrr's peak memory in a training step above Inductor's (ResNet-18 fp32, batch 32)?

    PYTHONPATH=$PWD python3 benchmarks/probes/what_holds_brrrs_training_peak.py [VARIANT ...]   # on the GPU

Each variant named on the command line (default: all) in turn in one process (Dynamo reset, caches emptied, peak
statistics reset): eager; brrr with everything; brrr without the compiled-or-captured trial; without it and the
floor; with cuda_graphs=False; with cuda_graphs=False and neither; Inductor default. For each: max_memory_allocated
after the first step (compile and first measurements), after 12 steps (the launch-or-replay trial over), over 3
steady steps, and memory_allocated between steps, in MiB.
"""

import sys
import time

import torch

from brrr.compile import backend as brrr_backend_module
from brrr.compile.runtime import captured_choice, floor


def model_and_data():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18").cuda().train()
    x = torch.randn(32, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (32,), device="cuda")
    return model, x, y


def variants():
    yield "eager", None, {}
    yield "brrr", "brrr", dict(cuda_graphs="auto")
    yield "brrr-no-captured", "brrr", dict(cuda_graphs="auto", captured=False)
    yield "brrr-no-captured-no-floor", "brrr", dict(cuda_graphs="auto", captured=False, floor=False)
    yield "brrr-launch", "brrr", dict(cuda_graphs=False)
    yield "brrr-launch-no-captured-no-floor", "brrr", dict(cuda_graphs=False, captured=False, floor=False)
    yield "inductor", "inductor", {}


def main():
    mib = 2 ** 20
    captured_enabled, floor_enabled = captured_choice.enabled, floor.enabled
    for name, backend, opts in variants():
        if len(sys.argv) > 1 and name not in sys.argv[1:]:
            continue
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        captured_choice.enabled = captured_enabled if opts.pop("captured", True) else (lambda devices: False)
        floor.enabled = floor_enabled if opts.pop("floor", True) else (lambda graph: False)
        model, x, y = model_and_data()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        if backend == "brrr":
            fn = torch.compile(model, backend=brrr_backend_module.make_backend(**opts))
        elif backend == "inductor":
            fn = torch.compile(model)
        else:
            fn = model

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(fn(x), y)
            loss.backward()
            opt.step()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        first = torch.cuda.max_memory_allocated()
        compile_s = time.perf_counter() - t0
        for _ in range(11):
            step()
        torch.cuda.synchronize()
        after = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        steady = torch.cuda.max_memory_allocated()
        live = torch.cuda.memory_allocated()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            step()
        end.record()
        torch.cuda.synchronize()
        print(f"{name}: weights+inputs {base / mib:.0f} MiB; peak first step {first / mib:.0f}, peak 12 steps "
              f"{after / mib:.0f}, peak of 3 steady steps {steady / mib:.0f}, live between steps {live / mib:.0f}; "
              f"first step {compile_s:.1f} s, steady {start.elapsed_time(end) / 10:.2f} ms", flush=True)
        del fn, model, opt
    captured_choice.enabled, floor.enabled = captured_enabled, floor_enabled


if __name__ == "__main__":
    main()
