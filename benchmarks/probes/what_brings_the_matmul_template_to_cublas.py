"""Question: what brings brrr's matmul template from 50-70% of cuBLAS to the 90% issue 16 asks for?

Answer (benchmarks/NOTES.md, 2026-11-26): operands through TMA descriptors, persistent programs and a flattened
loop: 94% at 4096^3, 94-105% on the zoo's LM shapes (79% on BERT's FFN down, too few tiles). Candidates, each
timed against cuBLAS (torch.mm) on 4096^3 and on the zoo's transformer shapes, bf16, B given as a Linear weight
[N, K] (so B = W.t(), K contiguous):
  - the template as it ships, with `default_config`'s tile and with each tile of a wider sweep;
  - operands read through TMA tensor descriptors (host-side `TensorDescriptor`), one program per tile;
  - the same, persistent: one program per SM walking tiles, with and without `tl.range(flatten=True)`.

    PYTHONPATH=$PWD python3 benchmarks/probes/what_brings_the_matmul_template_to_cublas.py --out $OUT
"""

import argparse
import json
import time

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from brrr.compile.matmul_configs import CONFIGS, TileConfig, default_config
from brrr.compile.template_mm import template_mm

SHAPES = {   # name: (M, N, K)
    "square-4096": (4096, 4096, 4096),
    "bert-ffn-up": (4096, 3072, 768),
    "bert-ffn-down": (4096, 768, 3072),
    "gpt2-qkv": (8192, 2304, 768),
    "llama-mlp-up": (8192, 2816, 1024),
    "llama-mlp-down": (8192, 1024, 2816),
}

TEMPLATE_SWEEP = list(CONFIGS) + [TileConfig(128, 256, 64, 8, 8, 4), TileConfig(256, 128, 64, 8, 8, 3),
                                  TileConfig(128, 128, 64, 8, 4, 4), TileConfig(128, 256, 64, 4, 8, 3)]
TMA_SWEEP = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
             (256, 128, 64, 8, 3), (128, 128, 128, 8, 3)]   # BM, BN, BK, warps, stages


@triton.jit
def _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def mm_tma(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for ki in range(tl.cdiv(K, BK)):
        a = a_desc.load([pid_m * BM, ki * BK])
        b = b_desc.load([pid_n * BN, ki * BK])
        acc = tl.dot(a, b.T, acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(c_desc.dtype))


@triton.jit
def mm_tma_persistent(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr):
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    num_tiles = num_pid_m * num_pid_n
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BM, ki * BK])
            b = b_desc.load([pid_n * BN, ki * BK])
            acc = tl.dot(a, b.T, acc)
        c_desc.store([pid_m * BM, pid_n * BN], acc.to(c_desc.dtype))


def tma_runner(a, w, c, cfg, persistent, flatten=False):
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, bk, warps, stages = cfg
    m, k = a.shape
    n = w.shape[0]
    ad = TensorDescriptor.from_tensor(a, [bm, bk])
    bd = TensorDescriptor.from_tensor(w, [bn, bk])
    cd = TensorDescriptor.from_tensor(c, [bm, bn])
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if persistent:
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count
        grid = (min(sms, tiles),)
        return lambda: mm_tma_persistent[grid](ad, bd, cd, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=8, NUM_SMS=sms,
                                               FLATTEN=flatten, num_warps=warps, num_stages=stages)
    return lambda: mm_tma[(tiles,)](ad, bd, cd, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=8, num_warps=warps,
                                    num_stages=stages)


def timed(fn, ref, out):
    try:
        fn()
        torch.cuda.synchronize()
        err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        if not err < 1e-2:
            return None, f"wrong: {err:.3g}"
        return do_bench(fn, warmup=25, rep=100), ""
    except Exception as e:   # a config that does not compile or fit: recorded, the sweep goes on
        return None, f"{type(e).__name__}: {str(e)[:120]}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.shapes.split(","):
        m, n, k = SHAPES[name]
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        ref = a @ w.t()
        flop = 2 * m * n * k
        cublas = do_bench(lambda: torch.mm(a, w.t()), warmup=25, rep=100)
        line = {"shape": name, "mnk": [m, n, k], "cublas_us": cublas * 1e3,
                "cublas_tflops": flop / cublas / 1e9, "variants": []}
        default = default_config(m, n, k, torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for cfg in TEMPLATE_SWEEP:
            ms, why = timed(lambda: template_mm(a, w.t(), out, config=cfg), ref, out)
            line["variants"].append({"kind": "template", "config": list(cfg.__dict__.values()),
                                     "default": cfg == default, "us": ms and ms * 1e3, "why": why})
        for persistent, flatten in ((False, False), (True, False), (True, True)):
            kind = "tma" + ("-persistent" if persistent else "") + ("-flatten" if flatten else "")
            for cfg in TMA_SWEEP:
                out.zero_()
                ms, why = timed(tma_runner(a, w, out, cfg, persistent, flatten), ref, out)
                line["variants"].append({"kind": kind, "config": list(cfg), "us": ms and ms * 1e3, "why": why})
        for v in line["variants"]:
            v["of_cublas"] = v["us"] and cublas * 1e3 / v["us"]
        rows.append(line)
        print(f"\n{name} {m}x{n}x{k}: cuBLAS {cublas * 1e3:.1f} us ({flop / cublas / 1e9:.0f} TFLOP/s)", flush=True)
        for v in sorted(line["variants"], key=lambda v: v["us"] or 1e9):
            tag = " (default)" if v.get("default") else ""
            us = f"{v['us']:.1f} us {v['of_cublas']:.0%}" if v["us"] else v["why"]
            print(f"  {v['kind']:<24} {str(v['config']):<28} {us}{tag}", flush=True)
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d")}
    with open(f"{args.out}/matmul-template-vs-cublas.json", "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
