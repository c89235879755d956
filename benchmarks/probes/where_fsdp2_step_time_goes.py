"""Probe: where does an FSDP2 training step of GPT-2 (8x1024 per GPU, bf16) spend its time on 2 GPUs?
Profiles 3 steps per backend (eager, brrr) after warm-up; rank 0 prints the top host ops by self CPU time,
the device's busy time, and the step's host and device time."""
import os, sys, time
for v, x in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[v] = x
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "zoo"), str(HERE.parent / "distributed"), str(HERE.parent.parent)]
import torch, torch.distributed as dist
import models, train_ranks
from brrr.bench.backends import resolve_backend

rank = int(os.environ["RANK"]); dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
cfg = {c.name: c for c in models.CONFIGS}["gpt2-lm-train"]
for backend in sys.argv[1].split(","):
    for how in ("fsdp2", "ddp"):
        torch._dynamo.reset()
        work = cfg.build(dev, torch.bfloat16, False)
        w = train_ranks.wrap(work.model, how, dev)
        c = w if backend == "eager" else torch.compile(w, backend=resolve_backend(backend))
        opt = torch.optim.AdamW(work.model.parameters(), lr=1e-4)
        def step():
            opt.zero_grad(set_to_none=True); loss = c(*work.inputs); loss.backward(); opt.step()
        for _ in range(5): step()
        torch.cuda.synchronize(); dist.barrier()
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(3): step()
            host = time.perf_counter() - t0
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        if rank == 0:
            ev = prof.key_averages()
            gpu = sum(e.self_device_time_total for e in ev) / 3 / 1e3
            print(f"== {backend} {how}: host {host/3*1e3:.1f} ms/step, wall {wall/3*1e3:.1f} ms/step, "
                  f"device kernel time {gpu:.1f} ms/step (summed over streams)", flush=True)
            print(ev.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60), flush=True)
            print(ev.table(sort_by="self_device_time_total", row_limit=8, max_name_column_width=60), flush=True)
        del c, w, opt, work
dist.barrier(); dist.destroy_process_group()
