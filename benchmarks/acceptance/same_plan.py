"""Does a refactor leave brrr's plans alone? The kernels brrr generates for three zoo configurations, by name.

    PYTHONPATH=$PWD python3 benchmarks/acceptance/same_plan.py --out $OUT            # GPU, full sizes
    PYTHONPATH=$PWD python3 benchmarks/acceptance/same_plan.py --quick --out /tmp/p  # CPU, tiny models
    python3 benchmarks/acceptance/same_plan.py --diff before.json after.json          # same kernels?

The three: a transformer training step (bert-mlm-train), a CNN inference (resnet50-infer) and a changing-shape
run (bert-lengths-infer, every length). Each is compiled with brrr's defaults and called twice per shape (the
second call takes the launch-or-replay trial's path), then every live kernel of the registry is listed: its
graph, its name and the ATen ops it fuses, with the count per graph. `--diff` exits 1 when two listings differ.
"""

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "zoo"), str(HERE.parent)]   # models; result_files

CONFIGS = ("bert-mlm-train", "resnet50-infer", "bert-lengths-infer")


def registry():
    """brrr's kernel registry, wherever the compiler's layout keeps it."""
    import importlib

    for name in ("brrr.compile.runtime.kernel_registry", "brrr.compile.kernel_registry"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("no brrr kernel registry found")


def kernels_of(config, device, dtype, quick):
    """[{graph, name, ops}] of the kernels brrr generated for `config`, sorted."""
    import torch

    from brrr.bench.backends import fresh_compile, skip_logging_in_graphs
    from brrr.bench.step import Step, make_cotangents

    work = config.build(device, dtype, quick)
    shapes = [inputs for _, inputs in work.shapes] if work.shapes else [work.inputs]
    cotangents = make_cotangents(work.model(*shapes[0])) if work.train else None
    compiled = fresh_compile(work.model, "brrr")
    reg = registry()
    with skip_logging_in_graphs(True):
        for inputs in shapes:
            step = Step(compiled, work.model, [inputs], work.train,
                        [c for c in cotangents] if cotangents is not None else None)
            if work.train and len(shapes) > 1:
                step.cotangents = make_cotangents(work.model(*inputs))
            for _ in range(2):
                step()
    if device == "cuda":
        torch.cuda.synchronize()
    listed = []
    for name in reg.names():
        meta = reg.lookup(name)
        listed.append({"graph": getattr(meta, "graph", "?"), "name": name,
                       "ops": list(getattr(meta, "ops", ()) or ())})
    del compiled, work
    return sorted(listed, key=lambda k: (k["graph"], k["name"]))


def summary(listing):
    return {cfg: dict(Counter(k["graph"] for k in kernels)) for cfg, kernels in listing["configs"].items()}


def diff(a_path, b_path):
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    same = True
    for cfg in sorted(set(a["configs"]) | set(b["configs"])):
        ka = {(k["graph"], k["name"], tuple(k["ops"])) for k in a["configs"].get(cfg, [])}
        kb = {(k["graph"], k["name"], tuple(k["ops"])) for k in b["configs"].get(cfg, [])}
        if ka == kb:
            print(f"{cfg}: same {len(ka)} kernels {dict(Counter(g for g, _, _ in ka))}")
            continue
        same = False
        print(f"{cfg}: {len(ka)} kernels before, {len(kb)} after")
        for k in sorted(ka - kb):
            print(f"  only before: {k[0]} {k[1]} {list(k[2])}")
        for k in sorted(kb - ka):
            print(f"  only after:  {k[0]} {k[1]} {list(k[2])}")
    return 0 if same else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--quick", action="store_true", help="tiny models on the CPU (TRITON_INTERPRET=1)")
    p.add_argument("--only", default=",".join(CONFIGS))
    p.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"))
    args = p.parse_args(argv)
    if args.diff:
        return diff(*args.diff)
    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import gc

    import torch

    import models
    from result_files import git_commit, result_stem

    device = "cpu" if args.quick else "cuda"
    listing = {"commit": git_commit(), "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "torch": torch.__version__, "quick": args.quick, "configs": {}}
    for name in args.only.split(","):
        listing["configs"][name] = kernels_of(models.BY_NAME[name], device, torch.bfloat16, args.quick)
        torch._dynamo.reset()
        gc.collect()
    stem = result_stem(args.out, listing["device"], commit=listing["commit"])
    path = stem.with_name(stem.name + "-same-plan.json")
    path.write_text(json.dumps(listing, indent=1))
    print(json.dumps(summary(listing)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
