"""What holds brrr's memory between calls, where eager holds none?

The floor patterns' step peaks: PoolFormer's mixer (bf16 inference, one [32, 64, 56, 56] input of 12.8 MB)
780 MiB under brrr against eager's 305 and reduce-overhead's 268; GAT training 1212 MiB against Inductor's 854
and reduce-overhead's 529. This runs each under brrr as the bench does (a checking call, the trials' calls, then
steady calls), with the allocator's history recorded, and prints the memory allocated at each stage and the
tensors still alive after the last call, largest first, each with the innermost frames of its allocation.

    PYTHONPATH=$PWD python3 benchmarks/probes/what_holds_brrrs_memory_between_calls.py
"""

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))

CONFIGS = ("poolformer-mixer-infer-bf16", "gat-train-bf16")
MIB = 2 ** 20


def where(frames):
    """The innermost frames that are brrr's, the benchmark's or torch's Python, as file:line names."""
    keep = [f for f in frames if f.get("filename", "").endswith(".py") and "/site-packages/torch/utils/" not in
            f["filename"]]
    return " <- ".join(f"{Path(f['filename']).parent.name}/{Path(f['filename']).name}:{f['line']}({f['name']})"
                       for f in keep[:4])


def live_blocks(snapshot):
    by_site = defaultdict(lambda: [0, 0])
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                site = where(block.get("frames", [])) or f"(no frames; pool {segment.get('segment_pool_id')})"
                by_site[site][0] += block["size"]
                by_site[site][1] += 1
    return sorted(by_site.items(), key=lambda kv: -kv[1][0])


def main():
    import torch

    import pattern_bench  # noqa: F401  (puts the sweep's and the zoo's folders on the path)
    import floor_models

    import brrr
    from brrr.bench.step import Step
    from brrr.compile.runtime import replay_choice

    configs = {config.name: config for _, config in floor_models.patterns()}
    for name in CONFIGS:
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        work = configs[name].build("cuda", False)
        base = torch.cuda.memory_allocated()
        step = Step(brrr.compile(work.model), work.model, [work.inputs], work.train)
        print(f"=== {name}: model and inputs {base / MIB:.0f} MiB allocated", flush=True)
        for stage, calls in (("first call", 1), ("trials", 40), ("steady", 10)):
            torch.cuda.reset_peak_memory_stats()
            for _ in range(calls):
                out = step()
            del out
            torch.cuda.synchronize()
            print(f"after {stage:10s}: allocated {torch.cuda.memory_allocated() / MIB:7.0f} MiB, "
                  f"peak in it {torch.cuda.max_memory_allocated() / MIB:7.0f} MiB", flush=True)
        for decision in replay_choice.DECISIONS[-3:]:
            print(f"    replay: {decision}")
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        print("alive after the last call, by allocation site:")
        for site, (size, count) in live_blocks(snapshot)[:15]:
            print(f"  {size / MIB:8.1f} MiB {count:5d} tensors  {site}")
        del step, work


if __name__ == "__main__":
    main()
