"""Probe: where does a distributed training step's time go on 2 GPUs? First the interconnect: NCCL's transport
and an all-reduce's bandwidth. Then, for each (backend, wrap), 3 profiled steps after 12 warm-ups of a zoo model (DDP
times its first 10 iterations with host-synchronizing events); each rank writes a Chrome trace per run to OUT_DIR and prints the device time of compute and of NCCL kernels.

    torchrun --nproc-per-node 2 where_distributed_step_time_goes.py MODEL BACKENDS WRAPS OUT_DIR"""
import os, sys, time
for v, x in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[v] = x
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "zoo"), str(HERE.parent / "distributed"), str(HERE.parent.parent)]
import torch, torch.distributed as dist
import models, train_ranks
from brrr.bench.backends import resolve_backend

model_name, backends, wraps, out = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), Path(sys.argv[4])
rank = int(os.environ["RANK"]); dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
x = torch.ones(128 * 2**20, dtype=torch.bfloat16, device=dev)   # 256 MB
for _ in range(3): dist.all_reduce(x)
torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(10): dist.all_reduce(x)
torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / 10
if rank == 0:
    print(f"== all_reduce 256 MB bf16: {dt*1e3:.2f} ms, algbw {x.numel()*2/dt/1e9:.1f} GB/s, "
          f"busbw {x.numel()*2/dt/1e9:.1f} GB/s (2 ranks)", flush=True)
del x
cfg = {c.name: c for c in models.CONFIGS}[model_name]
for backend in backends:
    for how in wraps:
        torch._dynamo.reset()
        work = cfg.build(dev, torch.bfloat16, False)
        w = train_ranks.wrap(work.model, how, dev)
        c = w if backend == "eager" else torch.compile(w, backend=resolve_backend(backend))
        opt = torch.optim.AdamW(work.model.parameters(), lr=1e-4)
        def step():
            opt.zero_grad(set_to_none=True); loss = c(*work.inputs); loss.backward(); opt.step()
        for _ in range(12): step()
        torch.cuda.synchronize(); dist.barrier()
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(3): step()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        if rank == 0:
            ev = prof.key_averages()
            nccl = sum(e.self_device_time_total for e in ev if e.key.startswith("ncclDevKernel")) / 3 / 1e3
            allk = sum(e.self_device_time_total for e in ev if e.device_type.name == "CUDA") / 3 / 1e3
            print(f"== {backend} {how}: wall {wall/3*1e3:.1f} ms/step; device kernels {allk:.1f} ms/step, "
                  f"of which NCCL {nccl:.1f}", flush=True)
        prof.export_chrome_trace(str(out / f"{model_name}-{how}-{backend}-rank{rank}.json"))
        del c, w, opt, work
        torch.cuda.empty_cache()
dist.barrier(); dist.destroy_process_group()
