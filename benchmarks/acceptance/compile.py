"""GPU acceptance for the compiler (issue 3), run on the device machine:

    PYTHONPATH=$PWD python3 benchmarks/acceptance/compile.py --out $OUT [--parts micro,mlp,bert]

micro: softmax and layer norm, bf16, [16384, 1024] and [4096, 4096], as a fraction of the measured copy
       bandwidth, timed from CUDA-graph replays (the kernels' own time) beside do_bench per call.
mlp:   the seed MLP, bf16, batch 16384: inference and a training step; eager, brrr, brrr with CUDA graphs
       and Inductor (last), in one process.
bert:  BERT-base, bf16, 8x512: training step and inference, the same backends; cold compile
       (parts bert-train / bert-inference run one of the two). gpt2: the same for GPT-2 small.
Every configuration's table is printed; all numbers go to <out>/<date>-<gpu>-<commit>.json (default <out>:
benchmarks/results/acceptance-compile/; keep the printed output beside it as <date>-<gpu>-<commit>.log).
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from rich.console import Console

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "suite"), str(HERE.parent)]  # suite_sections; result_files

from result_files import RESULTS, git_commit, result_stem  # noqa: E402

# Inductor last: its compile workers start up in the background and slow the host for whoever is timed next
# (NOTES.md, "How far can one host be trusted?"), which matters for host-bound steps
BACKENDS = ("eager", "brrr", "brrr-cudagraphs", "inductor")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", str(RESULTS / "acceptance-compile")))
    p.add_argument("--commit", help="the commit measured, for the file names "
                                    "(default: git rev-parse --short HEAD, else 'nogit')")
    p.add_argument("--parts", default="micro,mlp,bert")
    p.add_argument("--budget-s", type=float, default=540.0)
    args = p.parse_args()
    import triton

    import suite_sections as suite
    from brrr.bench.micro import run_micro
    from brrr.cost.device import get_ceilings
    from brrr.examples import build_example, mlp

    console = Console(width=200)
    budget = suite.Budget(args.budget_s)
    ceilings = get_ceilings("cuda", progress=False)
    commit = args.commit or git_commit()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "commit": commit, "copy_bandwidth": ceilings.bandwidth}
    path = f"{result_stem(args.out, torch.cuda.get_device_name(), commit=commit)}.json"

    def save():
        with open(path, "w") as f:
            json.dump(results, f, indent=1, default=str)

    parts = args.parts.split(",")
    if "micro" in parts:
        for name in ("softmax", "layer_norm"):
            for rows, cols in ((16384, 1024), (4096, 4096)):
                def one(name=name, rows=rows, cols=cols):
                    data, result = run_micro(name, rows, cols, dtype=torch.bfloat16, device="cuda",
                                             bandwidth=ceilings.bandwidth, progress=False)
                    result.print(console)
                    console.print(", ".join(f"{r['backend']}: {100 * r['fraction_of_copy_bandwidth']:.1f}% of copy "
                                            f"(by {r['bandwidth_timed_by']})" for r in data["rows"]
                                            if r["fraction_of_copy_bandwidth"]))
                    return data
                results[f"micro {name} [{rows}, {cols}]"] = suite.guarded(budget, one)
                save()
    if "mlp" in parts:
        for train in (False, True):
            model, inputs = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
            results[f"mlp bf16 16384 {'train' if train else 'inference'}"] = suite.guarded(
                budget, suite._bench_config, console, model, inputs,
                backends=BACKENDS, train=train, progress=False,
                warmup=25, rep=100, label="seed MLP dim 1024, batch 16384", compile_warm=False, graph_timing=True)
            save()
    for part, example in (("bert", "bert-base"), ("gpt2", "gpt2-small")):
        for mode in ("train", "inference"):
            if f"{part}-{mode}" not in parts and part not in parts:
                continue

            def one(example=example, train=mode == "train"):
                model, inputs = build_example(example, device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
                wrapped = suite.HiddenStates(model, use_cache_kwarg=example.startswith("gpt2"))
                return suite._bench_config(console, wrapped, inputs, backends=BACKENDS, train=train,
                                           progress=False, warmup=25, rep=100, label=f"{example} ids 8x512",
                                           compile_warm=False)
            results[f"{example} bf16 8x512 {mode}"] = suite.guarded(budget, one)
            save()
    save()
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
