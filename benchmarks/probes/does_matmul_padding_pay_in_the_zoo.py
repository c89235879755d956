"""Does padding unaligned matmuls make the zoo's configurations faster, and never slower?

Not run on a GPU yet. Prediction (from `how_slow_are_unaligned_matmuls.py`: align1 5-6.6x, 4- and 8-byte
alignment 2.4-2.8x): GPT-2 training gains the most (its three LM-head matmuls, ~15 ms, fall to ~3 ms plus
~1 ms of pads); BERT and DistilBERT (vocab 30522) gain ~2 ms; configurations with aligned matmuls do not move.
Each configuration is compiled by brrr twice in one process, with BRRR_PAD_MATMULS=0 and then with padding,
and timed both ways (do_bench median and back to back); the padding decisions are printed.

    PYTHONPATH=$PWD python3 benchmarks/probes/does_matmul_padding_pay_in_the_zoo.py --only gpt2-lm-train,...
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "zoo")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", required=True, help="comma-separated zoo configuration names")
    args = p.parse_args(argv)
    import torch

    import brrr
    from brrr.bench.step import Step, make_cotangents
    from brrr.bench.timing import time_kernel, time_steady
    from brrr.compile import matmul_padding
    from models import CONFIGS

    seen = []
    real = matmul_padding.pad_matmuls

    def logged(gm):
        decisions = real(gm)
        seen.extend(decisions)
        return decisions
    matmul_padding.pad_matmuls = logged
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    by_name = {c.name: c for c in CONFIGS}
    for name in args.only.split(","):
        work = by_name[name].build("cuda", torch.bfloat16, False)
        inputs = work.inputs or work.shapes[0][1]
        cot = make_cotangents(work.model(*inputs)) if work.train else None
        times = {}
        for pad in ("0", "1"):
            os.environ["BRRR_PAD_MATMULS"] = pad
            torch._dynamo.reset()
            del seen[:]
            step = Step(brrr.compile(work.model), work.model, [inputs], work.train, cot)
            step()
            torch.cuda.synchronize()
            times[pad] = (time_kernel(step, "cuda").median_s * 1e3, time_steady(step, "cuda").median_s * 1e3)
            if pad == "1":
                for d in seen:
                    print(f"  {name}: {d}")
        (m0, s0), (m1, s1) = times["0"], times["1"]
        print(f"{name}: unpadded {m0:.2f} ms (back to back {s0:.2f}), padded {m1:.2f} ms ({s1:.2f}): "
              f"{m0 / m1:.2f}x", flush=True)
        del work
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
