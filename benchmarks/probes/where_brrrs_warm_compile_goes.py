"""Where does brrr's warm compile of BertForMaskedLM training go on the GPU?

Answer so far, from the CPU only (`TRITON_INTERPRET=1`, kernels not run; benchmarks/NOTES.md, "Where brrr's
compile time goes"): Dynamo 2.8 s, AOTAutograd 4.5 s, brrr 5.2 s of 12.5 s. On the H100 the zoo measured 15.8 s
warm for brrr and 2.3 s for Inductor (`results/zoo/2026-11-24-h100-0e01b6a.md`). This probe times the same phases
there, with what the CPU cannot show: Triton's warm-up of each cached kernel and the first launches.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_brrrs_warm_compile_goes.py              # GPU, ~2 minutes
    PYTHONPATH=$PWD python3 benchmarks/probes/where_brrrs_warm_compile_goes.py --tiny       # CPU smoke run

Three new processes share one fresh cache directory: brrr with the caches cold (filling them), brrr with them
warm, and Dynamo alone (`backend="eager"`). Each times its first training step (zoo's bert-mlm-train, bf16) and
the phases inside it, by wrapping the functions the real code path calls. Output:
`benchmarks/results/probes/<date>-<gpu>-<commit>-warm-compile-phases.log`.
"""

import argparse
import collections
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "zoo"), str(HERE.parent)]   # models; result_files

PHASES = [   # (module, attribute, label): wrapped where the compile path looks them up
    ("torch._dynamo.output_graph", "OutputGraph.call_user_compiler", "backend: AOTAutograd + brrr"),
    ("brrr.compile.backend", "compile_graph", "brrr compile_graph"),
    ("brrr.compile.lower", "lower", "  lower"),
    ("brrr.compile.schedule", "schedule", "  schedule"),
    ("brrr.compile.runtime", "build", "  build (codegen, memory, load, the call's source)"),
    ("brrr.compile.runtime", "generate_all", "    codegen"),
    ("brrr.compile.runtime", "reused_memory", "    reused memory"),
    ("brrr.compile.runtime", "_load_and_warm", "    kernel load + Triton warm-up (threads, summed)"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: the zoo's tiny BERT, TRITON_INTERPRET=1")
    p.add_argument("--out", default=None, help="log directory (default results/probes)")
    p.add_argument("--child", help=argparse.SUPPRESS)   # a backend: time one first step in this process
    return p.parse_args(argv)


def wrap_phases(totals, counts):
    import importlib

    lock = threading.Lock()   # kernels load in a thread pool

    for module_name, attribute, label in PHASES:
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        fn = getattr(owner, name)

        def timed(*args, _fn=fn, _label=label, **kwargs):
            start = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                with lock:
                    totals[_label] += time.perf_counter() - start
                    counts[_label] += 1
        setattr(owner, name, functools.wraps(fn)(timed))


def first_step(backend, tiny):
    """{phase: seconds} of one first training step compiled with `backend`, in this new process."""
    import torch

    import models

    totals, counts = collections.defaultdict(float), collections.Counter()
    if backend != "eager":
        wrap_phases(totals, counts)
    device = "cpu" if tiny else "cuda"
    work = models.BY_NAME["bert-mlm-train"].build(device, torch.bfloat16, tiny)
    from brrr.bench.backends import resolve_backend

    compiled = torch.compile(work.model, backend=resolve_backend(backend) or backend)   # no entry point needed
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    compiled(*work.inputs).backward()
    if device == "cuda":
        torch.cuda.synchronize()
    out = {"first step": time.perf_counter() - start}
    out.update({f"{label} (x{counts[label]})": totals[label] for _, _, label in PHASES if label in totals})
    return out


def run_child(backend, tiny, env):
    cmd = [sys.executable, __file__, "--child", backend] + (["--tiny"] if tiny else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": done.stderr[-1500:]}


def main(argv=None):
    args = parse_args(argv)
    if args.tiny:
        os.environ["TRITON_INTERPRET"] = "1"
    if args.child:
        print(json.dumps(first_step(args.child, args.tiny)), flush=True)
        return 0
    from result_files import RESULTS, result_stem

    root = tempfile.mkdtemp(prefix="brrr-probe-cache-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{root}/inductor", TRITON_CACHE_DIR=f"{root}/triton",
               BRRR_CACHE_DIR=f"{root}/brrr")
    lines = []
    for label, backend in (("brrr, caches cold", "brrr"), ("brrr, caches warm", "brrr"),
                           ("Dynamo alone (backend eager)", "eager")):
        section = [f"## {label}"] + [f"{seconds:8.2f} s  {phase}" if isinstance(seconds, float) else
                                     f"{phase}: {seconds}" for phase, seconds in run_child(backend, args.tiny,
                                                                                         env).items()]
        print("\n".join(section), flush=True)
        lines += section
    import torch

    device = "cpu" if args.tiny else torch.cuda.get_device_name()
    stem = result_stem(Path(args.out) if args.out else RESULTS / "probes", device)
    path = stem.with_name(f"{stem.name}-warm-compile-phases.log")
    path.write_text(__doc__.splitlines()[0] + "\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
