"""What holds inference batch norm + ReLU under the copy roof on an H200?

On an H200 brrr's BN+ReLU over [64, 256, 56, 56] bf16 channels_last read 84.6% of copy (Inductor 74.2%) where
add+ReLU read 101% and an H100 gave 97.9% (`results/probes/2026-11-26-h200-17e2749-layout-kernels.log`). brrr's
kernel recomputes the channel's inverse standard deviation for every element: four per-channel loads, a square
root and a division, then the scale, the shift, a rounding to bf16 (eager's batch_norm output) and the ReLU.

Prediction: the per-element channel math, not the bytes, is the limit on the H200 (40% more bytes per SM cycle
than the H100): `tl.rsqrt` in place of `1 / tl.sqrt` gains a few points, and a per-channel scale and shift
computed once (two loads and an FMA per element) reaches ~97%, even counting the small kernel that computes them.

Each variant is timed by device time (ten calls replayed from a CUDA graph) and checked against eager.

    PYTHONPATH=$PWD python3 benchmarks/probes/what_holds_inference_batch_norm_under_the_roof_on_an_h200.py
"""

import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from brrr.bench.timing import time_graph

N, C, H, W = 64, 256, 56, 56


@triton.jit
def bn_relu(x_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, out_ptr, XBLOCK: tl.constexpr, RSQRT: tl.constexpr):
    """brrr's generated BN+ReLU (GPU form): the channel's math per element. RSQRT: tl.rsqrt for 1 / tl.sqrt."""
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    c = xindex % 256
    x = tl.load(x_ptr + xindex).to(tl.float32)
    var = tl.load(var_ptr + c).to(tl.float32) + 1e-05
    inv = tl.rsqrt(var) if RSQRT else 1.0 / tl.sqrt(var)
    y = (x - tl.load(mean_ptr + c).to(tl.float32)) * inv * tl.load(w_ptr + c).to(tl.float32) \
        + tl.load(b_ptr + c).to(tl.float32)
    y = y.to(tl.bfloat16).to(tl.float32)
    tl.store(out_ptr + xindex, tl.where(y < 0, 0, y).to(tl.bfloat16))


@triton.jit
def scale_shift(mean_ptr, var_ptr, w_ptr, b_ptr, scale_ptr, shift_ptr, C: tl.constexpr):
    c = tl.arange(0, C)
    inv = 1.0 / tl.sqrt(tl.load(var_ptr + c).to(tl.float32) + 1e-05)
    scale = inv * tl.load(w_ptr + c).to(tl.float32)
    tl.store(scale_ptr + c, scale)
    tl.store(shift_ptr + c, tl.load(b_ptr + c).to(tl.float32) - tl.load(mean_ptr + c).to(tl.float32) * scale)


@triton.jit
def folded_relu(x_ptr, scale_ptr, shift_ptr, out_ptr, XBLOCK: tl.constexpr):
    """y = relu(x * scale[c] + shift[c]): two per-channel loads and an FMA per element."""
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    c = xindex % 256
    y = tl.load(x_ptr + xindex).to(tl.float32) * tl.load(scale_ptr + c) + tl.load(shift_ptr + c)
    y = y.to(tl.bfloat16).to(tl.float32)
    tl.store(out_ptr + xindex, tl.where(y < 0, 0, y).to(tl.bfloat16))


@triton.jit
def bn_relu_2d(x_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, out_ptr, ROWS: tl.constexpr):
    """[ROWS, 256] tiles: the channel math once per program and column, broadcast over the rows."""
    c = tl.arange(0, 256)
    inv = 1.0 / tl.sqrt(tl.load(var_ptr + c).to(tl.float32) + 1e-05)
    scale1 = inv * tl.load(w_ptr + c).to(tl.float32)
    shift = (tl.load(b_ptr + c).to(tl.float32) - tl.load(mean_ptr + c).to(tl.float32) * scale1)[None, :]
    scale = scale1[None, :]
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    offs = rows * 256 + c[None, :]
    y = (tl.load(x_ptr + offs).to(tl.float32) * scale + shift).to(tl.bfloat16).to(tl.float32)
    tl.store(out_ptr + offs, tl.where(y < 0, 0, y).to(tl.bfloat16))


@triton.jit
def add_relu(x_ptr, y_ptr, out_ptr, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    s = tl.load(x_ptr + xindex).to(tl.float32) + tl.load(y_ptr + xindex).to(tl.float32)
    tl.store(out_ptr + xindex, tl.maximum(s, 0.0).to(tl.bfloat16))


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    from brrr.cost.device import get_ceilings
    copy_bw = get_ceilings(dev).bandwidth
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}; "
          f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    x = torch.randn(N, C, H, W, device=dev).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    flat = x.permute(0, 2, 3, 1).reshape(-1)
    mean, var = torch.randn(C, device=dev).to(torch.bfloat16), torch.rand(C, device=dev).to(torch.bfloat16) + 0.5
    w, b = torch.randn(C, device=dev).to(torch.bfloat16), torch.randn(C, device=dev).to(torch.bfloat16)
    want = F.relu(F.batch_norm(x, mean, var, w, b, training=False)).permute(0, 2, 3, 1).reshape(-1)
    out = torch.empty_like(flat)
    scale, shift = torch.empty(C, device=dev), torch.empty(C, device=dev)
    n = flat.numel()

    def report(label, fn, nbytes=2 * n * 2):
        fn()
        torch.cuda.synchronize()
        diff = (out.float() - want.float()).abs().max().item()
        ms = time_graph(fn, dev).median_s * 1e3
        print(f"{label:56s} {ms * 1e3:7.1f} us  {100 * nbytes / (ms * 1e-3) / copy_bw:5.1f}% of copy  "
              f"max diff from eager {diff:.3g}", flush=True)

    y = torch.randn_like(flat)
    report("add+ReLU (three tensors: the roof's reference)", lambda: add_relu[(n // 1024,)](flat, y, out, XBLOCK=1024,
           num_warps=4), nbytes=3 * n * 2)
    report("eager", lambda: out.copy_(F.relu(F.batch_norm(x, mean, var, w, b, training=False)).permute(0, 2, 3, 1)
                                      .reshape(-1)), nbytes=2 * n * 2)
    for xblock, warps in [(1024, 4), (2048, 8), (4096, 8)]:
        for rsqrt in (False, True):
            report(f"per element, XBLOCK {xblock} w{warps}, {'rsqrt' if rsqrt else '1 / sqrt'}",
                   lambda: bn_relu[(n // xblock,)](flat, mean, var, w, b, out, XBLOCK=xblock, RSQRT=rsqrt,
                                                   num_warps=warps))
        report(f"scale and shift kernel, then folded, XBLOCK {xblock} w{warps}",
               lambda: (scale_shift[(1,)](mean, var, w, b, scale, shift, C=C),
                        folded_relu[(n // xblock,)](flat, scale, shift, out, XBLOCK=xblock, num_warps=warps)))
        report(f"   the folded kernel alone, XBLOCK {xblock} w{warps}",
               lambda: folded_relu[(n // xblock,)](flat, scale, shift, out, XBLOCK=xblock, num_warps=warps))
    for rows, warps in [(4, 4), (8, 4), (16, 8), (32, 8)]:
        report(f"[{rows}, 256] tiles, channel math once a program, w{warps}",
               lambda: bn_relu_2d[(n // (rows * 256),)](flat, mean, var, w, b, out, ROWS=rows, num_warps=warps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
