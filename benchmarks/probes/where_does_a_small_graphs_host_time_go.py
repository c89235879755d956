"""Where does a small compiled graph's host time go?

Group norm backward [32, 64, 56, 56] bf16 is five brrr kernels, 24 us of GPU time, yet its trial read "the host
busy 93 us of a launched one" and a call's period 169-213 us, against 162 us for eager's one ATen call: the
compiled-or-captured trial then chose eager's ops. This times each backend's host time per call (perf_counter
around 300 calls with no synchronization, the queue kept short by a sync every 20) and cProfiles brrr's calls.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_a_small_graphs_host_time_go.py
"""

import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
os.environ["BRRR_FLOOR"] = "0"   # no trial: brrr's compiled callable alone

CASE = "nchw_group_norm32_backward_32x64x56x56_bf16"


def host_per_call(fn, inputs, calls=300):
    import torch

    for _ in range(20):
        fn(*inputs)
    torch.cuda.synchronize()
    spent = 0.0
    for i in range(calls):
        start = time.perf_counter()
        fn(*inputs)
        spent += time.perf_counter() - start
        if i % 20 == 19:
            torch.cuda.synchronize()
    return spent / calls


def main():
    import torch

    import brrr
    import layout_kernels

    case = layout_kernels.cases(False)[CASE]
    inputs = case.make_inputs("cuda")
    with torch.no_grad():
        for label, fn in (("eager", case.fn),
                          ("brrr launching", brrr.compile(case.fn, cuda_graphs=False)),
                          ("brrr", brrr.compile(case.fn)),
                          ("inductor", torch.compile(case.fn))):
            torch._dynamo.reset()
            print(f"{label:16s} host {host_per_call(fn, inputs) * 1e6:7.1f} us per call", flush=True)
            if label.startswith("brrr"):
                profile = cProfile.Profile()
                profile.enable()
                host_per_call(fn, inputs, calls=200)
                profile.disable()
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
                print(text.getvalue()[-6000:])


if __name__ == "__main__":
    main()
