"""GPU acceptance for layout-aware kernels (issues 14 and 42): do they reach the copy roof?

Issue 14 (channels_last and transposes) asks for >= 85% of copy bandwidth from brrr on each of: inference batch
norm + ReLU, add + ReLU and training batch-norm statistics on a [64, 256, 56, 56] channels_last bf16 tensor, and
a [8192, 8192] bf16 transpose (`x.t().contiguous()`); the channels_last layer norm over C ([64, 56, 56, 256], a
permuted view of a channels_last tensor, ConvNeXt's layout) is timed beside them.
Runs on 2026-11-26: an H100 at 3a65eef (results/probes/2026-11-26-h100-3a65eef-layout-kernels.log): brrr at
97.9% of copy for BN+ReLU, 99.7% add+ReLU, 92.2% the transpose, 97.3% the channels_last layer norm, 55.5% BN
statistics (Inductor 69.1%); an H200 at 17e2749 (`...-h200-17e2749-layout-kernels.log`): 84.6%, 101.0%, 91.3%,
95.4%, and BN statistics 72.1% (Inductor 62.6%; NOTES says what holds them there).

Issue 42, deliverable 2 (NCHW, where the layout stays NCHW) asks for >= 80% of copy from brrr on batch norm,
group norm and pooling, and their backward ops, on the sweep's CNN shapes (cases `nchw_*`): batch norm's
training forward (statistics, normalize, ReLU, running statistics updated) and backward (ReLU's through its
saved mask, then grad of input, weight and bias), bf16 and fp32; group norm with 32 groups and with 1, forward
and backward; max_pool2d 3x3/2 pad 1 as training runs it (values and indices) and its backward; avg_pool2d 3x3/1
pad 1 without the padding in the divisor, and its backward; adaptive_avg_pool2d to 1x1 (a mean over H, W) and
its backward (the mean's: the gradient broadcast and divided). A backward case is the backward graph
AOTAutograd hands a compiler, written with the same ATen ops on what the forward saved (mean and inverse std,
the ReLU mask, the pool's indices), made by the device's own forward ops.

Each case runs under eager, brrr and Inductor in one process (brrr.bench, device time per call from a CUDA graph
where there is one) and prints its fraction of the copy roof: ideal bytes (each input read once, each output
written once; an input read only for its shape, such as a pool backward's `self`, is not counted) over the
time, over the measured copy bandwidth (brrr.cost.device.get_ceilings). Issue 42's cases are timed rotating
through copies of their inputs, a pass over which moves over 128 MB, so that small ones do not find their
inputs in L2; issue 14's (over 100 MB each) use one input set, as in their earlier logs. brrr's row is its kernels':
the run sets BRRR_CAPTURED_TRIAL=0, since on a one-op graph the compiled-or-captured trial weighs the host's time
per call (a Dynamo call's own, in both) and kept eager's kernels for group norm's backward, 24 us of brrr's against
62 of eager's (benchmarks/NOTES.md); the floor's per-kernel checks still run. On the GPU brrr runs as
`brrr-launches` (never replaying its own CUDA graph): the bench times every backend's call replayed from a CUDA
graph it captures, and a call that replays brrr's graph cannot be captured into another, so it would be timed with
its host's time and its input copies instead (group norm 1's backward read 234 us that way, against 23 us). The last lines name
the cases where brrr is under its issue's target.

    PYTHONPATH=$PWD python3 benchmarks/acceptance/layout_kernels.py               # on the GPU machine: every case
    PYTHONPATH=$PWD python3 benchmarks/acceptance/layout_kernels.py --cases nchw  # issue 42's NCHW cases only
    PYTHONPATH=$PWD python3 benchmarks/acceptance/layout_kernels.py --quick       # CPU smoke run: tiny, eager/brrr

`--cases` takes case names, prefixes of them (`nchw_bn`, `nchw_group_norm`) or tags (`issue14`, `issue42`,
`nchw`, `pool`, `forward`, `backward`). Save the output as
benchmarks/results/probes/<date>-<gpu>-<commit>-layout-kernels.log (`--json PATH` also writes the rows, after
each case).
"""

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass

