"""Where does brrr's GPT-2 training peak sit, and which tensors are live there?

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_gpt2s_training_peak_sit.py

The zoo's GPT2LMHeadModel step (8 x 1024, bf16, loss in the head's graph) peaks at 4123 MiB with brrr against
Inductor's 6057; issue 16 asks for 60% (3634). Prediction: per layer brrr saves ~120 MiB (the residual input
12, qkv 36, attention output 12, the mid residual 12, the fc pre-activation 48), 1.45 GB over 12 layers, plus
weights 237 MiB; so ~2.4 GB of the peak is something else: transients at the peak's moment. Which?

Each backend's step runs launched (no CUDA graphs) under the allocator's history; the live blocks at the step's
highest point are listed by the frame that allocated them.
"""

import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))
MiB = 1 << 20
NAME = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "gpt2-lm-train"


def frame_key(frames):
    """The innermost frame in code that is not torch's own machinery, and the one above it."""
    keep = []
    for f in frames:
        name = f.get("filename", "")
        if not name or "/torch/" in name and "/_dynamo/" not in name or name.startswith("??"):
            continue
        keep.append(f"{Path(name).name}:{f.get('line')}:{f.get('name')}")
        if len(keep) == 2:
            break
    return " < ".join(keep) or "(no python frame)"


def live_at_peak(trace):
    alive, total, peak, at_peak, peak_index = {}, 0, 0, {}, 0
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            alive[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, at_peak, peak_index = total, dict(alive), i
        elif e["action"] == "free_completed" and e["addr"] in alive:
            total -= alive.pop(e["addr"])["size"]
    return peak, at_peak, peak_index, len(trace)


def step_once(fn, model, inputs):
    for p in model.parameters():
        p.grad = None
    fn(*inputs).backward()


def measure(backend):
    import models
    from brrr.bench.backends import resolve_backend, skip_logging_in_graphs

    work = models.BY_NAME[NAME].build("cuda", torch.bfloat16, False)
    torch._dynamo.reset()
    with skip_logging_in_graphs():
        if backend == "brrr-launched":
            import brrr
            fn = brrr.compile(work.model, cuda_graphs=False)
        else:
            fn = torch.compile(work.model, backend=resolve_backend(backend))
        for _ in range(3):
            step_once(fn, work.model, work.inputs)
        for p in work.model.parameters():
            p.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
        loss = fn(*work.inputs)
        torch.cuda.synchronize()
        fwd_peak, after_fwd = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        torch.cuda.synchronize()
        bwd_peak = torch.cuda.max_memory_allocated()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    print(f"\n{backend}: weights and inputs {base / MiB:.0f} MiB; forward peak +{(fwd_peak - base) / MiB:.0f}, held "
          f"after it +{(after_fwd - base) / MiB:.0f}; backward peak +{(bwd_peak - base) / MiB:.0f} MiB", flush=True)
    trace = snap["device_traces"][torch.cuda.current_device()]
    peak, at_peak, index, n = live_at_peak(trace)
    print(f"  the step's highest point: +{peak / MiB:.0f} MiB at event {index} of {n}", flush=True)
    groups = defaultdict(lambda: [0, 0, set()])
    for e in at_peak.values():
        g = groups[frame_key(e.get("frames", []))]
        g[0] += e["size"]
        g[1] += 1
        g[2].add(e["size"] // MiB)
    for key, (size, count, sizes) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"  {size / MiB:8.0f} MiB in {count:3d} blocks (sizes {sorted(sizes)[-4:]} MiB)  {key}", flush=True)
    del work, fn, loss, snap
    torch.cuda.empty_cache()


def main():
    print(torch.cuda.get_device_name(), torch.__version__, NAME, flush=True)
    for backend in ("brrr-launched", "inductor"):
        measure(backend)


if __name__ == "__main__":
    main()
