"""The cos chain: a fused `x.cos().cos()` costs about what eager `x.cos()` costs.

Eager `x.cos().cos()` reads and writes x twice (4 passes over memory); fused, once (2 passes), like a single
`x.cos()`. `run()` benches `x.cos().cos()` under each backend (brrr.bench) and times eager `x.cos()` beside
it; each backend's time over eager `x.cos()`'s should be ~1 when fused and ~2 when not.
"""

import torch

from brrr.bench.runner import bench
from brrr.bench.timing import time_kernel
from brrr.experiments import common


def cos_cos(x):
    return x.cos().cos()


def run(device=None, dtype=torch.float32, numel=None, backends=("eager", "inductor", "brrr"), progress=False,
        warmup=25, rep=100, json_path=None, print_table=True):
    device = common.resolve_device(device)
    numel = numel or (2**28 if device.type == "cuda" else 2**20)
    x = torch.randn(numel, device=device, dtype=dtype)
    single = time_kernel(lambda: x.cos(), device, warmup=warmup, rep=rep)
    result = bench(cos_cos, x, backends=backends, progress=progress, device=device, warmup=warmup, rep=rep,
                   label=f"x.cos().cos(), {numel:,} elements", compile_warm=False)
    out = {"experiment": "cos_chain", "device": str(device), "device_name": common.device_name(device),
           "dtype": str(dtype).replace("torch.", ""), "numel": numel, "eager_single_cos_s": single.median_s,
           "bench": result.to_dict(), "versions": common.versions()}
    out["ratio_to_single_cos"] = {r.backend: (r.median_s / single.median_s if r.median_s else None)
                                  for r in result.rows}
    if print_table:
        console = common.console()
        result.print(console)
        console.print(f"eager x.cos(): {single.median_s * 1e3:.3f} ms; x.cos().cos() over that: " + ", ".join(
            f"{k} {v:.2f}x" for k, v in out["ratio_to_single_cos"].items() if v is not None))
    if json_path:
        common.write_json(json_path, out)
    return out