ROTATE_BYTES = 128 << 20   # more than any current GPU's L2
BRRR_KERNELS = "brrr-launches"   # brrr's row on the GPU: its kernels launched, each call capturable by the bench
EPS = 1e-5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny sizes, eager and brrr only")
    p.add_argument("--backends", help="comma-separated backends (default: eager,brrr,inductor; --quick: eager,brrr)")
    p.add_argument("--cases", help="comma-separated case names, name prefixes or tags (default: all)")
    p.add_argument("--bandwidth", type=float, help="copy bandwidth in bytes/s (default: measured, get_ceilings)")
    p.add_argument("--json", help="write the rows to this JSON file")
    return p.parse_args(argv)


@dataclass(frozen=True)
class Case:
    fn: object
    make_inputs: object   # device -> tuple of inputs
    tags: tuple           # what --cases may name besides the case's name or a prefix of it
    issue: int
    target: float         # the issue's fraction of copy bandwidth for brrr
    unread: tuple = ()    # positions of inputs read only for their shape: not in the ideal bytes
    rotate: bool = True   # timed rotating through copies of the inputs (rotation())


def selected(name, case, tokens):
    return any(name == t or name.startswith(t) or t in case.tags for t in tokens)


def cases(quick):
    """name -> Case: the shapes of the acceptance, or tiny ones with --quick."""
    return {**channels_last_cases(quick), **nchw_cases(quick), **conversion_cases(quick)}


def channels_last_cases(quick):
    """Issue 14's cases: channels_last activations and a transpose."""
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

    issue14 = dict(tags=("issue14",), issue=14, target=0.85, rotate=False)   # one input set, as in their logs
    return {
        "bn_relu_inference": Case(bn_relu, lambda d: (activation(d), channel(d), channel(d, 1.0).abs(),
                                                      channel(d, 1.0), channel(d)), **issue14),
        "bn_statistics_training": Case(bn_statistics, lambda d: (activation(d),), **issue14),
        "add_relu": Case(add_relu, lambda d: (activation(d), activation(d, seed=2)), **issue14),
        "transpose": Case(transpose, lambda d: (torch.randn(side, side, generator=torch.Generator().manual_seed(3))
                                                .to(device=d, dtype=bf16),), **issue14),
        "layer_norm_channels_last": Case(layer_norm_channels_last,
                                         lambda d: (activation(d), channel(d, 1.0), channel(d)), **issue14),
    }


