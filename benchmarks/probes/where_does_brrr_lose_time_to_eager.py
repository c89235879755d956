"""Where does brrr lose time to eager on the sweep configurations it runs slower (fp32 DistilBERT inference 1.05x,
DeepSpeech training 1.06x)?

Each configuration is analyzed eager and brrr-compiled (after the compiled graphs' trials), in one process: wall
and busy time, and the device time per op or kernel name, largest differences first.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_brrr_lose_time_to_eager.py CONFIG [CONFIG ...]
"""

import sys
import time
from collections import defaultdict

import torch

sys.path[:0] = ["benchmarks/sweep", "benchmarks"]


def per_name(analysis):
    seconds, calls = defaultdict(float), defaultdict(int)
    for r in analysis.ops:
        if r.time_s > 0:
            key = r.name if not r.kernel else "kernel:" + r.name[:60]
            seconds[key] += r.time_s
            calls[key] += 1
    return seconds, calls


def summary(label, a):
    r = a.regimes
    print(f"  {label:6s} wall {a.wall_time_s * 1e3:7.2f} ms, busy {a.busy_time_s * 1e3:7.2f}, compute "
          f"{r['compute'] * 1e3:.2f}, bandwidth {r['bandwidth'] * 1e3:.2f}, overhead {r['overhead'] * 1e3:.2f}, "
          f"{len(a.ops)} records")


def main(names):
    import catalog
    from brrr.analyze import analyze
    from brrr.analyze.step import Step
    from brrr.compile.backend import compile as brrr_compile

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")   # the CPU: tiny models, a check
    for name in names:
        config = next(c for c in catalog.all_configs() if c.name == name)
        work = config.build(device, device.type == "cpu")
        print(f"# {name} (train={work.train})", flush=True)
        eager = analyze(work.model, *work.inputs, train=work.train, calibrate=False)
        compiled = brrr_compile(work.model)
        step = Step(compiled, work.inputs, work.train)
        start = time.perf_counter()
        for _ in range(40):   # past the compiled-or-captured and launch-or-replay trials
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(f"  compile and 40 calls: {time.perf_counter() - start:.1f} s", flush=True)
        brrr = analyze(compiled, *work.inputs, train=work.train, calibrate=False)
        summary("eager", eager)
        summary("brrr", brrr)
        (es, ec), (bs, bc) = per_name(eager), per_name(brrr)
        keys = sorted(set(es) | set(bs), key=lambda k: -abs(bs.get(k, 0.0) - es.get(k, 0.0)))
        print(f"  {'op or kernel':64s} {'eager ms':>9s} {'calls':>5s} {'brrr ms':>9s} {'calls':>5s}")
        for k in keys[:25]:
            print(f"  {k[:64]:64s} {es.get(k, 0.0) * 1e3:9.3f} {ec.get(k, 0):5d} {bs.get(k, 0.0) * 1e3:9.3f} "
                  f"{bc.get(k, 0):5d}")
        del compiled, step, eager, brrr, work
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
