"""The suite's memory-bound micro-benchmarks: softmax, layer norm, RMS norm, bias+GELU, cross-entropy.

Each has its ideal traffic — every input read once, every output written once (brrr.cost.ops.tensor_bytes)
— and a hand count of FLOPs per element, so a time turns into achieved bandwidth and a fraction of the
measured copy bandwidth. Timing rotates through enough input sets to exceed `rotate_bytes` (default
128 MB, over any current GPU's L2), so no call finds its inputs in cache.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from brrr.bench.runner import bench


def softmax(x):
    return torch.softmax(x, dim=-1)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


def rms_norm(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def bias_gelu(x, bias):
    return F.gelu(x + bias)


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


@dataclass(frozen=True)
class Micro:
    fn: object
    flops_per_element: int   # per element of the [rows, cols] input, counted by hand
    make_inputs: object      # (rows, cols, dtype, device, generator) -> tuple


def _x(rows, cols, dtype, device, g):
    return torch.randn(rows, cols, generator=g).to(device=device, dtype=dtype)


def _vec(cols, dtype, device, g, offset=0.0):
    return (torch.randn(cols, generator=g) * 0.1 + offset).to(device=device, dtype=dtype)


MICROS = {
    # max, subtract, exp, sum, divide
    "softmax": Micro(softmax, 5, lambda r, c, d, dev, g: (_x(r, c, d, dev, g),)),
    # mean, subtract, square, sum, rsqrt-scale, weight multiply, bias add (+ rounding)
    "layer_norm": Micro(layer_norm, 8, lambda r, c, d, dev, g: (_x(r, c, d, dev, g), _vec(c, d, dev, g, 1.0),
                                                                _vec(c, d, dev, g))),
    # square, sum, scale, weight multiply
    "rms_norm": Micro(rms_norm, 4, lambda r, c, d, dev, g: (_x(r, c, d, dev, g), _vec(c, d, dev, g, 1.0))),
    # add, then erf-GELU: 0.5 * x * (1 + erf(x / sqrt 2)) ~ 8
    "bias_gelu": Micro(bias_gelu, 9, lambda r, c, d, dev, g: (_x(r, c, d, dev, g), _vec(c, d, dev, g))),
    # max, subtract, exp, sum (log-sum-exp), then a gather and a mean per row
    "cross_entropy": Micro(cross_entropy, 4, lambda r, c, d, dev, g: (
        _x(r, c, d, dev, g), torch.randint(0, c, (r,), generator=g).to(device=dev))),
}


def ideal_bytes(inputs, output):
    """Each input read once, each output written once."""
    from brrr.bench.compare import flatten_tensors

    try:
        from brrr.cost.ops import tensor_bytes
    except ImportError:
        tensor_bytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)] + flatten_tensors(output)
    return sum(tensor_bytes(t) for t in tensors)


def rotation_sets(micro, rows, cols, dtype, device, rotate_bytes, seed=0):
    """Input sets enough to total more than `rotate_bytes` (the first is the one checked for correctness)."""
    g = torch.Generator().manual_seed(seed)
    first = micro.make_inputs(rows, cols, dtype, device, g)
    per_set = sum(x.numel() * x.element_size() for x in first)
    count = max(1, -(-rotate_bytes // per_set))
    return [first] + [micro.make_inputs(rows, cols, dtype, device, g) for _ in range(count - 1)]


def run_micro(name, rows, cols, dtype=torch.bfloat16, device="cuda", backends=("eager", "inductor", "brrr"),
              bandwidth=None, rotate_bytes=128 * 2**20, progress=False, warmup=25, rep=100, compile_warm=False):
    """Bench one micro-benchmark; returns a dict with the bench rows plus bytes, FLOPs and bandwidth use."""
    micro = MICROS[name]
    sets = rotation_sets(micro, rows, cols, dtype, device, rotate_bytes)
    with torch.no_grad():
        nbytes = ideal_bytes(sets[0], micro.fn(*sets[0]))
    flops = micro.flops_per_element * rows * cols
    result = bench(micro.fn, *sets[0], backends=backends, input_sets=sets[1:], progress=progress, device=device,
                   warmup=warmup, rep=rep, label=f"{name} [{rows}, {cols}]", compile_warm=compile_warm,
                   graph_timing=True)
    out = result.to_dict()
    out.update(op=name, shape=[rows, cols], ideal_bytes=nbytes, flops=flops, input_sets=len(sets),
               copy_bandwidth=bandwidth)
    for row in out["rows"]:
        # the kernel's own time where a CUDA graph gave it: do_bench's per-call events and launch gaps are
        # a large part of a 10-30 us kernel's time_kernel
        t = row.get("graph_s") or row["median_s"]
        row["bandwidth_timed_by"] = "graph_s" if row.get("graph_s") else "median_s"
        row["achieved_bytes_per_s"] = nbytes / t if t else None
        row["fraction_of_copy_bandwidth"] = nbytes / t / bandwidth if t and bandwidth else None
        row["achieved_flops_per_s"] = flops / t if t else None
    return out, result