def nchw_cases(quick):
    """Issue 42's cases: batch norm, group norm and pooling on contiguous NCHW tensors, forward and backward."""
    import torch
    import torch.nn.functional as F

    aten = torch.ops.aten
    bf16, fp32 = torch.bfloat16, torch.float32
    everything = (True, True, True)

    def tensor(shape, dtype, device, seed=0, scale=1.0, offset=0.0):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(shape, generator=g) * scale + offset).to(device=device, dtype=dtype)

    def affine(c, dtype, device):
        return tensor(c, dtype, device, seed=1, scale=0.1, offset=1.0), tensor(c, dtype, device, seed=2, scale=0.1)

    def bn_relu_training(x, weight, bias, running_mean, running_var):
        return F.relu(F.batch_norm(x, running_mean, running_var, weight, bias, training=True))

    def bn_relu_backward(grad_out, mask, x, weight, save_mean, save_invstd):
        grad = torch.where(mask, 0, grad_out)   # ReLU's backward on the mask its forward saved, as AOTAutograd's
        return aten.native_batch_norm_backward(grad, x, weight, None, None, save_mean, save_invstd, True, EPS,
                                               everything)

    def bn_inputs(shape, dtype, backward):
        def make(device):
            x = tensor(shape, dtype, device)
            weight, bias = affine(shape[1], dtype, device)
            if not backward:
                return x, weight, bias, torch.zeros_like(weight), torch.ones_like(weight)
            y, save_mean, save_invstd = aten.native_batch_norm(x, weight, bias, None, None, True, 0.1, EPS)
            return tensor(shape, dtype, device, seed=3), y <= 0, x, weight, save_mean, save_invstd
        return make

    def group_norm(groups):
        def forward(x, weight, bias):
            return F.group_norm(x, groups, weight, bias, EPS)

        def backward(grad_out, x, mean, rstd, weight):
            n, c, h, w = x.shape
            return aten.native_group_norm_backward(grad_out, x, mean, rstd, weight, n, c, h * w, groups, everything)
        return forward, backward

    def gn_inputs(shape, groups, backward):
        def make(device):
            x = tensor(shape, bf16, device)
            weight, bias = affine(shape[1], bf16, device)
            if not backward:
                return x, weight, bias
            n, c, h, w = shape
            _, mean, rstd = aten.native_group_norm(x, weight, bias, n, c, h * w, groups, EPS)
            return tensor(shape, bf16, device, seed=3), x, mean, rstd, weight
        return make

    def max_pool(x):
        return aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])

    def max_pool_backward(grad_out, x, indices):
        return aten.max_pool2d_with_indices_backward(grad_out, x, [3, 3], [2, 2], [1, 1], [1, 1], False, indices)

    def max_pool_backward_inputs(shape):
        def make(device):
            x = tensor(shape, bf16, device)
            y, indices = max_pool(x)
            return tensor(y.shape, bf16, device, seed=3), x, indices
        return make

    def avg_pool(x):
        return F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)

    def avg_pool_backward(grad_out, x):
        return aten.avg_pool2d_backward(grad_out, x, [3, 3], [1, 1], [1, 1], False, False, None)

    def adaptive_avg_pool(x):
        return F.adaptive_avg_pool2d(x, 1)

    def adaptive_avg_pool_backward(grad_out, x):   # a mean's backward: what AOTAutograd makes of a 1x1 output
        return grad_out.expand(x.shape) / (x.shape[2] * x.shape[3])

    def pool_backward_inputs(shape, out_shape):
        return lambda d: (tensor(out_shape, bf16, d, seed=3), tensor(shape, bf16, d))

    def label(shape, dtype):
        return "x".join(map(str, shape)) + ("_bf16" if dtype == bf16 else "_fp32")

    quick_bn, quick_gn, quick_pool = (2, 8, 6, 6), (2, 32, 4, 4), (2, 4, 8, 8)
    bn_shapes = [(quick_bn, bf16)] if quick else [((64, 256, 56, 56), bf16), ((64, 64, 112, 112), bf16),
                                                   ((64, 512, 28, 28), bf16), ((64, 1024, 14, 14), bf16),
                                                   ((64, 2048, 7, 7), bf16), ((128, 64, 112, 112), fp32)]
    gn_shapes = [quick_gn] if quick else [(32, 64, 56, 56), (32, 256, 56, 56), (32, 512, 28, 28)]
    max_pool_shape = quick_pool if quick else (64, 64, 112, 112)
    avg_pool_shape = quick_pool if quick else (32, 64, 56, 56)
    adaptive_shapes = [quick_pool] if quick else [(64, 2048, 7, 7), (64, 512, 28, 28)]

    def case(fn, make, *tags, unread=()):
        return Case(fn, make, tags=("issue42", "nchw") + tags, issue=42, target=0.80, unread=unread)

    out = {}
    for shape, dtype in bn_shapes:
        out[f"nchw_bn_relu_forward_{label(shape, dtype)}"] = case(bn_relu_training, bn_inputs(shape, dtype, False),
                                                                  "forward")
        out[f"nchw_bn_relu_backward_{label(shape, dtype)}"] = case(bn_relu_backward, bn_inputs(shape, dtype, True),
                                                                   "backward")
    for shape in gn_shapes:
        for groups in (32, 1):
            forward, backward = group_norm(groups)
            name = f"nchw_group_norm{groups}_{{}}_{label(shape, bf16)}"
            out[name.format("forward")] = case(forward, gn_inputs(shape, groups, False), "forward")
            out[name.format("backward")] = case(backward, gn_inputs(shape, groups, True), "backward")
    out[f"nchw_max_pool3x3s2_forward_{label(max_pool_shape, bf16)}"] = case(
        max_pool, lambda d: (tensor(max_pool_shape, bf16, d),), "pool", "forward")
    out[f"nchw_max_pool3x3s2_backward_{label(max_pool_shape, bf16)}"] = case(
        max_pool_backward, max_pool_backward_inputs(max_pool_shape), "pool", "backward", unread=(1,))
    out[f"nchw_avg_pool3x3s1_forward_{label(avg_pool_shape, bf16)}"] = case(
        avg_pool, lambda d: (tensor(avg_pool_shape, bf16, d),), "pool", "forward")
    out[f"nchw_avg_pool3x3s1_backward_{label(avg_pool_shape, bf16)}"] = case(
        avg_pool_backward, pool_backward_inputs(avg_pool_shape, avg_pool_shape), "pool", "backward", unread=(1,))
    for shape in adaptive_shapes:
        out[f"nchw_adaptive_avg_pool1x1_forward_{label(shape, bf16)}"] = case(
            adaptive_avg_pool, lambda d, shape=shape: (tensor(shape, bf16, d),), "pool", "forward")
        out[f"nchw_adaptive_avg_pool1x1_backward_{label(shape, bf16)}"] = case(
            adaptive_avg_pool_backward, pool_backward_inputs(shape, shape[:2] + (1, 1)), "pool", "backward",
            unread=(1,))
    return out


