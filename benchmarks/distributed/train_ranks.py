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
which a step's collectives join before its optimizer runs; the time until each step's call returns is kept too
(host_step_s; these steps wait on the device somewhere, so it reads about the step time and does not by itself
tell host-bound from device-bound). By default (`--timing interleaved`) every backend's run of a (model,
wrapping) is built and trained through its loss steps in turn and kept alive, then all are timed in rounds,
each round giving every run its share of the steps in turn: FSDP2's steps are bound by the host, and on a shared
host timed one backend after another they put a different backend ahead from one call to the next (GPT-2 under
FSDP2 read 49-89 ms for the same code). Peak memory is then taken over a few steps of each run before the rounds,
less what was allocated before its build (the runs kept alive). `--timing sequential` builds, times (peak memory
over the timed steps) and frees each run before the next.
Rank 0 writes every rank's record to `--out`; each rank also keeps its own in `--out`.rank<N>, rewritten after
every run.
"""

import argparse
import contextlib
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
    p.add_argument("--timing", choices=("interleaved", "sequential"), default="interleaved",
                   help="time every backend's run in interleaved rounds, all kept alive (peak memory then taken "
                        "over a few steps of each, less what the others hold), or each run alone after the last")
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


class Run:
    """One (model, wrapping, backend) on this rank: built, compiled and trained through the loss steps by
    `prepare`, then timed by `time_steps` (once, or in rounds between other backends' runs), then `finish`ed into
    its record."""

    def __init__(self, config, how, backend, args, device, rank, world):
        self.config, self.how, self.backend, self.args = config, how, backend, args
        self.device, self.rank, self.world = device, rank, world
        self.times, self.host = [], []

    def prepare(self, reset=True, memory_steps=0):
        """Build, wrap, compile, and train the loss steps. `memory_steps` > 0: the peak memory is taken over that
        many steps now, less what was allocated before the build (other runs kept alive for interleaving)."""
        import torch._dynamo

        from brrr.bench.backends import dynamo_limits, resolve_backend, skip_logging_in_graphs, stop_inductor_workers
        from brrr.compile import fallbacks
        from brrr.compile.runtime import replay_choice

        if reset:
            torch._dynamo.reset()
        from torch._dynamo.utils import counters
        counters.clear()
        args, device = self.args, self.device
        self.fallbacks_before = len(fallbacks.LOG)
        self.decisions_before = len(replay_choice.DECISIONS)
        self.sync = sync = Sync(device)
        before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        self.work = work = self.config.build(device, torch.bfloat16, args.quick)
        self.model = model = work.model
        ids = work.inputs[0]
        vocab = model.model.config.vocab_size
        self.wrapped = wrap(model, self.how, device, args.ddp_grads)
        self.compiled = self.wrapped if self.backend == "eager" else \
            torch.compile(self.wrapped, backend=resolve_backend(self.backend))
        self.opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        self.data = data = batches(vocab, ids.shape[0], ids.shape[1], args.loss_steps, self.rank, device)
        record = self.record = {"model": self.config.name, "wrap": self.how, "backend": self.backend,
                                "world": self.world, "rank": self.rank, "batch_per_gpu": list(ids.shape)}
        if self.how == "ddp":
            record["ddp_grads"] = args.ddp_grads
        # as the zoo, logging calls skipped; entered after the build, which may add logging methods
        self.limits = dynamo_limits(64)
        self.skip_logging = lambda: skip_logging_in_graphs(not args.keep_logging_breaks)
        with self.context():
            sync()
            start = time.perf_counter()
            losses = [self.step(data[0])]
            sync()
            record["first_step_s"] = time.perf_counter() - start
            losses += [self.step(inputs) for inputs in data[1:]]
            local = torch.stack(losses).float()
            mean = local.clone()
            if self.world > 1:
                dist.all_reduce(mean)
                mean /= self.world
            record["losses"] = mean.tolist()
            record["local_losses"] = local.tolist()
            record["parameter_sum"] = parameter_sum(model)
            if memory_steps and device.type == "cuda":
                sync()
                torch.cuda.reset_peak_memory_stats(device)
                for i in range(memory_steps):
                    self.step(data[i % len(data)])
                sync()
                record["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device) - before
        record.update(graph_stats())
        # what this run's build and loss steps decided and fell back on (later runs add their own after it)
        record["brrr_fallbacks"] = brrr_fallbacks(self.fallbacks_before)
        record["replay_verdicts"] = [(d.graph, d.replay, d.reason)
                                     for d in replay_choice.DECISIONS[self.decisions_before:]]
        if self.backend == "inductor":
            stop_inductor_workers()   # idle compile workers share the host with whatever is timed next

    def context(self):
        """Dynamo's limits and the skipped logging calls, entered around every step of this run."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch._dynamo.config.patch(self.limits))
        stack.enter_context(self.skip_logging())
        return stack

    def step(self, inputs):
        self.opt.zero_grad(set_to_none=True)
        loss = self.compiled(*inputs)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def time_steps(self, n, peak=False):
        """Time `n` steps (CUDA events on the default stream; host time until each call returns); `peak`: reset
        the peak memory before them and keep it."""
        data, device = self.data, self.device
        with self.context():
            if device.type != "cuda":
                for i in range(n):
                    start = time.perf_counter()
                    self.step(data[(len(self.times) + i) % len(data)])
                    self.times.append(time.perf_counter() - start)
                return
            if peak:
                torch.cuda.reset_peak_memory_stats(device)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
            if self.world > 1:
                dist.barrier()
            self.sync()
            events[0].record()
            for i in range(n):
                start = time.perf_counter()
                self.step(data[(len(self.times) + i) % len(data)])
                self.host.append(time.perf_counter() - start)
                events[i + 1].record()
            self.sync()
            self.times += [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]
            if peak:
                self.record["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)

    def finish(self):
        """The record, and everything this run holds let go."""
        record = self.record
        record["step_times_s"] = self.times
        record["step_s"] = sorted(self.times)[len(self.times) // 2] if self.times else None
        if self.host:
            record["host_step_s"] = sorted(self.host)[len(self.host) // 2]
        for name in ("compiled", "wrapped", "model", "opt", "work", "data"):
            setattr(self, name, None)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return record


def train(config, how, backend, args, device, rank, world):
    """One (model, wrapping, backend) run of this rank, timed alone: its record."""
    run = Run(config, how, backend, args, device, rank, world)
    run.prepare()
    run.time_steps(args.timed_steps, peak=True)
    return run.finish()


INTERLEAVE_ROUNDS = 6   # rounds of timed steps; in each, every backend's run takes its share in turn
MEMORY_STEPS = 3        # steps over which an interleaved run's peak memory is taken, before the rounds


def train_interleaved(config, how, backends, args, device, rank, world):
    """Every backend's run of one (model, wrapping), built and trained through its loss steps in turn and kept
    alive, then timed in INTERLEAVE_ROUNDS rounds: each round gives every run timed_steps / rounds steps, one run
    after another, so a host that slows for a while slows every backend alike. Records in `backends` order; a
    run that fails records its error, and the others go on."""
    runs, records = [], {}
    for i, backend in enumerate(backends):
        run = Run(config, how, backend, args, device, rank, world)
        print(f"[distributed] rank {rank}: {config.name} {how} {backend}", flush=True)
        try:
            run.prepare(reset=i == 0, memory_steps=MEMORY_STEPS)
            runs.append(run)
        except Exception as e:
            records[backend] = _error_record(config.name, how, backend, world, rank, e)
    per_round = max(1, args.timed_steps // INTERLEAVE_ROUNDS)
    for run in runs:   # one untimed step each: whatever the runs' building left (a recompile) lands here
        run.time_steps(1)
        run.times, run.host = [], []
    for _ in range(INTERLEAVE_ROUNDS):
        for run in runs:
            run.time_steps(per_round)
    for run in runs:
        records[run.backend] = run.finish()
    return [records[b] for b in backends if b in records]


def _error_record(name, how, backend, world, rank, e):
    import traceback
    traceback.print_exc()
    return {"model": name, "wrap": how, "backend": backend, "world": world, "rank": rank,
            "error": f"{type(e).__name__}: {e}"[:800]}


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
            if args.timing == "interleaved":
                records += train_interleaved(configs[name], how, backends, args, device, rank, world)
                Path(f"{args.out}.rank{rank}").write_text(json.dumps(records))
                if world > 1:
                    dist.barrier()
                continue
            for backend in backends:
                print(f"[distributed] rank {rank}: {name} {how} {backend}", flush=True)
                try:
                    record = train(configs[name], how, backend, args, device, rank, world)
                except Exception as e:   # recorded, and the other runs go on: both ranks fail alike
                    record = _error_record(name, how, backend, world, rank, e)
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
