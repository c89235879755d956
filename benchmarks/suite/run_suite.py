"""The GPU benchmark suite, one command: seeds' experiments, the seed MLP, micro-benchmarks, BERT and GPT-2.

    PYTHONPATH=$PWD python3 benchmarks/suite/run_suite.py --out $OUT          # on the GPU machine, < 8 minutes
    PYTHONPATH=$PWD python3 benchmarks/suite/run_suite.py --quick --out /tmp  # CPU smoke run of the same code

Writes <out>/<date>-<gpu>-<commit>.json and .md (rewritten after every section, so a cut-off run still leaves
its numbers), plus the repeat sweep's PNGs beside them (`...-repeat-<backend>.png`). The default <out> is
benchmarks/results/suite/; benchmarks/results_index.py lists a recorded run in results/INDEX.md. Sections start
only while the time budget (--budget-s) lasts; a section or configuration that fails is recorded with its error
and the suite goes on. Inductor and Triton caches point at a fresh directory (unless --keep-caches), so "cold compile"
means cold.
"""

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # suite_sections, suite_report; result_files

from result_files import RESULTS, git_commit, result_stem, utc_date  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RESULTS / "suite"), help="directory for the JSON, Markdown and PNGs")
    p.add_argument("--commit", help="the commit measured, for the file names (default: git rev-parse --short HEAD, "
                                    "else 'nogit')")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny sizes, eager/aot_eager/brrr")
    p.add_argument("--sections", default="repeat,cos,mlp,micro,models",
                   help="comma-separated subset of: repeat, cos, mlp, micro, models")
    p.add_argument("--backends", help="comma-separated backends (default: eager,inductor,brrr)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="no new configuration starts after this many seconds (a started one finishes)")
    p.add_argument("--keep-caches", action="store_true", help="keep the existing Inductor/Triton caches")
    return p.parse_args(argv)


def fresh_caches():
    """Point Inductor's and Triton's on-disk caches at a new directory (before torch is imported)."""
    root = tempfile.mkdtemp(prefix="brrr-suite-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    return root


def main(argv=None):
    args = parse_args(argv)
    cache_root = None if args.keep_caches else fresh_caches()

    import torch
    from rich.console import Console

    import suite_report
    import suite_sections as suite

    console = Console(width=200)
    cfg = dict(suite.QUICK if args.quick else suite.FULL)
    if args.backends:
        cfg["backends"] = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    if cfg["device"] == "cuda" and not torch.cuda.is_available():
        console.print("[red]no CUDA GPU here: use --quick for a CPU smoke run[/red]")
        return 2
    device = torch.device(cfg["device"])
    from brrr.experiments.common import device_name, versions

    name = device_name(device)
    date, commit = utc_date(), args.commit or git_commit()
    stem = result_stem(args.out, name, commit=commit, date=date)
    results = {
        "environment": {"device_name": name, "date": date, "commit": commit,
                        "utc": datetime.now(timezone.utc).isoformat(),
                        "versions": versions(), "mode": "quick" if args.quick else "full",
                        "backends": list(cfg["backends"]), "cache_dir": cache_root,
                        "config": {k: str(v) for k, v in cfg.items()}},
        "sections": {},
    }
    budget = suite.Budget(args.budget_s)

    def save():
        import json

        results["elapsed_s"] = budget.elapsed()
        stem.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str))
        stem.with_suffix(".md").write_text(suite_report.render(results))

    box = []
    results["sections"]["ceilings"] = suite.guarded(budget, suite.section_ceilings, cfg, budget, console, box)
    ceilings = box[0] if box else None
    save()
    for section in [s.strip() for s in args.sections.split(",") if s.strip()]:
        if section not in suite.SECTIONS:
            console.print(f"[red]unknown section {section!r}[/red]")
            continue
        console.rule(f"{section} ({budget.elapsed():.0f} s in)")
        started = time.perf_counter()
        results["sections"][section] = suite.guarded(budget, suite.SECTIONS[section], cfg, budget, console,
                                                     ceilings, str(stem))
        console.print(f"{section}: {results['sections'][section]['status']} in "
                      f"{time.perf_counter() - started:.0f} s")
        save()
    console.rule(f"done in {budget.elapsed():.0f} s: {stem}.json, {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
