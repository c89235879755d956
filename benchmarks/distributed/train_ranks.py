"""One process of the distributed benchmark (run_distributed.py starts it): trains a zoo model under DDP, FSDP2
or alone, eagerly and compiled, and records what the report judges. As in the zoo, Dynamo skips logging calls
in model code for every backend (`--keep-logging-breaks` keeps them breaking the graph).

    python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/distributed/train_ranks.py \
        --models gpt2-lm-train --wraps ddp,fsdp2 --backends eager,brrr,inductor --out part.json
    python3 benchmarks/distributed/train_ranks.py --wraps none ...   # one GPU, no process group

For each model, wrapping and backend (Inductor last, as in the zoo): the model is built from the same seed,
wrapped (DDP; FSDP2's `fully_shard` on each of the model's blocks and on the root; or nothing), compiled
whole with `torch.compile(wrapped, backend=...)`, and trained with AdamW on batches drawn from (step, rank).
The first `--loss-steps` steps give the loss (averaged over ranks) that is compared with eager DDP; the first
of them holds the compile. Then `--timed-steps` steps are timed between CUDA events on the default stream,
which a step's collectives join before its optimizer runs, with peak memory reset before them; the time
until each step's call returns is kept too (host_step_s; these steps wait on the device somewhere, so it reads
about the step time and does not by itself tell host-bound from device-bound).
Rank 0 writes every rank's record to `--out`; each rank also keeps its own in `--out`.rank<N>, rewritten after
every run.
"""

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

# NVLink multicast stays off on shared hosts (the device tool's KINDS.md): set before NCCL or torch loads
for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_var] = _value

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "zoo"), str(HERE.parent.parent)]   # zoo's models; brrr from the checkout

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2-lm-train,llama-train", help="zoo configuration names")
    p.add_argument("--wraps", default="ddp,fsdp2", help="ddp, fsdp2, or none (one process, no process group)")
    p.add_argument("--backends", default="eager,brrr,brrr-cudagraphs,inductor")
    p.add_argument("--loss-steps", type=int, default=20)
    p.add_argument("--timed-steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--quick", action="store_true", help="tiny models on CPU with gloo (a smoke run)")
    p.add_argument("--keep-logging-breaks", action="store_true",
                   help="leave Dynamo's graph breaks at logging calls in model code (skipped by default, as the zoo)")
    p.add_argument("--ddp-grads", choices=DDP_GRADS, default="bucket-view",
                   help="where DDP leaves the gradients: views of its all-reduce buckets (gradient_as_bucket_view, "
                        "no copy out of them after each all-reduce), or copied back into each .grad (DDP's default)")
    p.add_argument("--out", required=True, help="JSON written by rank 0")
    return p.parse_args(argv)


def model_blocks(model):
    """The model's repeated blocks: submodules whose class Hugging Face lists as not to be split across
    devices (`_no_split_modules`), which is what FSDP wraps one by one."""
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


DDP_GRADS = ("bucket-view", "copied")


def wrap(model, how, device, ddp_grads="bucket-view"):
    """The model under `how`. DDP's gradients are views of its buckets by default: its own copies of 148
    buckets' slices back into GPT-2's .grad tensors took ~2 ms of host time a step, after the last all-reduce,
    for every backend alike (benchmarks/NOTES.md)."""
    if how == "none":
        return model
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       gradient_as_bucket_view=ddp_grads == "bucket-view")
    assert how == "fsdp2", how
    from torch.distributed.fsdp import fully_shard

    blocks = model_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no blocks to shard")
    for block in blocks:
        fully_shard(block)
    return fully_shard(model)


def batches(vocab, batch, seq, steps, rank, device):
    """Step s of rank r trains on tokens drawn from seed (s, r): the same data for every backend."""
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        out.append((ids, ids.clone()))
    return out