def conversion_cases(quick):
    """Issue 42's conversions: the copies a layout pass inserts, NCHW to channels_last and back, at a stem's
    three channels (a graph input, which every converted convolution net copies once a call) and at 64."""
    import torch

    cl = torch.channels_last

    def to_channels_last(x):
        return x.contiguous(memory_format=cl)

    def to_nchw(x):
        return x.contiguous()

    def tensor(shape, dtype, memory_format):
        def make(device):
            g = torch.Generator().manual_seed(0)
            return (torch.randn(shape, generator=g).to(device=device, dtype=dtype)
                    .contiguous(memory_format=memory_format),)
        return make

    shapes = [(2, 3, 8, 8)] if quick else [(32, 3, 224, 224), (32, 64, 112, 112)]
    out = {}
    for shape in shapes:
        for dtype, suffix in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
            label = "x".join(map(str, shape)) + "_" + suffix
            tags = ("issue42", "conversion")
            out[f"convert_to_channels_last_{label}"] = Case(
                to_channels_last, tensor(shape, dtype, torch.contiguous_format), tags=tags, issue=42, target=0.80)
            out[f"convert_to_nchw_{label}"] = Case(to_nchw, tensor(shape, dtype, cl), tags=tags, issue=42,
                                                   target=0.80)
    return out


def rotation(case, inputs, nbytes, quick):
    """Copies of the inputs enough that a pass of calls over them all moves ROTATE_BYTES (ideal bytes)."""
    copies = math.ceil(ROTATE_BYTES / max(nbytes, 1)) - 1 if case.rotate and not quick else 0
    return [tuple(x.clone() for x in inputs) for _ in range(copies)]


