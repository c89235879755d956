"""Why do four small NCHW cases of the layout acceptance read at eager's time under brrr?

Group norm backward [32, 64, 56, 56] (32 groups and 1), group norm 1 backward [32, 512, 28, 28] and adaptive
average pool forward [64, 512, 28, 28] took brrr 23, 23, 53 and 14.6 us before the index-algebra change and 61,
61, 125 and 20.8 us after, eager's own times. The suspicion: brrr's compiled-or-captured trial chose the captured
graph (eager's ops). This runs each case under eager and brrr as layout_kernels.py does, prints brrr's logged
decisions (floor, replay, captured), then times brrr again with BRRR_FLOOR=0 (no trials) beside eager.

    PYTHONPATH=$PWD python3 benchmarks/probes/why_small_nchw_norm_cases_time_as_eager.py
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))

CASES = ("nchw_group_norm32_backward_32x64x56x56_bf16", "nchw_group_norm1_backward_32x64x56x56_bf16",
         "nchw_group_norm1_backward_32x512x28x28_bf16", "nchw_adaptive_avg_pool1x1_forward_64x512x28x28_bf16")


def main():
    import torch

    import layout_kernels
    from brrr.compile.runtime import captured_choice, floor, replay_choice
    from brrr.cost.device import get_ceilings

    bandwidth = get_ceilings(torch.device("cuda")).bandwidth
    chosen = {k: v for k, v in layout_kernels.cases(False).items() if k in CASES}
    for floor_on in (True, False):
        if not floor_on:
            os.environ["BRRR_FLOOR"] = "0"
        print(f"--- BRRR_FLOOR={'on' if floor_on else '0'}")
        for name, case in chosen.items():
            torch._dynamo.reset()
            logs = {"captured": captured_choice.DECISIONS, "replay": replay_choice.DECISIONS,
                    "floor": floor.DECISIONS}
            marks = {k: len(v) for k, v in logs.items()}
            data = layout_kernels.measure(name, case, case.make_inputs("cuda"), ("eager", "brrr"), bandwidth, False)
            for row in data["rows"]:
                print(f"{name} {row['backend']:6s} {row['seconds'] * 1e6:8.1f} us ({row['timed_by']}) "
                      f"{row['status']} {row['reason'] or ''}", flush=True)
            for key, log in logs.items():
                for item in log[marks[key]:]:
                    print(f"    {key}: {item}")


if __name__ == "__main__":
    main()
