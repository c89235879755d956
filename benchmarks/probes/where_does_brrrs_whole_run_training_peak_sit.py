"""Probe: where does brrr's whole-run training peak sit, on sweep configurations where it was above Inductor's?

Per configuration, in its own process: eager steps, then brrr's (compile included) with the allocator's history
recorded. Prints each phase's peak (first call, the trials' calls, steady calls), the reserved peak, and the
blocks alive at brrr's whole-run peak grouped by the first brrr (else torch) frame that allocated them.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_brrrs_whole_run_training_peak_sit.py NAME [NAME ...]
"""

import collections
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "sweep"), os.path.join(HERE, "..", "zoo")]

STEPS = int(os.environ.get("PROBE_STEPS", 40))
MiB = 2**20


MARK = 300_032   # a call's first allocation: a small block of MARK + 512 * call bytes, freed at once


def site(frames):
    """The first frame of brrr's (the generated call's, else its runtime's), else torch's, that allocated."""
    for f in frames:
        name = f.get("filename", "")
        if name.startswith("<brrr call") or ("/brrr/" in name and "/bench/" not in name):
            return f"{name.split('/brrr/')[-1]}:{f.get('line')} {f.get('name')}"
    for f in frames:
        name = f.get("filename", "")
        if "torch/" in name and "cuda/memory" not in name and "utils/_contextlib" not in name:
            return f"torch/{name.split('torch/')[-1]}:{f.get('line')} {f.get('name')}"
    return f"{frames[0].get('filename')}:{frames[0].get('line')}" if frames else "?"


def per_call_peaks(trace, calls):
    """For each call (its window opened by its marker allocation), the traced allocated bytes at its peak and the
    blocks alive then, grouped by site."""
    marks = {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc" and MARK <= e["size"] < MARK + 512 * (calls + 1) and (e["size"] - MARK) % 512 == 0:
            marks.setdefault((e["size"] - MARK) // 512, i)
    bounds = sorted(marks.items())
    window = {}
    for k, (call, i) in enumerate(bounds):
        window[call] = (i, bounds[k + 1][1] if k + 1 < len(bounds) else len(trace))
    live, now, best = {}, 0, {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            now += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            now -= live.pop(e["addr"])["size"]
        for call, (a, b) in window.items():
            if a <= i < b and now > best.get(call, (-1, 0))[0]:
                best[call] = (now, i)
    wanted = {i: call for call, (_, i) in best.items()}
    live, out = {}, {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
        if i in wanted:
            groups = collections.Counter()
            for block in live.values():
                groups[site(block.get("frames", []))] += block["size"]
            out[wanted[i]] = (best[wanted[i]][0], groups)
    return out


def one(name):
    import torch

    import catalog
    from brrr.bench.backends import fresh_compile
    from brrr.bench.step import make_cotangents
    from measure import SweepStep, Weights, _optimizer, release

    config = next(c for c in catalog.all_configs() if c.name == name)
    device = torch.device("cuda")
    work = config.build(device, False)
    inputs = [tuple(i) for _, i in work.shapes] if work.shapes else [tuple(work.inputs)]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=config.precision == "amp"):
        cot = [make_cotangents(work.model(*i)) for i in inputs]
    base = torch.cuda.memory_allocated()
    weights = Weights(work.model)
    backends = os.environ.get("PROBE_BACKENDS", "eager,brrr").split(",")
    for backend in backends:
        release(device)
        torch.cuda.reset_peak_memory_stats()
        traced = backend == "brrr"
        if traced:
            torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
        fn = fresh_compile(work.model, backend)
        step = SweepStep(fn, work.model, inputs, True, cot, autocast=config.precision == "amp",
                         optimizer=_optimizer(work, config.precision))
        peaks, start, calls = [], time.perf_counter(), STEPS if backend != "eager" else 12
        for i in range(calls):
            if traced:
                del_me = torch.empty(MARK + 512 * i, dtype=torch.uint8, device=device)
                del del_me
            torch.cuda.reset_peak_memory_stats()
            step.cycle()
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() / MiB)
            if i == 0:
                first_s = time.perf_counter() - start
        live = torch.cuda.memory_allocated() / MiB
        reserved = torch.cuda.max_memory_reserved() / MiB
        print(f"{name} {backend}: base {base / MiB:.0f} MiB; first call {peaks[0]:.0f} ({first_s:.1f} s), "
              f"calls 2-{min(14, len(peaks))} {max(peaks[1:14]):.0f}, steady {max(peaks[14:] or peaks[-3:]):.0f}, "
              f"live after {live:.0f}; reserved peak {reserved:.0f}", flush=True)
        print(f"  per call: {' '.join(f'{p:.0f}' for p in peaks)}")
        if traced:
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            trace = snap["device_traces"][torch.cuda.current_device()]
            found = per_call_peaks(trace, calls)
            shown = set()
            for call in sorted(found):
                level = round(peaks[call] / 10)
                if level in shown:
                    continue
                shown.add(level)
                total, groups = found[call]
                print(f"  call {call + 1} (peak {peaks[call]:.0f} MiB; traced {total / MiB:.0f}):")
                for s, b in groups.most_common(8):
                    print(f"    {b / MiB:8.1f} MiB  {s}")
            from brrr.compile.runtime import replay_choice
            for d in replay_choice.DECISIONS:
                print(f"  verdict: {d}")
            # a replayed step's values against eager's from the same weights (the saved tensors a consuming
            # backward reads in place must be the forward's, not what the pool's later buffers left there)
            got, want = [], []
            for stepper in (step, SweepStep(work.model, work.model, inputs, True, cot,
                                            autocast=config.precision == "amp")):
                weights.restore()
                outs, grads = stepper.run_at(0)
                (got if stepper is step else want).append([g.float() for g in grads if g is not None])
            errors = [((a - b).norm() / b.norm().clamp_min(1e-12)).item() for a, b in zip(got[0], want[0])]
            flat = [torch.cat([g.flatten() for g in gs]) for gs in (got[0], want[0])]
            whole = ((flat[0] - flat[1]).norm() / flat[1].norm()).item()
            print(f"  gradients of a brrr step against eager's: all together {whole:.2e}, the worst one "
                  f"{max(errors):.2e} over {len(errors)}, NaN: {any(e != e for e in errors)}")
        del step, fn
        torch._dynamo.reset()


def main():
    names = sys.argv[1:]
    if len(names) == 1:
        return one(names[0])
    cores = os.cpu_count() or 1
    share = max(1, cores // len(names))
    procs = []
    for i, name in enumerate(names):
        cpus = f"{i * share}-{i * share + share - 1}"
        procs.append(subprocess.Popen(["taskset", "-c", cpus, sys.executable, __file__, name],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for name, p in zip(names, procs):
        out, _ = p.communicate()
        lines = out.splitlines()
        keep = [l for l in lines if l.startswith((name, "  ")) and not l.startswith("  File")] or lines[-30:]
        if p.returncode:
            keep += lines[-4:]
        print("\n".join(keep), flush=True)


if __name__ == "__main__":
    main()
