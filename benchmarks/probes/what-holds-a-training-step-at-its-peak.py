"""Which allocations are alive at a training configuration's whole-run peak, per backend: the sweep's step run
three times under the allocator's memory history, the live blocks at the highest point grouped by the first
frame in brrr, Inductor or the model. usage: what-holds-a-training-step-at-its-peak.py CONFIG BACKEND [STEPS]
(BACKEND: eager, brrr, brrr-launched (cuda_graphs=False), inductor; STEPS: 3, more to pass brrr's replay trial)."""

import collections
import sys

import torch

sys.path[:0] = [".", "benchmarks/sweep"]
import catalog  # noqa: E402
from measure import SweepStep, _optimizer  # noqa: E402
from brrr.bench.backends import fresh_compile  # noqa: E402
from brrr.bench.step import make_cotangents  # noqa: E402


def where(frames):
    keys = ("brrr/", "/torch/_inductor", "transformers/", "benchmarks/", "torch/_functorch", "torch/autograd")
    for f in frames:
        name = f.get("filename", "")
        if any(k in name for k in keys) or name.startswith("/tmp") or "<" in name:
            return f"{name.split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}"
    return "?"


def main(name, backend, steps=3):
    config = next(c for c in catalog.all_configs() if c.name == name)
    device = torch.device("cuda")
    work = config.build(device, False)
    inputs = tuple(work.inputs)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=config.precision == "amp"):
        cot = [make_cotangents(work.model(*inputs))]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    if backend == "brrr-launched":
        import brrr
        torch._dynamo.reset()
        fn = brrr.compile(work.model, cuda_graphs=False)
    else:
        fn = fresh_compile(work.model, backend)
    step = SweepStep(fn, work.model, [inputs], True, cot, autocast=config.precision == "amp",
                     optimizer=_optimizer(work, config.precision))
    peaks = []
    for _ in range(int(steps)):
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated())
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"{name} {backend}: before {before / 2**20:.0f} MiB; call peaks " + ", ".join(f"{p / 2**20:.0f}" for p in peaks))
    events = snap["device_traces"][0]
    live, held, top, at = {}, 0, 0, 0
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            held += e["size"]
            if held > top:
                top, at = held, i
        elif e["action"] in ("free_completed",) and e["addr"] in live:
            held -= live.pop(e["addr"])["size"]
    live, held = {}, 0
    for e in events[:at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    print(f"traced peak {top / 2**20:.0f} MiB over {len(events)} events (traced from before compile; "
          f"{before / 2**20:.0f} MiB allocated before are not in the trace); at: {where(events[at]['frames'])}")
    groups = collections.defaultdict(lambda: [0, 0])
    for e in live.values():
        g = groups[where(e["frames"])]
        g[0] += e["size"]
        g[1] += 1
    for key, (size, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"  {size / 2**20:9.1f} MiB {n:5d} blocks  {key}")
    print("largest blocks:")
    for e in sorted(live.values(), key=lambda e: -e["size"])[:12]:
        frames = [f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in e["frames"]
                  if "brrr" in f["filename"] or "_inductor" in f["filename"] or "<" in f["filename"]][:4]
        print(f"  {e['size'] / 2**20:9.1f} MiB  " + " <- ".join(frames))


if __name__ == "__main__":
    main(*sys.argv[1:4])
