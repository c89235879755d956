"""GPU acceptance for compiled kernels on the roofline and `--trace` (issue 18, items 3 and 4), on the device machine:

    PYTHONPATH=$PWD python3 benchmarks/acceptance/trace.py --out $OUT [--train] [--batch 8 --seq 512]

Analyzes a brrr-compiled BERT-base bf16 step (inference by default) on CUDA, writes its Chrome/Perfetto trace and
checks it: loaded with Perfetto's trace processor when the `perfetto` package is importable and its binary can
start (it is fetched on first use: offline it can't), else validated as Chrome trace JSON
(brrr.analyze.trace.validate). Prints how many of the kernels compiled code launched got FLOPs and bytes (every
brrr kernel must), a few of them with their module, roofline fraction and regime, and the slowest that got none.
Exits 1 when a check fails. Writes `<date>-<gpu>-<commit>-bert-base-bf16-{infer,train}.trace.json` and the
analysis JSON beside it under --out (default benchmarks/results/acceptance-trace/).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from result_files import RESULTS, result_stem  # noqa: E402


def load_with_trace_processor(path):
    """(slice count, None) from Perfetto's trace processor, or (None, why it could not run)."""
    try:
        from perfetto.trace_processor import TraceProcessor
    except ImportError:
        return None, "perfetto is not installed"
    try:
        processor = TraceProcessor(trace=str(path))
    except Exception as e:   # its binary is downloaded on first use
        return None, f"trace_processor could not start: {type(e).__name__}: {e}"
    try:
        rows = list(processor.query("select count(*) as n from slice"))
        return rows[0].n, None
    finally:
        processor.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "acceptance-trace"))
    parser.add_argument("--train", action="store_true", help="a forward+backward step")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--example", default="bert-base", help="bert-base; bert (2 small layers) for a CPU dry run")
    args = parser.parse_args()

    import brrr
    from brrr.analyze.trace import validate
    from brrr.examples import build_example

    device = torch.device(args.device)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, inputs = build_example(args.example, device=device, dtype=dtype, batch=args.batch, seq=args.seq)
    if args.train:
        model.train()
    compiled = brrr.compile(model)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}, triton {_triton_version()}; brrr-compiled {args.example} {dtype} "
          f"{args.batch}x{args.seq} {'train' if args.train else 'inference'}")
    analysis = brrr.analyze(compiled, *inputs, train=args.train)
    stem = result_stem(args.out, name)
    what = f"{args.example}-{str(dtype).split('.')[-1]}-{'train' if args.train else 'infer'}"
    trace_path = Path(f"{stem}-{what}.trace.json")
    analysis.save_trace(str(trace_path))
    analysis.save_json(f"{stem}-{what}-analysis.json")
    print(f"wrote {trace_path} ({trace_path.stat().st_size / 1e6:.1f} MB)")

    failures = []
    slices = validate(json.loads(trace_path.read_text()))
    print(f"trace JSON: {len(slices)} slices, valid Chrome trace")
    count, why = load_with_trace_processor(trace_path)
    print(f"trace_processor: {count} slices" if count is not None else f"trace_processor: not run ({why})")
    if count is not None and count < len(slices):
        failures.append(f"trace_processor read {count} slices of {len(slices)}")

    kernels = [r for r in analysis.ops if r.kernel]
    priced = [r for r in kernels if not r.unpriced]
    brrr_kernels = [r for r in kernels if r.name.startswith("brrr_")]
    unpriced_brrr = [r for r in brrr_kernels if r.unpriced]
    total = sum(r.time_s for r in kernels) or 1.0
    print(f"kernels launched by compiled code: {len(kernels)} ({sum(r.time_s for r in kernels) * 1e3:.2f} ms); "
          f"with FLOPs and bytes: {len(priced)} ({sum(r.time_s for r in priced) / total:.0%} of their time); "
          f"brrr kernels: {len(brrr_kernels)}, of them without numbers: {len(unpriced_brrr)}")
    if not brrr_kernels:
        failures.append("no brrr kernel was seen by the profiler")
    if unpriced_brrr:
        failures.append(f"brrr kernels without FLOPs/bytes: {[r.name for r in unpriced_brrr[:5]]}")
    print("slowest kernels with numbers:")
    for r in sorted(priced, key=lambda r: -r.time_s)[:8]:
        fraction = r.roofline_time_s / r.time_s if r.time_s else 0.0
        print(f"  {r.name:45s} {r.module[:40]:40s} {r.phase:8s} {r.time_s * 1e6:8.1f} us  {r.flops / 1e6:9.2f} MFLOP "
              f"{r.bytes / 1e6:8.2f} MB  {fraction:6.1%} of roof  {r.regime}")
    for r in sorted(kernels, key=lambda r: -r.time_s)[:5]:
        if r.unpriced:
            print(f"  without numbers: {r.name} {r.time_s * 1e6:.1f} us")
    on_device = [s for s in slices if s["pid"] == 2]
    print(f"device slices: {len(on_device)}; host slices: {len(slices) - len(on_device)}")
    if device.type == "cuda" and not on_device:
        failures.append("no device slice in the trace")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("OK" if not failures else "FAILED")
    sys.exit(1 if failures else 0)


def _triton_version():
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "-"


if __name__ == "__main__":
    main()
