"""What does the captured trial's memory gate count on an amp training step, and where do a transformer's
training peaks sit per call?

Runs sweep configurations (default: hf-distilbert-train-amp, timm-beit_base_patch16_224-train-bf16) compiled with
brrr, step by step as the sweep does (autocast for amp, fused AdamW), and prints for each step its peak allocated
memory, and for the gate each count it made (eager's and brrr's held bytes, or the exception that stopped it).

Answer: (pending a run)
"""

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "sweep"), str(HERE.parent), str(HERE.parent / "zoo")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="hf-distilbert-train-amp,timm-beit_base_patch16_224-train-bf16")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny models (a CPU check of this script)")
    args = p.parse_args()

    import catalog
    from measure import SweepStep, _optimizer, make_cotangents

    import brrr
    from brrr.compile.runtime import captured_choice, held_for_backward

    real = captured_choice.held_bytes

    def counting(fn, fn_args, constants=()):
        was = held_for_backward.debugging
        held_for_backward.debugging = lambda: True
        try:
            got = real(fn, fn_args, constants)
            print(f"  gate: held_bytes({getattr(fn, '__name__', type(fn).__name__)}) = {got / 2**20:.0f} MiB",
                  flush=True)
            return got
        except Exception:
            print("  gate: held_bytes raised\n" + traceback.format_exc(limit=6), flush=True)
            return None
        finally:
            held_for_backward.debugging = was
    captured_choice.held_bytes = counting

    configs = {c.name: c for c in catalog.all_configs()}
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    for name in args.configs.split(","):
        config = configs[name]
        work = config.build(device, args.quick)
        torch._dynamo.reset()
        captured_choice.DECISIONS.clear()
        fn = brrr.compile(work.model)
        inputs = tuple(work.inputs)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.precision == "amp"):
            cotangents = [make_cotangents(work.model(*inputs))]
        step = SweepStep(fn, work.model, [inputs], work.train, cotangents, autocast=config.precision == "amp",
                         optimizer=_optimizer(work, config.precision))
        mib = (lambda f: f() / 2**20) if cuda else (lambda f: 0.0)
        print(f"== {name}: allocated before {mib(torch.cuda.memory_allocated):.0f} MiB", flush=True)
        for i in range(args.steps):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            print(f"step {i}: peak {mib(torch.cuda.max_memory_allocated):.0f} MiB, allocated after "
                  f"{mib(torch.cuda.memory_allocated):.0f} MiB, {time.perf_counter() - start:.3f} s", flush=True)
        for d in captured_choice.DECISIONS:
            print(f"captured decision: {d}", flush=True)
        from brrr.compile.runtime import replay_choice
        for d in replay_choice.DECISIONS[-2:]:
            print(f"replay decision: {d}", flush=True)
        del step, fn, work
        torch._dynamo.reset()
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
