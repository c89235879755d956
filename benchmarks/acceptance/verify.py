"""GPU acceptance for `brrr analyze --verify` (issue 18, items 1-2), run on the device machine:

    PYTHONPATH=$PWD python3 benchmarks/acceptance/verify.py --out $OUT

Two steps are analyzed and every remedy brrr can apply is measured on a copy of the model beside its
prediction (`analyze(..., verify=True)`):
- BERT-base training (`brrr.examples.bert_base`: BertModel, 8x512, loss = last_hidden_state.sum()), in fp32,
  so that the TF32 and bf16-autocast remedies apply too, with brrr.compile, its CUDA graphs, Inductor and
  the doubled batch;
- ResNet-50 inference (torchvision, random init), bf16, channels_last, batch 64 (the zoo's resnet50-infer).
Predictions are uncalibrated (a fresh table, nothing recorded) unless --calibrate: the figures are the
analyzer's own. The median |prediction error| per remedy kind over the steps is the headline; the issue asks
for at most 25% for "compile" and "cuda-graphs".

Writes <date>-<gpu>-<commit>-verify.json and -verify.txt (the printed reports and the summary) under --out
(default benchmarks/results/acceptance-verify/). `--quick` runs tiny models (a 2-layer BERT, a small conv net
when torchvision is missing) on whatever device there is, for the CPU test; `--remedies` limits the remedies
by kind (compile, cuda-graphs, inductor, bf16, tf32, channels-last, batch); `--configs` the steps.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from result_files import RESULTS, git_commit, result_stem  # noqa: E402

CONFIGS = ("bert-base-train-fp32", "resnet50-infer-bf16-channels-last")
ACCEPTANCE_KINDS = ("compile", "cuda-graphs")
MAX_MEDIAN_ERROR = 0.25


def bert_train(device, quick):
    from brrr.examples import bert, bert_base

    torch.manual_seed(0)
    if quick:
        return bert(device=device, dtype=torch.float32), True
    return bert_base(device=device, dtype=torch.float32, batch=8, seq=512), True


class TinyConvNet(torch.nn.Module):
    """Conv -> BN -> ReLU twice with a residual add, pooled into a linear head: a ResNet block in small."""

    def __init__(self, width=16):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1, self.bn2 = torch.nn.BatchNorm2d(width), torch.nn.BatchNorm2d(width)
        self.conv = torch.nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        y = torch.relu(self.bn1(self.stem(x)))
        y = torch.relu(self.bn2(self.conv(y)) + y)
        return self.head(y.mean((2, 3)))


def resnet50_infer(device, quick):
    torch.manual_seed(0)
    try:
        import torchvision

        model, batch, size = torchvision.models.resnet50(), (4 if quick else 64), (64 if quick else 224)
    except ImportError:
        if not quick:
            raise
        model, batch, size = TinyConvNet(), 4, 32
    dtype = torch.float32 if quick and device.type == "cpu" else torch.bfloat16
    model = model.to(device=device, dtype=dtype).eval().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
    return (model, (x,)), False


BUILDERS = {"bert-base-train-fp32": bert_train, "resnet50-infer-bf16-channels-last": resnet50_infer}


def run_config(name, device, quick, remedies, calibrate, console):
    from brrr.analyze import analyze
    from brrr.analyze.verify import verify

    (model, inputs), train = BUILDERS[name](device, quick)
    start = time.perf_counter()
    analysis = analyze(model, *inputs, train=train, progress=True, calibrate=calibrate)
    analyzed_s = time.perf_counter() - start
    verify(analysis, model, inputs, train=train, remedies=remedies, progress=True,
           table=None if calibrate else {}, record=calibrate)
    seconds = time.perf_counter() - start
    console.rule(f"{name}: analyzed in {analyzed_s:.1f} s, verified in {seconds - analyzed_s:.1f} s")
    analysis.print(console, top=8)
    return {"config": name, "train": train, "analysis_s": analyzed_s, "verify_s": seconds - analyzed_s,
            "wall_time_s": analysis.wall_time_s, "regimes": analysis.regimes, "verify": analysis.verify,
            "advice": analysis.advice}


def summarize(results):
    """Per remedy kind: the |uncalibrated prediction error| of each step and their median."""
    errors = {}
    for result in results:
        for row in result.get("verify", {}).get("remedies", []):
            if row["prediction_error_uncalibrated"] is not None:
                errors.setdefault(row["kind"], []).append(abs(row["prediction_error_uncalibrated"]))
    return {kind: {"errors": values, "median": statistics.median(values)} for kind, values in errors.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "acceptance-verify"))
    parser.add_argument("--quick", action="store_true", help="tiny models, any device (the CPU test)")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--remedies", help="remedy kinds to apply (default: all)")
    parser.add_argument("--calibrate", action="store_true", help="use and extend this device's calibration table")
    args = parser.parse_args(argv)

    import brrr.analyze.verify as verify_mod
    from brrr.analyze.report import json_safe

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not args.quick and device.type != "cuda":
        parser.error("the acceptance runs on a GPU; --quick runs tiny models on the CPU")
    remedies = verify_mod.REMEDIES
    if args.remedies:
        kinds = set(args.remedies.split(","))
        remedies = [r for r in remedies if r.kind in kinds]
    console = Console(record=True, width=100)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    console.print(f"brrr analyze --verify acceptance on {device_name}, torch {torch.__version__}, "
                  f"commit {git_commit()}{' (quick)' if args.quick else ''}")
    results = []
    for name in args.configs.split(","):
        try:
            results.append(run_config(name, device, args.quick, remedies, args.calibrate, console))
        except Exception as e:  # one step that cannot run (a missing package) does not stop the other
            console.print(f"{name}: failed: {type(e).__name__}: {e}")
            results.append({"config": name, "error": f"{type(e).__name__}: {e}"})
    summary = summarize(results)
    console.rule("median |prediction error| per remedy kind (uncalibrated), over the steps")
    for kind, entry in summary.items():
        mark = ""
        if kind in ACCEPTANCE_KINDS:
            mark = "  ok (<= 25%)" if entry["median"] <= MAX_MEDIAN_ERROR else "  OVER 25%"
        errors = ", ".join(f"{e:.0%}" for e in entry["errors"])
        console.print(f"{kind:14s} {entry['median']:6.1%}  ({errors}){mark}")
    stem = result_stem(args.out, device_name)
    payload = {"device": device_name, "torch": torch.__version__, "commit": git_commit(), "quick": args.quick,
               "calibrated": args.calibrate, "results": results, "median_error": summary}
    json_path = Path(f"{stem}-verify.json")
    json_path.write_text(json.dumps(json_safe(payload), indent=2))
    Path(f"{stem}-verify.txt").write_text(console.export_text())
    print(f"wrote {json_path} and {stem}-verify.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
