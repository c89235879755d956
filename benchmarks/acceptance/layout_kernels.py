"""GPU acceptance for layout-aware kernels (issue 14): do they reach the copy roof on channels_last and
transposed tensors?

Runs on 2026-11-26: an H100 at 3a65eef (results/probes/2026-11-26-h100-3a65eef-layout-kernels.log): brrr at
97.9% of copy for BN+ReLU, 99.7% add+ReLU, 92.2% the transpose, 97.3% the channels_last layer norm, 55.5% BN
statistics (Inductor 69.1%); an H200 at 17e2749 (`...-h200-17e2749-layout-kernels.log`): 84.6%, 101.0%, 91.3%,
95.4%, and BN statistics 72.1% (Inductor 62.6%; NOTES says what holds them there).
The acceptance asks for >= 85% of copy bandwidth from brrr on each of: inference batch norm + ReLU, add + ReLU
and training batch-norm statistics on a [64, 256, 56, 56] channels_last bf16 tensor, and a [8192, 8192] bf16
transpose (`x.t().contiguous()`); the channels_last layer norm over C ([64, 56, 56, 256], a permuted view of a
channels_last tensor, ConvNeXt's layout) is timed beside them. Each case runs under eager, brrr and Inductor in
one process (brrr.bench, device time per call from a CUDA graph where there is one) and prints its fraction of
the copy roof: ideal bytes (each input read once, each output written once) over the time, over the measured
copy bandwidth (brrr.cost.device.get_ceilings).

    PYTHONPATH=$PWD python3 benchmarks/acceptance/layout_kernels.py            # on the GPU machine
    PYTHONPATH=$PWD python3 benchmarks/acceptance/layout_kernels.py --quick    # CPU smoke run: tiny sizes, eager/brrr

Save the output as benchmarks/results/probes/<date>-<gpu>-<commit>-layout-kernels.log (`--json PATH` also
writes the rows).
"""

import argparse
import json
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny sizes, eager and brrr only")
    p.add_argument("--backends", help="comma-separated backends (default: eager,brrr,inductor; --quick: eager,brrr)")
    p.add_argument("--cases", help="comma-separated subset of the cases (default: all)")
    p.add_argument("--bandwidth", type=float, help="copy bandwidth in bytes/s (default: measured, get_ceilings)")
    p.add_argument("--json", help="write the rows to this JSON file")
    return p.parse_args(argv)


def cases(quick):
    """name -> (fn, make_inputs(device)): the shapes of the acceptance, or tiny ones with --quick."""
    import torch
    import torch.nn.functional as F

    n, c, h, w = (2, 8, 6, 6) if quick else (64, 256, 56, 56)
    side = 48 if quick else 8192
    bf16 = torch.bfloat16

    def activation(device, seed=0):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, c, h, w, generator=g).to(device=device, dtype=bf16).contiguous(
            memory_format=torch.channels_last)

    def channel(device, offset=0.0, seed=1):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(c, generator=g) * 0.1 + offset).to(device=device, dtype=bf16)

    def bn_relu(x, mean, var, weight, bias):
        return F.relu(F.batch_norm(x, mean, var, weight, bias, training=False))

    def bn_statistics(x):
        return torch.var_mean(x, dim=(0, 2, 3), correction=0)

    def add_relu(x, y):
        return F.relu(x + y)

    def transpose(x):
        return x.t().contiguous()

    def layer_norm_channels_last(x, weight, bias):
        return F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), weight, bias)

    return {
        "bn_relu_inference": (bn_relu, lambda d: (activation(d), channel(d), channel(d, 1.0).abs(),
                                                  channel(d, 1.0), channel(d))),
        "bn_statistics_training": (bn_statistics, lambda d: (activation(d),)),
        "add_relu": (add_relu, lambda d: (activation(d), activation(d, seed=2))),
        "transpose": (transpose, lambda d: (torch.randn(side, side, generator=torch.Generator().manual_seed(3))
                                            .to(device=d, dtype=bf16),)),
        "layer_norm_channels_last": (layer_norm_channels_last, lambda d: (activation(d), channel(d, 1.0), channel(d))),
    }


def measure(name, fn, inputs, backends, bandwidth, quick):
    """One case under each backend: a dict with its ideal bytes and, per backend, time and roof fraction."""
    import torch

    from brrr.bench import bench
    from brrr.bench.micro import ideal_bytes

    with torch.no_grad():
        nbytes = ideal_bytes(inputs, fn(*inputs))
    result = bench(fn, *inputs, backends=backends, label=name, compile_warm=False, graph_timing=True,
                   **(dict(warmup=1, rep=3) if quick else {}))
    rows = []
    for row in result.rows:
        seconds = row.graph_s or row.median_s
        rows.append({"backend": row.backend, "status": row.status, "reason": row.reason, "seconds": seconds,
                     "timed_by": "graph_s" if row.graph_s else "median_s",
                     "achieved_bytes_per_s": nbytes / seconds if seconds else None,
                     "fraction_of_copy_bandwidth": nbytes / seconds / bandwidth if seconds and bandwidth else None})
    return {"case": name, "ideal_bytes": nbytes, "copy_bandwidth": bandwidth, "rows": rows}


def main(argv=None):
    args = parse_args(argv)
    import torch

    if args.quick and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")   # brrr's kernels in Triton's interpreter on CPU
    elif not torch.cuda.is_available():
        print("no CUDA GPU here: use --quick for a CPU smoke run")
        return 2
    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    backends = tuple(args.backends.split(",")) if args.backends else (
        ("eager", "brrr") if args.quick else ("eager", "brrr", "inductor"))
    bandwidth = args.bandwidth
    if bandwidth is None:
        from brrr.cost.device import get_ceilings
        bandwidth = get_ceilings(torch.device(device)).bandwidth
    chosen = cases(args.quick)
    if args.cases:
        chosen = {k: v for k, v in chosen.items() if k in args.cases.split(",")}
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s on {device}; fraction = ideal bytes / time / copy bandwidth")
    results = []
    for name, (fn, make_inputs) in chosen.items():
        data = measure(name, fn, make_inputs(device), backends, bandwidth, args.quick)
        results.append(data)
        for row in data["rows"]:
            frac = row["fraction_of_copy_bandwidth"]
            timing = f"{row['seconds'] * 1e6:9.1f} us" if row["seconds"] else "        —"
            share = f"{100 * frac:5.1f}% of copy" if frac is not None else ""
            note = f"  {row['reason']}" if row["reason"] else ""
            print(f"{name:26s} {row['backend']:10s} {timing}  {share}{note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "copy_bandwidth": bandwidth, "cases": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
