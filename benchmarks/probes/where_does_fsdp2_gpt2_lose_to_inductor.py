"""Where does brrr's GPT-2 step under FSDP2 lose to Inductor's?

On two H200s at 6386afd (results/distributed/2026-11-26-h200-6386afd-gpt2-lm-train.md) brrr's FSDP2 step took
63.46 ms against Inductor's 55.99, while under DDP brrr led (24.38 against 33.66) and alone on one GPU they tie
(21.61 / 21.88). An earlier profile (2026-11-24) found FSDP2 bound by host work (117 ms of host a step eager,
86 brrr). Prediction: the gap is host time in brrr's compiled-graph calls, which FSDP2 makes 12 times per
step per graph (one per sharded block), each paying brrr's per-call cost where Inductor's is smaller; the GPU
is idle between them. This probe times, per backend and rank: the step, the host time of a step, the GPU's busy
time in the step (kernels' union), NCCL kernel time, brrr's launch-or-replay decisions, and the top host ops.

    torchrun --nproc-per-node 2 benchmarks/probes/where_does_fsdp2_gpt2_lose_to_inductor.py --out $OUT/fsdp2.json
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "distributed"), str(HERE.parent / "zoo"), str(HERE.parent.parent)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import train_ranks  # noqa: E402  (sets NCCL's multicast off before NCCL loads)


def busy_us(events):
    """Union of [start, end) intervals in us."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    total, cur_s, cur_e = 0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def run(backend, rank, device, out):
    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile

    from brrr.bench.backends import dynamo_limits, resolve_backend
    from brrr.compile import replay_choice
    from models import CONFIGS

    torch._dynamo.reset()
    config = next(c for c in CONFIGS if c.name == "gpt2-lm-train")
    work = config.build(device, torch.bfloat16, False)
    model = work.model
    ids = work.inputs[0]
    wrapped = train_ranks.wrap(model, "fsdp2", device)
    compiled = torch.compile(wrapped, backend=resolve_backend(backend))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = train_ranks.batches(model.model.config.vocab_size, ids.shape[0], ids.shape[1], 4, rank, device)

    def step(inputs):
        opt.zero_grad(set_to_none=True)
        loss = compiled(*inputs)
        loss.backward()
        opt.step()
        return loss

    decisions_before = len(replay_choice.DECISIONS)
    with torch._dynamo.config.patch(dynamo_limits(64)):
        for i in range(12):
            step(data[i % 4])
        torch.cuda.synchronize()
        dist.barrier()
        host, wall = [], []
        for i in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(data[i % 4])
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            host.append(t1 - t0)
            wall.append(time.perf_counter() - t0)
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(3):
                step(data[i % 4])
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    nccl = [e for e in kernels if "nccl" in e.name.lower()]
    compute = [e for e in kernels if "nccl" not in e.name.lower()]
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)
    cuda_table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60)
    record = {
        "backend": backend, "rank": rank,
        "step_ms_synced": 1e3 * sorted(wall)[5], "host_ms_until_return": 1e3 * sorted(host)[5],
        "gpu_busy_ms_per_step": busy_us(kernels) / 3e3, "compute_busy_ms_per_step": busy_us(compute) / 3e3,
        "nccl_kernel_ms_per_step": sum(e.device_time for e in nccl) / 3e3,
        "kernels_per_step": len(kernels) / 3,
        "decisions": [str(d) for d in replay_choice.DECISIONS[decisions_before:]],
    }
    with open(f"{out}.rank{rank}.{backend}.txt", "w") as f:
        f.write(json.dumps(record, indent=1) + "\n\n" + table + "\n\n" + cuda_table + "\n")
    del compiled, wrapped, model, opt
    torch.cuda.empty_cache()
    return record


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--backends", default="brrr,inductor")
    args = p.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    for backend in args.backends.split(","):
        r = run(backend, rank, device, args.out)
        print(json.dumps({k: v for k, v in r.items() if k != "decisions"}), flush=True)
        for d in r["decisions"][:8]:
            print(f"  rank {rank} {backend}: {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
