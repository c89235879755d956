"""Where does a replayed training step spend its time beyond its kernels, and what does replaying add to its
memory?

Question. In the sweep (H200, 7ac727c) DenseNet121's amp training step replays both its graphs, yet a period is
22.1 ms against 13.9 ms of profiled kernels (reduce-overhead's whole step: 11.66 ms); AlexNet's bf16 step is
refused replay at 464 MiB replaying against 422 launched, a reading that has moved 389-454 MiB between runs.
For each configuration named (the sweep's own builds and step: autocast, the fused AdamW step, gradients set
to None), after brrr's trial has decided:
- the step's wall time, the GPU's busy time inside it (profiled kernels and copies), and the host's share by
  Python function (cProfile over the same steps) and by CUDA runtime call (cudaGraphLaunch, memcpy, launches);
- memory allocated before and after a step and its peak, launched (`cuda_graphs=False`) and replayed
  (`cuda_graphs=True`), and the trial's own readings (its decisions);
- the floor's verdicts on the kernels it gave alternatives (timed behind a head start that outlasts the host).

Prediction, written before running: DenseNet's ~8 ms is on the host after the backward's replay: per-gradient
Python in handing out the 364 gradients and autograd's AccumulateGrad, each a few microseconds, with the fused
AdamW step; AlexNet's replayed step holds its pool's activations (~40-80 MiB at batch 32) beyond the launched
step's peak, and the launched reading moves with what the first calls leave allocated.

Run on the device machine: `PYTHONPATH=$PWD python3 benchmarks/probes/<this file> --only NAME[,NAME] --out $OUT`.
Not yet run.
"""

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "sweep")]

import catalog  # noqa: E402
import measure  # noqa: E402
from brrr.bench.step import make_cotangents  # noqa: E402

STEPS = 20


def build(config, device):
    work = config.build(device, False)
    inputs = tuple(work.inputs)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.precision == "amp"):
        cotangents = [make_cotangents(work.model(*inputs))]
    return work, inputs, cotangents


def make_step(config, work, inputs, cotangents, cuda_graphs):
    import brrr
    torch._dynamo.reset()
    fn = brrr.compile(work.model, cuda_graphs=cuda_graphs)
    return measure.SweepStep(fn, work.model, [inputs], work.train, cotangents,
                             autocast=config.precision == "amp", optimizer=measure._optimizer(work, config.precision))


def memory(step, device):
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return {"before_mib": before / 2**20, "after_mib": torch.cuda.memory_allocated(device) / 2**20,
            "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20,
            "reserved_mib": torch.cuda.max_memory_reserved(device) / 2**20}


def wall(step, device):
    torch.cuda.synchronize(device)
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def gpu_and_runtime(step, device):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize(device)
    busy, runtime = 0.0, {}
    for e in prof.key_averages():
        device_us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if device_us and e.device_type == torch.autograd.DeviceType.CUDA:
            busy += device_us
        if e.key.startswith("cuda") or e.key.startswith("aten::") or e.key.startswith("autograd::"):
            runtime[e.key] = (e.count / 3, e.self_cpu_time_total / 3 / 1e3)
    top = sorted(runtime.items(), key=lambda kv: -kv[1][1])[:15]
    return busy / 3 / 1e3, [(k, round(n, 1), round(ms, 3)) for k, (n, ms) in top]


def host_functions(step):
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        step()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def decisions():
    from brrr.compile.runtime import floor, replay_choice
    return [str(d) for d in replay_choice.DECISIONS] + [str(v) for v in floor.DECISIONS if v.tried]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="tv-alexnet-train-bf16,tv-densenet121-train-amp")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    device = torch.device("cuda")
    found = {}
    for config in catalog.select(catalog.all_configs(), only=args.only):
        work, inputs, cotangents = build(config, device)
        row = {}
        for mode in ("auto", False, True):
            from brrr.compile.runtime import floor, replay_choice
            del replay_choice.DECISIONS[:], floor.DECISIONS[:]
            step = make_step(config, work, inputs, cotangents, mode)
            torch.cuda.reset_peak_memory_stats(device)
            for _ in range(measure.TRIAL_CALLS + 2):
                step()
            torch.cuda.synchronize(device)
            entry = {"whole_run_peak_mib": torch.cuda.max_memory_allocated(device) / 2**20,
                     "decisions": decisions(), "memory": memory(step, device), "wall_ms": wall(step, device)}
            entry["gpu_busy_ms"], entry["runtime_calls"] = gpu_and_runtime(step, device)
            if mode == "auto":
                entry["host_functions"] = host_functions(step)
            row[str(mode)] = entry
            print(config.name, mode, json.dumps({k: v for k, v in entry.items() if k != "host_functions"}),
                  flush=True)
            if "host_functions" in entry:
                print(entry["host_functions"], flush=True)
            del step
            torch._dynamo.reset()
            measure.release(device)
        found[config.name] = row
        Path(args.out, "replayed-step-time-and-memory.json").write_text(json.dumps(found, indent=1))
        del work, inputs, cotangents
        measure.release(device)


if __name__ == "__main__":
    main()
