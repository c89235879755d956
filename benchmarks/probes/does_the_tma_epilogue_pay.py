"""Does a matmul epilogue fused into the TMA template pay in a compiled model?

The TMA template reaches 93-100% of cuBLAS by device time on BERT's FFN up-projection and the LM shapes
(results/acceptance-compile/2026-11-26-h200-f44cb10-matmul-template.log). Fused with its GELU it should save
the product's write and read: at 4096 x 3072 bf16, 2 x 25 MB, ~12 us at ~4 TB/s. Prediction: BERT's FFN block
(Linear 768->3072, GELU, Linear 3072->768, residual add), 4096 tokens, inference: brrr with
`matmul_templates="always"` (TMA on Hopper) ~10 us (~10%) faster than brrr's default (cuBLAS + a GELU kernel),
and equal to eager within bf16 error; "auto" chooses the fused kernel for the up-projection and cuBLAS where
the TMA template is behind (the down-projection, 82% of cuBLAS). Training step: a smaller gain (the forward's
fused kernel must also store the pre-activation).

    PYTHONPATH=$PWD python3 benchmarks/probes/does_the_tma_epilogue_pay.py
"""

import copy
import os
import time

import torch
import triton

import brrr
from brrr.bench.timing import time_graph


class FFN(torch.nn.Module):
    def __init__(self, d=768, h=3072):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    model = FFN().to(dev, torch.bfloat16)
    x = torch.randn(4096, 768, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        want64 = copy.deepcopy(model).double()(x.double())
    eager_err = ((want.double() - want64).abs().max() / want64.abs().max()).item()
    rows = {}
    for mode in ("off", "always", "auto"):
        m = copy.deepcopy(model)
        t0 = time.perf_counter()
        f = brrr.compile(m, matmul_templates=mode, cuda_graphs=False)
        with torch.no_grad():
            got = f(x)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            err = ((got.double() - want64).abs().max() / want64.abs().max()).item()
            dev_us = time_graph(lambda: f(x), dev).median_s * 1e6
            call_us = triton.testing.do_bench(lambda: f(x), warmup=25, rep=200) * 1e3
        os.environ["BRRR_MATMUL_TEMPLATES"] = {"off": "0", "always": "1", "auto": "auto"}[mode]
        ex = brrr.explain(copy.deepcopy(model), x)
        os.environ.pop("BRRR_MATMUL_TEMPLATES")
        rows[mode] = dev_us
        print(f"inference, matmul_templates={mode}: device {dev_us:.1f} us, call {call_us:.1f} us, "
              f"error {err:.2e} (eager {eager_err:.2e}), compile {compile_s:.1f} s")
        for info in ex.matmuls:
            print(f"    {info}")
        from torch.profiler import ProfilerActivity, profile
        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                f(x)
            torch.cuda.synchronize()
        for e in prof.key_averages():
            if e.device_time_total > 0:
                print(f"      {e.count:3d} x {e.device_time_total / e.count:7.1f} us  {e.key[:80]}")
    # a training step, default mode against "always"
    for mode in ("off", "always"):
        m = copy.deepcopy(model)
        f = brrr.compile(m, matmul_templates=mode, cuda_graphs=False)
        xi = x.clone().requires_grad_()

        def step():
            y = f(xi)
            y.float().sum().backward()
        step()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(step, warmup=25, rep=200)
        print(f"training step, matmul_templates={mode}: {ms * 1e3:.1f} us (do_bench, host included)")


if __name__ == "__main__":
    main()
