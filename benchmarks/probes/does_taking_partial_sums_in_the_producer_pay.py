"""Probe: does a bias gradient summed by the kernel writing the activation gradient (Scheduler.take_partial_sums)
make training steps faster than writing it and summing it in a kernel of its own?

For each zoo training configuration given, brrr compiles the step twice in one process: as committed, and with
take_partial_sums refused (the kernels before it). Each is timed by do_bench (launched kernels, no CUDA graphs)
and profiled: GPU busy time and the time of kernels whose name holds "sum"."""

import os
import sys
from collections import defaultdict

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", "zoo"), os.path.join(os.path.dirname(__file__), "..", "..")]

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import models  # noqa: E402
from brrr.bench.backends import skip_logging_in_graphs  # noqa: E402
from brrr.bench.step import Step  # noqa: E402
from brrr.compile import schedule  # noqa: E402


def profile(step, calls=5):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    total, sums, n_sums = 0.0, 0.0, defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = getattr(e, "device_time_total", None) or e.cuda_time_total
            total += t / calls
            if "sum" in e.name and e.name.startswith("brrr"):
                sums += t / calls
                n_sums[e.name.split("_")[1] if "_" in e.name else e.name] += 1
    return total, sums


def main():
    import brrr
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["gpt2-lm-train", "gpt-neox-160m-train"]
    device = torch.device("cuda")
    print(f"probe does_taking_partial_sums_in_the_producer_pay; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    taking = schedule.Scheduler.take_partial_sums
    for name in names:
        cfg = next(c for c in models.CONFIGS if c.name == name)
        rows = {}
        for variant in ("separate sums", "partial sums in the producer", "separate sums again"):
            schedule.Scheduler.take_partial_sums = taking if "producer" in variant else (lambda self, node: False)
            torch._dynamo.reset()
            work = cfg.build(device, torch.bfloat16, False)
            step = Step(brrr.compile(work.model, cuda_graphs=False), work.model, [work.inputs], True)
            with skip_logging_in_graphs():
                for _ in range(3):
                    step()
                ms = do_bench(step, warmup=100, rep=1500)
                busy, sums = profile(step)
            rows[variant] = ms
            print(f"{name:24s} {variant:30s} do_bench {ms:7.3f} ms; GPU busy {busy / 1e3:7.3f} ms; brrr *sum* kernels "
                  f"{sums / 1e3:6.3f} ms", flush=True)
            del step, work
            torch.cuda.empty_cache()
        schedule.Scheduler.take_partial_sums = taking


if __name__ == "__main__":
    main()
