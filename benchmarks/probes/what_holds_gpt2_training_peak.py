"""Probe: what holds GPT-2 LM training's peak memory under brrr (launched and replayed) and Inductor?

For the zoo's gpt2-lm-train step (8 x 1024, bf16), one step is recorded with torch.cuda.memory's history; the
allocations live at the step's peak are grouped by the Python line that allocated them."""

import linecache
import os
import sys
from collections import defaultdict

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", "zoo"), os.path.join(os.path.dirname(__file__), "..", "..")]

import torch  # noqa: E402

import models  # noqa: E402
from brrr.bench.step import Step  # noqa: E402


def where(frames, depth=3):
    """The innermost `depth` Python frames, as 'file:line name: text' joined by ' <- '."""
    out = []
    for f in frames[:depth]:
        text = linecache.getline(f["filename"], f["line"]).strip()[:80]
        out.append(f"{os.path.basename(f['filename'])}:{f['line']} {f.get('name', '')}: {text}")
    return " <- ".join(out) or "?"


def peak_report(label, step, device):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.memory._record_memory_history(max_entries=500000, stacks="python")
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated(device)
    trace = snap["device_traces"][device.index or 0]
    live, cur, best, best_live = {}, 0, 0, {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            cur += e["size"]
            if cur > best:
                best, best_live = cur, dict(live)
        elif e["action"] == "free_requested" and e["addr"] in live:
            cur -= live.pop(e["addr"])[0]
    groups = defaultdict(lambda: [0, 0])
    for size, frames in best_live.values():
        g = groups[(size, where(frames))]
        g[0] += size
        g[1] += 1
    by_size = defaultdict(lambda: [0, 0])
    for size, _ in best_live.values():
        by_size[size][0] += size
        by_size[size][1] += 1
    print(f"\n== {label}: before the step {before / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB "
          f"(traced peak {best / 2**20:.0f} MiB over the start; {len(best_live)} blocks live then)")
    print("  live at the peak by block size:", ", ".join(f"{s / 2**20:.1f} MiB x{n}" for s, (t, n) in
                                                      sorted(by_size.items(), key=lambda kv: -kv[1][0])[:14]))
    for (size, key), (total, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:30]:
        print(f"  {total / 2**20:8.1f} MiB  x{n:<4d} {key}")


def main():
    device = torch.device("cuda")
    cfg = next(c for c in models.CONFIGS if c.name == "gpt2-lm-train")
    print(f"probe what_holds_gpt2_training_peak; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    import brrr
    from brrr.bench.backends import skip_logging_in_graphs
    runs = [("brrr launched", dict(cuda_graphs=False)), ("brrr replayed", dict(cuda_graphs=True))]
    for label, options in runs:
        torch._dynamo.reset()
        work = cfg.build(device, torch.bfloat16, False)
        fn = torch.compile(work.model) if options is None else brrr.compile(work.model, **options)
        step = Step(fn, work.model, [work.inputs], True)
        with skip_logging_in_graphs():
            for _ in range(16):
                step()
            peak_report(label, step, device)
        params = sum(p.numel() * p.element_size() for p in work.model.parameters())
        print(f"  parameters {params / 2**20:.0f} MiB")
        del fn, step, work
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
