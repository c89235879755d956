"""Why does BERT MLM's training step cost more launched in a timed loop than its launch-or-replay trial says?

Not yet run. On one H100 (results/zoo/2026-11-26-h100-d9e3506-training.md) the trial's cheapest launched calls
summed to 10.48 ms (forward 4.67, backward 5.81) and the replayed ones to 10.19, yet the launched step measured
16.20 ms by do_bench and 12.94 back to back (both replayed: 10.41 on another host). Every other zoo model's
trial agrees with its loop within 5%. Prediction: the launched step's host time per graph call is as the
trial says, and the extra is outside the graph calls (autograd's engine, gradients allocated afresh each step,
Python's cyclic GC over a large heap), which a per-graph trial cannot see.

brrr with cuda_graphs False and True on the zoo's bert-mlm-train (bf16, 8x512): per step, the wall time back
to back, each graph call's host time and event time (median of 30 steps), the rest of the step, do_bench's
median with its L2 flush, and cProfile's top functions over 10 launched steps.

    PYTHONPATH=$PWD python3 benchmarks/probes/why_bert_mlm_launches_cost_more_in_the_loop.py [CONFIG ...]

Also asked of densenet121-train, which measured 0.96x eager at d9e3506 (eager 35.24 ms, brrr 36.83; back to
back 40.02 / 39.84) with its backward never replaying ("could not capture or replay these inputs"): for each
compiled graph under cuda_graphs=True, whether its CUDA graph captured, failed, or refused moved inputs.
"""

import cProfile
import gc
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "zoo"), str(HERE.parent)]


def main():
    import models

    for name in sys.argv[1:] or ["bert-mlm-train"]:
        print(f"\n# {name}")
        one_config(models.BY_NAME[name].build("cuda", torch.bfloat16, False))
    return 0


def one_config(work):
    from triton.testing import do_bench

    import brrr
    from brrr.bench.step import Step, make_cotangents
    from brrr.compile.runtime import CompiledGraph

    calls, graphs_seen = [], {}
    original = CompiledGraph.__call__

    def timed(self, *args):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        out = original(self, *args)
        host = time.perf_counter() - t0
        end.record()
        calls.append((self.kind, host, start, end))
        graphs_seen[id(self)] = self
        return out
    CompiledGraph.__call__ = timed
    cotangents = make_cotangents(work.model(*work.inputs))
    for graphs in (False, True):
        torch._dynamo.reset()
        step = Step(brrr.compile(work.model, cuda_graphs=graphs), work.model, [work.inputs], True, cotangents)
        for _ in range(15):
            step()
        torch.cuda.synchronize()
        calls.clear()
        walls = []
        for _ in range(30):
            t0 = time.perf_counter()
            step()
            walls.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        per_kind = {}
        for kind, host, s, e in calls:
            per_kind.setdefault(kind, []).append((host, s.elapsed_time(e) / 1e3))
        t0 = time.perf_counter()
        for _ in range(30):
            step()
        torch.cuda.synchronize()
        back_to_back = (time.perf_counter() - t0) / 30
        gc_before = gc.get_count()
        bench_ms = do_bench(step, warmup=25, rep=300)
        print(f"\n## cuda_graphs={graphs}")
        print(f"back to back {back_to_back * 1e3:.2f} ms/step; do_bench median {bench_ms:.2f} ms; "
              f"host wall per step (no sync) median {statistics.median(walls) * 1e3:.2f} ms, "
              f"max {max(walls) * 1e3:.2f}; gc counts {gc_before}")
        inside = 0.0
        for kind, rows in per_kind.items():
            hosts, devs = [r[0] for r in rows], [r[1] for r in rows]
            inside += statistics.median(hosts)
            print(f"  {kind:9s} graph: host {statistics.median(hosts) * 1e3:.2f} ms (min {min(hosts) * 1e3:.2f}, "
                  f"max {max(hosts) * 1e3:.2f}), events {statistics.median(devs) * 1e3:.2f} ms "
                  f"(min {min(devs) * 1e3:.2f}, max {max(devs) * 1e3:.2f}), {len(rows)} calls")
        print(f"  host outside the graph calls: {(statistics.median(walls) - inside) * 1e3:.2f} ms/step")
        if graphs:
            for g in graphs_seen.values():
                gr = g.graphed
                state = "no graph" if gr is None else (
                    f"captured={gr.graph is not None} failed={gr.failed} refusals={gr.refusals} "
                    f"pin={len(g.pin)} copied_in={len(getattr(gr, 'copied_in', []))}")
                print(f"  {g.kind} graph: {state}")
        graphs_seen.clear()
        if not graphs:
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            print("\n".join(line for line in text.getvalue().splitlines()[:45] if line.strip()))
    CompiledGraph.__call__ = original


if __name__ == "__main__":
    sys.exit(main())
