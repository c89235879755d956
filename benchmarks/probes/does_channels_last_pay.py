"""Probe: does brrr's layout pass (channels_last chosen by measured convolutions) pay on NCHW conv nets?

    PYTHONPATH=$PWD python3 benchmarks/probes/does_channels_last_pay.py     # on the GPU machine

For each model: eager, brrr with the pass off (BRRR_LAYOUTS=0), brrr with it, Inductor default; do_bench medians in
one process, error against eager, the pass's decisions and the time the compile took.
"""

import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from triton.testing import do_bench

from brrr.compile.backend import brrr_backend
from brrr.compile.passes import layouts


class Depthwise9(nn.Module):
    def __init__(self, c=768, blocks=2):
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleList([nn.Conv2d(c, c, 9, padding=4, groups=c), nn.BatchNorm2d(c),
                                                   nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)]) for _ in range(blocks))

    def forward(self, x):
        for dw, n1, pw, n2 in self.blocks:
            x = x + n1(F.gelu(dw(x)))
            x = n2(F.gelu(pw(x)))
        return x


class SeparableNet(nn.Module):
    def __init__(self, c=256, blocks=4):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False),
                                                  nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
                                    for _ in range(blocks))

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


def models():
    import timm
    bf16 = torch.bfloat16
    yield "depthwise9-infer-bf16", Depthwise9().cuda().to(bf16).eval(), torch.randn(32, 768, 32, 32, device="cuda", dtype=bf16), False
    yield "separable-infer-bf16", SeparableNet().cuda().to(bf16).eval(), torch.randn(32, 256, 56, 56, device="cuda", dtype=bf16), False
    yield "resnet18-train-fp32", timm.create_model("resnet18").cuda().train(), torch.randn(64, 3, 224, 224, device="cuda"), True
    yield "efficientnet_b0-infer-bf16", timm.create_model("efficientnet_b0").cuda().to(bf16).eval(), torch.randn(32, 3, 224, 224, device="cuda", dtype=bf16), False


def step_of(model, x, train):
    if not train:
        def step():
            with torch.no_grad():
                return model(x)
        return step

    def step():
        out = model(x)
        out.float().square().mean().backward()
        return out
    return step


def main():
    only = set(sys.argv[1:])
    for name, model, x, train in models():
        if only and name not in only:
            continue
        rows = {}
        ref = None
        for backend in ("eager", "brrr-nolayout", "brrr", "inductor"):
            torch._dynamo.reset()
            os.environ["BRRR_LAYOUTS"] = "0" if backend == "brrr-nolayout" else "1"
            mark = len(layouts.DECISIONS)
            fn = model if backend == "eager" else torch.compile(
                model, backend=brrr_backend if backend.startswith("brrr") else "inductor")
            t0 = time.perf_counter()
            out = step_of(fn, x, train)()
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            step = step_of(fn, x, train)
            ms = do_bench(step, warmup=50, rep=300)
            out = step().float()
            if ref is None:
                ref = out
            err = ((out - ref).norm() / ref.norm()).item()
            rows[backend] = ms
            print(f"{name} {backend}: {ms:.3f} ms, first call {compile_s:.1f} s, err {err:.1e}, "
                  f"out stride {tuple(out.stride())}", flush=True)
            for d in layouts.DECISIONS[mark:]:
                print(f"    layout: {d}", flush=True)
            model.zero_grad(set_to_none=True)
        print(f"{name}: brrr/inductor {rows['brrr'] / rows['inductor']:.2f}x, brrr/eager {rows['brrr'] / rows['eager']:.2f}x, "
              f"layouts saved {rows['brrr-nolayout'] / rows['brrr']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