def measure(name, case, inputs, backends, bandwidth, quick):
    """One case under each backend: a dict with its ideal bytes and, per backend, time and roof fraction."""
    import torch

    from brrr.bench import bench
    from brrr.bench.micro import ideal_bytes

    start = time.perf_counter()
    with torch.no_grad():
        read = [x for i, x in enumerate(inputs) if i not in case.unread]
        nbytes = ideal_bytes(read, case.fn(*inputs))
    result = bench(case.fn, *inputs, backends=backends, label=name, compile_warm=False, graph_timing=True,
                   input_sets=rotation(case, inputs, nbytes, quick), **(dict(warmup=1, rep=3) if quick else {}))
    rows = []
    for row in result.rows:
        seconds = row.graph_s or row.median_s
        rows.append({"backend": row.backend, "status": row.status, "reason": row.reason, "seconds": seconds,
                     "timed_by": "graph_s" if row.graph_s else "median_s",
                     "achieved_bytes_per_s": nbytes / seconds if seconds else None,
                     "fraction_of_copy_bandwidth": nbytes / seconds / bandwidth if seconds and bandwidth else None,
                     "error_vs_eager": row.error_vs_eager.to_dict() if row.error_vs_eager else None})
    return {"case": name, "issue": case.issue, "target": case.target, "ideal_bytes": nbytes,
            "copy_bandwidth": bandwidth, "wall_s": time.perf_counter() - start, "rows": rows}


def shortfalls(results):
    """Per issue, the cases where brrr is under the issue's target (or failed, or wrong): lines to print."""
    lines = []
    for issue in sorted({r["issue"] for r in results}):
        mine = [r for r in results if r["issue"] == issue]
        below = []
        for r in mine:
            row = next((row for row in r["rows"] if row["backend"] in ("brrr", BRRR_KERNELS)), None)
            frac = row and row["fraction_of_copy_bandwidth"]
            if row is None or (row["status"] == "ok" and frac is not None and frac >= r["target"]):
                continue
            below.append(f"{r['case']} ({100 * frac:.1f}%)" if row["status"] == "ok" and frac is not None
                         else f"{r['case']} ({row['status']})")
        target = f"{100 * mine[0]['target']:.0f}%"
        lines.append(f"issue {issue}: brrr below {target} of copy on {len(below)} of {len(mine)} cases"
                     + (": " + ", ".join(below) if below else ""))
    return lines


def main(argv=None):
    args = parse_args(argv)
    from unittest import mock

    # brrr's kernels, not the trial's host-time verdict; restored after, for a caller in the same process (tests)
    with mock.patch.dict(os.environ, {"BRRR_CAPTURED_TRIAL": os.environ.get("BRRR_CAPTURED_TRIAL", "0")}):
        return run(args)


def run(args):
    import torch

    if args.quick and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")   # brrr's kernels in Triton's interpreter on CPU
    elif not torch.cuda.is_available():
        print("no CUDA GPU here: use --quick for a CPU smoke run")
        return 2
    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    backends = tuple(args.backends.split(",")) if args.backends else (
        ("eager", "brrr") if args.quick else ("eager", BRRR_KERNELS, "inductor"))
    bandwidth = args.bandwidth
    if bandwidth is None:
        from brrr.cost.device import get_ceilings
        bandwidth = get_ceilings(torch.device(device)).bandwidth
    chosen = cases(args.quick)
    if args.cases:
        tokens = args.cases.split(",")
        chosen = {k: v for k, v in chosen.items() if selected(k, v, tokens)}
    width = max(map(len, chosen), default=0)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s on {device}; fraction = ideal bytes / time / copy bandwidth")
    results = []
    for name, case in chosen.items():
        data = measure(name, case, case.make_inputs(device), backends, bandwidth, args.quick)
        results.append(data)
        for row in data["rows"]:
            frac = row["fraction_of_copy_bandwidth"]
            timing = f"{row['seconds'] * 1e6:9.1f} us" if row["seconds"] else "        —"
            share = f"{100 * frac:5.1f}% of copy" if frac is not None else ""
            note = f"  {row['reason']}" if row["reason"] else ""
            print(f"{name:{width}s} {row['backend']:13s} {timing}  {share}{note}", flush=True)
        if args.json:   # after each case: a run cut off by a time limit keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"device": device, "copy_bandwidth": bandwidth, "cases": results}, f, indent=1)
    print(f"{len(results)} cases in {sum(r['wall_s'] for r in results):.0f} s")
    for line in shortfalls(results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
