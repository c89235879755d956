"""Does the autograd engine's device thread still run when the next step's forward starts?

Not run on a GPU yet. On the H100 hosts brrr's generated forward call took 112 us alone, 165 us inside a
step with the engine's device threads off and 242 us with them on, though the forward always runs on the main
thread (`results/probes/2026-11-24-h100-49128bd-where-does-a-small-train-step-spend-its-host-time.log`).
If the device thread still holds the GIL for work after the backward (freeing the graph, Python objects), the
next forward competes with it. This times the seed MLP's step at 64 x 32 (host time only) and the time inside
its forward graph, with and without a 300 us sleep between steps (time.sleep releases the GIL; the sleep is not counted), device threads
on and off. Prediction if the hypothesis holds: with the sleep, the forward call inside the step falls to the
threads-off figure.

    PYTHONPATH=$PWD python3 benchmarks/probes/does_the_engine_thread_still_run_when_the_next_step_starts.py
"""

import statistics
import time

import torch


def main():
    import brrr
    from brrr.compile.runtime import CompiledGraph
    from brrr.examples import mlp

    device = "cuda"
    model, (x,) = mlp(device=device, dtype=torch.bfloat16, batch=64, dim=32)
    model.train()
    cot = torch.randn(x.shape, device=device, dtype=torch.bfloat16)
    params = list(model.parameters())
    fn = brrr.compile(model)
    inside = {"forward": 0.0, "backward": 0.0}
    orig = CompiledGraph.__call__

    def timed(graph, *args):
        t0 = time.perf_counter()
        try:
            return orig(graph, *args)
        finally:
            inside[graph.kind] = inside.get(graph.kind, 0.0) + time.perf_counter() - t0

    def step():
        for p in params:
            p.grad = None
        torch.autograd.backward([fn(x)], [cot])

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    CompiledGraph.__call__ = timed
    for threads in (True, False):
        torch.autograd.set_multithreading_enabled(threads)
        for pause in (0.0, 300e-6):
            samples = []
            for _ in range(5):
                inside.update(forward=0.0, backward=0.0)
                n, spent = 300, 0.0
                torch.cuda.synchronize()
                for _ in range(n):
                    if pause:
                        time.sleep(pause)   # releases the GIL: the device thread may finish meanwhile
                    t0 = time.perf_counter()
                    step()
                    spent += time.perf_counter() - t0
                torch.cuda.synchronize()
                samples.append((spent / n * 1e6, inside["forward"] / n * 1e6, inside["backward"] / n * 1e6))
            s, f, b = (statistics.median(v) for v in zip(*samples))
            print(f"device threads {'on ' if threads else 'off'}, pause {pause * 1e6:3.0f} us: step {s:7.1f} us, "
                  f"inside forward {f:6.1f} us, inside backward {b:6.1f} us", flush=True)
    torch.autograd.set_multithreading_enabled(True)
    CompiledGraph.__call__ = orig


if __name__ == "__main__":
    main()
