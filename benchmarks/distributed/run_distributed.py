"""brrr under DDP and FSDP2 on two GPUs against eager and Inductor, one command (on a 2-GPU machine):

    PYTHONPATH=$PWD python3 benchmarks/distributed/run_distributed.py --out $OUT
    PYTHONPATH=$PWD python3 benchmarks/distributed/run_distributed.py --models llama-train --out $OUT
    PYTHONPATH=$PWD python3 benchmarks/distributed/run_distributed.py --quick --out /tmp/dist   # CPU, gloo

Backends: eager, brrr, brrr with CUDA graphs, and Inductor (last). Runs train_ranks.py twice per model: one
process on one GPU with no wrapper (the scaling baseline, at the same per-GPU batch; only where `--wraps` holds
ddp), then `torch.distributed.run --nproc-per-node 2` under the `--wraps` (DDP and FSDP2), the backends timed
in interleaved rounds (`--timing`, train_ranks.py's option). Every backend trains the zoo's model
(benchmarks/zoo/models.py, bf16, random init) from the same seed on the same batches. scaling_report.py turns
the two record files into `<date>-<gpu>-<commit>[-<models>].{json,md}`: per-GPU step time, scaling
efficiency, peak memory, the loss over the first steps against eager DDP's, graph breaks and brrr's fallbacks.
Compile caches are shared by the runs of one invocation (so the baseline's compiles warm the later ones'
kernels) and are fresh for each invocation.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_BACKENDS = "eager,brrr,brrr-cudagraphs,inductor"
sys.path[:0] = [str(HERE), str(HERE.parent)]   # scaling_report; result_files


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2-lm-train,llama-train", help="zoo configuration names")
    p.add_argument("--backends", default=DEFAULT_BACKENDS)
    p.add_argument("--gpus", type=int, default=2, help="processes (GPUs) of the distributed runs")
    p.add_argument("--loss-steps", type=int, default=20)
    p.add_argument("--timed-steps", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="tiny models on CPU with gloo, eager and brrr")
    p.add_argument("--keep-logging-breaks", action="store_true",
                   help="leave Dynamo's graph breaks at logging calls in model code (skipped by default, as the zoo)")
    p.add_argument("--out", default=None, help="directory for the JSON and Markdown (default results/distributed)")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse --short HEAD)")
    p.add_argument("--ddp-grads", default="bucket-view", help="bucket-view or copied (train_ranks.py's option)")
    p.add_argument("--timeout-s", type=float, default=1200, help="limit for each launched run")
    p.add_argument("--timing", default="interleaved", help="interleaved or sequential (train_ranks.py's option)")
    p.add_argument("--wraps", default="ddp,fsdp2",
                   help="wrappings on several GPUs (the one-GPU run for scaling comes first when ddp is among them)")
    return p.parse_args(argv)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, model, wraps, gpus, out):
    """train_ranks.py on `gpus` processes (1: a plain process on the first GPU); its record file, or None."""
    worker = [str(HERE / "train_ranks.py"), "--models", model, "--wraps", wraps, "--backends", args.backends,
              "--loss-steps", str(args.loss_steps), "--timed-steps", str(args.timed_steps),
              "--ddp-grads", args.ddp_grads, "--timing", args.timing, "--out", str(out)] + \
        (["--quick"] if args.quick else []) + (["--keep-logging-breaks"] if args.keep_logging_breaks else [])
    env = os.environ.copy()
    if gpus == 1:
        cmd = [sys.executable] + worker
        if not args.quick:
            env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port())] + worker
    started = time.perf_counter()
    print(f"[distributed] {model}: {wraps} on {gpus} process(es)", flush=True)
    try:
        subprocess.run(cmd, env=env, timeout=args.timeout_s, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"[distributed] {model} {wraps}: {type(e).__name__}: {e}"[:400], flush=True)
    print(f"[distributed] {model} {wraps}: {time.perf_counter() - started:.0f} s", flush=True)
    try:
        return json.loads(Path(out).read_text())
    except (OSError, ValueError):
        pass
    ranks = sorted(Path(out).parent.glob(f"{Path(out).name}.rank*"))   # what each rank kept before it stopped
    records = [r for path in ranks for r in json.loads(path.read_text())]
    return {"world": gpus, "records": records} if records else None


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.backends = "eager,brrr" if args.backends == DEFAULT_BACKENDS else args.backends
    cache = tempfile.mkdtemp(prefix="brrr-distributed-cache-")
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                     ("BRRR_CACHE_DIR", "brrr")):
        os.environ[var] = os.path.join(cache, sub)
    import torch

    import scaling_report as report
    from result_files import RESULTS, git_commit, result_stem, utc_date

    device_name = "cpu" if args.quick else torch.cuda.get_device_name()
    commit = args.commit or git_commit()
    out_dir = Path(args.out) if args.out else RESULTS / "distributed"
    models = args.models.split(",")
    stem = result_stem(out_dir, device_name, commit=commit)
    if models != ["gpt2-lm-train", "llama-train"]:
        stem = stem.with_name(f"{stem.name}-{'-'.join(models)}")
    environment = {"device": device_name, "gpus": args.gpus, "date": utc_date(), "commit": commit,
                   "torch": torch.__version__, "triton": _version("triton"), "transformers": _version("transformers"),
                   "dtype": "bfloat16", "backends": args.backends.split(","), "loss_steps": args.loss_steps,
                   "timed_steps": args.timed_steps, "timing": args.timing, "mode": "quick" if args.quick else "full",
                   "dynamo_skips_logging": not args.keep_logging_breaks, "ddp_grads": args.ddp_grads,
                   "nccl": ".".join(map(str, torch.cuda.nccl.version())) if not args.quick else None}
    records = []
    work = Path(tempfile.mkdtemp(prefix="brrr-distributed-"))
    for model in models:
        runs = ((("none", 1),) if "ddp" in args.wraps.split(",") else ()) + ((args.wraps, args.gpus),)
        for wraps, gpus in runs:
            got = launch(args, model, wraps, gpus, work / f"{model}-{gpus}.json")
            records += got["records"] if got else []
            report.write({"environment": environment, "records": records}, stem)
    results = report.write({"environment": environment, "records": records}, stem)
    print(report.markdown(results), flush=True)
    print(f"[distributed] wrote {stem}.json and .md", flush=True)
    return 0


def _version(name):
    try:
        return __import__(name).__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
