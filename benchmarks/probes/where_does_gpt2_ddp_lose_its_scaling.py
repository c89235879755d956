"""Where does GPT-2's DDP step lose its scaling on two GPUs?

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD \
        python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/probes/where_does_gpt2_ddp_lose_its_scaling.py

At c580743 (two H200s) GPT-2 training under DDP took 25.36 ms a step with brrr against 20.70 alone (82%),
Inductor 26.39 against 22.84 (87%), eager 44.48 against 43.48 (98%). The all-reduce of 248 MB of bf16
gradients takes ~1 ms over NVLink; hidden under the backward it would cost ~nothing. Prediction: the compiled
backends' all-reduces do not overlap their backward (their gradients arrive late, or the host is behind the
device), so 3-4 ms of NCCL time sits exposed at the end of each step.

Each rank trains as benchmarks/distributed/train_ranks.py does (AdamW, bf16, logging calls skipped), warms up,
then profiles 3 steps; rank 0 prints, per step: the time between step starts, the device time busy with
compute kernels, with NCCL kernels, NCCL time not under any compute kernel, the device idle time, and when the
step's host call returned against the device's work.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_var] = _value
ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "zoo"), str(ROOT / "benchmarks" / "distributed"), str(ROOT)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def covered(intervals, cover):
    """Length of `intervals` (disjoint) lying under `cover` (disjoint, sorted)."""
    total = 0.0
    for a, b in intervals:
        for c, d in cover:
            if d <= a:
                continue
            if c >= b:
                break
            total += min(b, d) - max(a, c)
    return total


def analyse(trace_path, steps):
    events = json.load(open(trace_path))["traceEvents"]
    marks = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("name", "").startswith("probe_step") and e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation")
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    lines = []
    for i, (start, host_end) in enumerate(marks[:steps]):
        end = marks[i + 1][0] if i + 1 < len(marks) else max(k["ts"] + k["dur"] for k in kernels)
        ks = [k for k in kernels if start <= k["ts"] < end]
        nccl = union([(k["ts"], k["ts"] + k["dur"]) for k in ks if "nccl" in k["name"].lower()])
        compute = union([(k["ts"], k["ts"] + k["dur"]) for k in ks if "nccl" not in k["name"].lower()])
        busy = union([(k["ts"], k["ts"] + k["dur"]) for k in ks])
        nccl_t = sum(b - a for a, b in nccl)
        exposed = nccl_t - covered(nccl, compute)
        last_compute = max((b for a, b in compute), default=start)
        first_nccl = min((a for a, b in nccl), default=end)
        lines.append(
            f"  step {i}: period {(end - start) / 1e3:.2f} ms; compute busy {sum(b - a for a, b in compute) / 1e3:.2f}, "
            f"NCCL {nccl_t / 1e3:.2f} ({len(nccl)} spans; exposed {exposed / 1e3:.2f}), idle "
            f"{((end - start) - sum(b - a for a, b in busy)) / 1e3:.2f}; first NCCL at {(first_nccl - start) / 1e3:.2f} ms, "
            f"last compute ends {(last_compute - start) / 1e3:.2f}, host call returned {(host_end - start) / 1e3:.2f}")
        top = {}
        for k in ks:
            if "nccl" in k["name"].lower():
                top[k["name"][:60]] = top.get(k["name"][:60], 0) + k["dur"]
        lines.append("    NCCL kernels: " + ", ".join(f"{n} {t / 1e3:.2f} ms" for n, t in top.items()))
        spans = ", ".join(f"{(a - start) / 1e3:.1f}-{(b - start) / 1e3:.1f}" for a, b in nccl[:24])
        lines.append(f"    NCCL spans (ms from step start): {spans}")
    return lines


def run(backend, rank, world, device):
    import torch._dynamo
    import models
    from train_ranks import batches, wrap
    from brrr.bench.backends import dynamo_limits, resolve_backend, skip_logging_in_graphs

    torch._dynamo.reset()
    work = models.BY_NAME["gpt2-lm-train"].build(device, torch.bfloat16, False)
    model = work.model
    ids = work.inputs[0]
    wrapped = wrap(model, "ddp", device)
    compiled = wrapped if backend == "eager" else torch.compile(wrapped, backend=resolve_backend(backend))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = batches(model.model.config.vocab_size, ids.shape[0], ids.shape[1], 4, rank, device)

    def step(inputs):
        opt.zero_grad(set_to_none=True)
        loss = compiled(*inputs)
        loss.backward()
        opt.step()

    with torch._dynamo.config.patch(dynamo_limits(64)), skip_logging_in_graphs():
        for i in range(15):
            step(data[i % 4])
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(10):
            step(data[i % 4])
        torch.cuda.synchronize()
        plain = (time.perf_counter() - t0) / 10
        dist.barrier()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(4):
                with torch.profiler.record_function(f"probe_step{i}"):
                    step(data[i % 4])
            torch.cuda.synchronize()
    path = Path(tempfile.mkdtemp()) / f"{backend}-rank{rank}.json"
    prof.export_chrome_trace(str(path))
    lines = [f"{backend} rank {rank}: {plain * 1e3:.2f} ms a step unprofiled"] + analyse(path, 3)
    out = os.environ.get("OUT")
    if out and rank == 0:
        import shutil
        shutil.copy(path, Path(out) / path.name)
    del compiled, wrapped, model, opt
    torch.cuda.empty_cache()
    return lines


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    for backend in sys.argv[1:] or ["brrr", "inductor"]:
        lines = run(backend, rank, world, device)
        gathered = [None] * world
        dist.all_gather_object(gathered, lines)
        if rank == 0:
            for part in gathered:
                print("\n".join(part), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
