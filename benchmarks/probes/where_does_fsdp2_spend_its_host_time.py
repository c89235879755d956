"""Where does a GPT-2 step under FSDP2 spend its host time, brrr against Inductor? One process, one GPU, a process
group of one (NCCL): FSDP2's hooks and all-gathers run as on two GPUs, without a peer to wait for. Per backend:
the step time, the host time of the step's call, kernels launched a step (the profiler), and the 25 functions
with the most own time under cProfile over 5 steps.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_fsdp2_spend_its_host_time.py
"""

import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                  NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "zoo"), str(ROOT / "benchmarks" / "distributed"), str(ROOT)]

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch.distributed as dist  # noqa: E402

import train_ranks  # noqa: E402
from models import CONFIGS  # noqa: E402


def main():
    dist.init_process_group("nccl")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    from brrr.bench.backends import resolve_backend, skip_logging_in_graphs, stop_inductor_workers
    config = next(c for c in CONFIGS if c.name == "gpt2-lm-train")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; GPT-2 8x1024 under FSDP2, world 1",
          flush=True)
    for backend in ("brrr", "inductor"):
        torch._dynamo.reset()
        work = config.build(device, torch.bfloat16, False)
        model = work.model
        wrapped = train_ranks.wrap(model, "fsdp2", device)
        compiled = torch.compile(wrapped, backend=resolve_backend(backend))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        inputs = work.inputs

        def step():
            opt.zero_grad(set_to_none=True)
            compiled(*inputs).backward()
            opt.step()

        with skip_logging_in_graphs(True):
            for _ in range(8):
                step()
            torch.cuda.synchronize()
            times, hosts = [], []
            for _ in range(20):
                start = time.perf_counter()
                step()
                hosts.append(time.perf_counter() - start)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy = sum(e.device_time_total for e in kernels) / 3 / 1e3
            launches = {}
            for e in prof.events():
                if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC",
                              "cudaMemcpyAsync", "cudaGraphLaunch"):
                    launches[e.name] = launches.get(e.name, 0) + 1
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            pr.disable()
        times.sort()
        hosts.sort()
        print(f"\n{backend}: step {times[10] * 1e3:.2f} ms (min {times[0] * 1e3:.2f}), host call {hosts[10] * 1e3:.2f} "
              f"ms, GPU busy {busy:.2f} ms a step, {len(kernels) / 3:.0f} kernels a step, API calls over 3 steps "
              f"{launches}", flush=True)
        text = io.StringIO()
        pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(25)
        print("\n".join(text.getvalue().splitlines()[:45]), flush=True)
        del compiled, wrapped, model, opt, work
        stop_inductor_workers()
        torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
