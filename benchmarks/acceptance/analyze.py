"""GPU acceptance for `brrr analyze` (issue 2), run on the device machine:

    PYTHONPATH=$PWD python3 benchmarks/acceptance/analyze.py --out $OUT

1. `brrr ceilings` (fresh): copy bandwidth and bf16 matmul against ~3.0 TB/s and ~740 TFLOP/s.
2. `brrr analyze` on BERT-base (bf16, 8x512, eager inference): the op-class table, from the profiler's
   kernel times, each kernel attributed to the ATen op that launched it.
3. The cost of analyzing one step against an eager step (ceilings already cached): the first analysis in the
   process on its own, then the median ratio over ten, each between two eager measurements.
4. `brrr experiment repeat` in fp32 with Inductor: where the knee falls.
5. `brrr analyze --example mlp --device cuda` as a user runs it: a process that must exit (a lazy CUPTI
   teardown left pending once hung the process at exit).
Writes <date>-<gpu>-<commit>.json under --out (default benchmarks/results/acceptance-analyze/), and beside it
the BERT report (`-bert-base-bf16-analysis.json/.html`, `-bert-base-bf16-roofline.png`) and the repeat plot
(`-repeat-fp32-inductor.png`); keep the printed output as `<date>-<gpu>-<commit>.log` next to them.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from result_files import RESULTS, git_commit, result_stem  # noqa: E402


def eager_step_time(model, inputs, reps=20):
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            model(*inputs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def analysis_cost(model, inputs, analyses=10):
    """Analysis time against an eager step, each analysis between two eager measurements (the lent hosts change
    speed within a run, so a ratio is taken per analysis and the median reported). The first analysis in the
    process, which also loads CUPTI, is reported on its own."""
    import brrr
    import brrr.analyze  # noqa: F401  (the package module, whose _replayed_run is counted)

    analyze_module = sys.modules["brrr.analyze"]
    real_replay, replays = analyze_module._replayed_run, {"matched": 0, "failed": 0}

    def counted_replay(*args):  # how many analyses timed their known step without the tracer
        timed = real_replay(*args)
        replays["matched" if timed is not None else "failed"] += 1
        return timed

    analyze_module._replayed_run = counted_replay
    ratios, totals, eagers, walls = [], [], [], []
    first = None
    for i in range(analyses + 1):
        before = eager_step_time(model, inputs, reps=10)
        torch.cuda.synchronize()
        start = time.perf_counter()
        analysis = brrr.analyze(model, *inputs)
        seconds = time.perf_counter() - start
        eager = (before + eager_step_time(model, inputs, reps=10)) / 2
        if i == 0:
            first = (seconds, seconds / eager)
            continue
        ratios.append(seconds / eager)
        totals.append(seconds)
        eagers.append(eager)
        walls.append(analysis.wall_time_s)
    analyze_module._replayed_run = real_replay
    return {"replays": replays, "ratios": ratios, "eager_steps_s": eagers, "analysis_walls_s": walls,
            "first_analyze_s": first[0], "first_analyze_over_eager": first[1], "analyses": analyses,
            "analyze_s": statistics.median(totals), "eager_step_s": statistics.median(eagers),
            "analyze_over_eager": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def cli_exit_check(timeout_s=180):
    """Run the CLI in its own process; it must write its JSON and exit, within timeout_s."""
    path = os.path.join(tempfile.mkdtemp(prefix="brrr-cli-"), "cli-mlp.json")
    command = [sys.executable, "-m", "brrr.cli", "analyze", "--example", "mlp", "--device", "cuda", "--json", path]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        code = done.returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    return {"exit_code": code, "seconds": time.perf_counter() - start, "json_written": os.path.exists(path)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", str(RESULTS / "acceptance-analyze")))
    parser.add_argument("--commit", help="the commit measured, for the file names "
                                         "(default: git rev-parse --short HEAD, else 'nogit')")
    parser.add_argument("--skip-repeat", action="store_true")
    args = parser.parse_args()
    console = Console(width=140)
    commit = args.commit or git_commit()
    stem = str(result_stem(args.out, torch.cuda.get_device_name(), commit=commit))
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": commit}
    import triton

    results["triton"] = triton.__version__

    import brrr
    import brrr.analyze  # noqa: F401  (the package module, whose _replayed_run is counted)
    from brrr.cost.device import get_ceilings, print_ceilings
    from brrr.examples import bert_base

    ceilings = get_ceilings("cuda", refresh=True, progress=False)
    print_ceilings(ceilings, console)
    results["ceilings"] = ceilings.to_dict()
    results["ceilings_check"] = {
        "copy_TBps": ceilings.bandwidth / 1e12, "copy_within_10pct_of_3.0": abs(ceilings.bandwidth / 3.0e12 - 1) <= 0.10,
        "bf16_TFLOPs": ceilings.matmul["bf16"] / 1e12,
        "bf16_within_10pct_of_740": abs(ceilings.matmul["bf16"] / 740e12 - 1) <= 0.10,
    }

    model, inputs = bert_base(device="cuda", dtype=torch.bfloat16)
    cost = analysis_cost(model, inputs)
    analysis = brrr.analyze(model, *inputs)
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(brrr.analyze, model, *inputs)  # where an analysis spends its time, for the notes
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    analysis.print(console)
    analysis.save_json(f"{stem}-bert-base-bf16-analysis.json")
    analysis.save_png(f"{stem}-bert-base-bf16-roofline.png")
    analysis.save_html(f"{stem}-bert-base-bf16-analysis.html")
    results["bert_base_bf16"] = {
        **cost, "op_classes": analysis.op_classes, "regimes": analysis.regimes, "wall_time_s": analysis.wall_time_s,
    }
    console.print(f"BERT-base bf16 8x512: the first analysis in the process {cost['first_analyze_s'] * 1e3:.0f} ms "
                  f"({cost['first_analyze_over_eager']:.1f}x, CUPTI's one-time load included); then "
                  f"{cost['analyze_s'] * 1e3:.0f} ms against an eager step of {cost['eager_step_s'] * 1e3:.2f} ms: "
                  f"{cost['analyze_over_eager']:.1f}x (median of {cost['analyses']}, range "
                  f"{cost['ratio_min']:.1f}-{cost['ratio_max']:.1f}x); replays of the known step {cost['replays']}")
    wall_over_eager = [w / e for w, e in zip(cost["analysis_walls_s"], cost["eager_steps_s"])]
    console.print(f"each analysis's wall time against the eager step around it: median "
                  f"{statistics.median(wall_over_eager):.3f}, range {min(wall_over_eager):.3f}-{max(wall_over_eager):.3f}")

    if not args.skip_repeat:
        from brrr.experiments import repeat

        rep = repeat.run(backend="inductor", device=torch.device("cuda"), dtype=torch.float32,
                         png=f"{stem}-repeat-fp32-inductor.png", progress=False)
        results["repeat_fp32_inductor"] = rep

    results["cli_exit"] = cli_exit_check()
    console.print(f"brrr analyze --example mlp (a separate process): {results['cli_exit']}")

    with open(f"{stem}.json", "w") as f:
        json.dump(results, f, indent=2, default=str)
    console.print(f"wrote {stem}.json")


if __name__ == "__main__":
    main()