class Sync:
    """Waits for the device (a no-op on CPU)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self):
        if self.cuda:
            torch.cuda.synchronize()


def graph_stats():
    from torch._dynamo.utils import counters

    breaks = {reason[:160]: n for reason, n in counters["graph_break"].items()}
    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(breaks.values()),
            "graph_break_reasons": dict(sorted(breaks.items(), key=lambda kv: -kv[1])[:5])}


def brrr_fallbacks(since):
    from brrr.compile import fallbacks

    return [f"{f.scope}/{f.graph}: {f.reason[:160]}" for f in fallbacks.LOG[since:]]


def train(config, how, backend, args, device, rank, world):
    """One (model, wrapping, backend) run of this rank: its record."""
    import torch._dynamo

    from brrr.bench.backends import dynamo_limits, resolve_backend, skip_logging_in_graphs, stop_inductor_workers
    from brrr.compile import fallbacks, replay_choice

    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    fallbacks_before = len(fallbacks.LOG)
    decisions_before = len(replay_choice.DECISIONS)
    sync = Sync(device)
    work = config.build(device, torch.bfloat16, args.quick)
    model = work.model
    ids = work.inputs[0]
    vocab = model.model.config.vocab_size
    wrapped = wrap(model, how, device, args.ddp_grads)
    compiled = wrapped if backend == "eager" else torch.compile(wrapped, backend=resolve_backend(backend))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = batches(vocab, ids.shape[0], ids.shape[1], args.loss_steps, rank, device)

    def step(inputs):
        opt.zero_grad(set_to_none=True)
        loss = compiled(*inputs)
        loss.backward()
        opt.step()
        return loss.detach()

    record = {"model": config.name, "wrap": how, "backend": backend, "world": world, "rank": rank,
              "batch_per_gpu": list(ids.shape)}
    if how == "ddp":
        record["ddp_grads"] = args.ddp_grads
    # as the zoo, logging calls skipped; entered after the build, which may add logging methods
    with torch._dynamo.config.patch(dynamo_limits(64)), \
            skip_logging_in_graphs(not args.keep_logging_breaks):
        sync()
        start = time.perf_counter()
        losses = [step(data[0])]
        sync()
        record["first_step_s"] = time.perf_counter() - start
        losses += [step(inputs) for inputs in data[1:]]
        local = torch.stack(losses).float()
        mean = local.clone()
        if world > 1:
            dist.all_reduce(mean)
            mean /= world
        record["losses"] = mean.tolist()
        record["local_losses"] = local.tolist()
        record["parameter_sum"] = parameter_sum(model)

        times = []
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(args.timed_steps + 1)]
            if world > 1:
                dist.barrier()
            sync()
            host = []
            events[0].record()
            for i in range(args.timed_steps):
                start = time.perf_counter()
                step(data[i % len(data)])
                host.append(time.perf_counter() - start)
                events[i + 1].record()
            sync()
            times = [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]
            record["host_step_s"] = sorted(host)[len(host) // 2]
            record["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        else:
            for i in range(args.timed_steps):
                start = time.perf_counter()
                step(data[i % len(data)])
                times.append(time.perf_counter() - start)
        record["step_times_s"] = times
        record["step_s"] = sorted(times)[len(times) // 2] if times else None
    record.update(graph_stats())
    record["brrr_fallbacks"] = brrr_fallbacks(fallbacks_before)
    # each graph's launch-or-replay verdict on this rank, in order: the ranks must take the same ones
    record["replay_verdicts"] = [(d.graph, d.replay, d.reason) for d in replay_choice.DECISIONS[decisions_before:]]
    del compiled, wrapped, model, opt, work, data
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    stop_inductor_workers()
    return record


def parameter_sum(model):
    """Sum of every parameter as a full tensor: equal on every rank when the ranks did not diverge."""
    total = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
    for p in model.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        total += full.detach().double().sum()
    return total.item()


def main(argv=None):
    args = parse_args(argv)
    import models

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    wraps = args.wraps.split(",")
    launched = "RANK" in os.environ   # by torchrun, maybe as one process (one-GPU NCCL)
    if not launched and wraps != ["none"]:
        raise SystemExit("a plain process trains with --wraps none; DDP and FSDP2 need torchrun")
    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = torch.device("cpu")
        torch.set_num_threads(1)
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if launched:
        dist.init_process_group("gloo" if args.quick else "nccl", device_id=device if device.type == "cuda" else None)
    configs = {c.name: c for c in models.CONFIGS}
    backends = sorted(args.backends.split(","), key=lambda b: b == "inductor")   # Inductor last
    records = []
    for name in args.models.split(","):
        for how in wraps:
            for backend in backends:
                print(f"[distributed] rank {rank}: {name} {how} {backend}", flush=True)
                try:
                    record = train(configs[name], how, backend, args, device, rank, world)
                except Exception as e:   # recorded, and the other runs go on: both ranks fail alike
                    record = {"model": name, "wrap": how, "backend": backend, "world": world, "rank": rank,
                              "error": f"{type(e).__name__}: {e}"[:800]}
                    import traceback
                    traceback.print_exc()
                records.append(record)
                # each rank's records so far, kept in case a later run takes the process down (a CUDA error)
                Path(f"{args.out}.rank{rank}").write_text(json.dumps(records))
                if world > 1:
                    dist.barrier()
    gathered = [None] * world
    if world > 1:
        dist.all_gather_object(gathered, records)
    else:
        gathered = [records]
    if rank == 0:
        Path(args.out).write_text(json.dumps({"world": world, "records": [r for rs in gathered for r in rs]},
                                             indent=1))
    if launched:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
