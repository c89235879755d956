"""Names of recorded benchmark results: `benchmarks/results/<kind>/<date>-<gpu>-<commit>[-<what>].<ext>`.

The suite and the acceptance scripts name what they write with `result_stem`, so a file says on its own which
code (the checkout's short commit hash) it measured on which machine (the GPU's short name) and when (UTC date).
`parse_result_name` reads such a name back; `benchmarks/results_index.py` generates `benchmarks/results/INDEX.md`
from them.
"""

import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
RESULT_STEM = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})-(?P<gpu>[a-z0-9-]+?)-(?P<commit>[0-9a-f]{7,40}|nogit)"
                         r"(?:-(?P<what>.+))?")


@dataclass(frozen=True)
class ResultName:
    date: str
    gpu: str
    commit: str
    what: str     # '' for a run's main files
    ext: str      # everything after the first dot: 'json', 'trace.json'


def gpu_slug(device_name):
    """The device's short name: 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA A100-SXM4-80GB' -> 'a100',
    'cpu (x86_64, 16 threads)' -> 'cpu'; the whole name as a slug when no word mixes letters and digits."""
    words = re.findall(r"[a-z0-9]+", device_name.lower())
    if words and words[0] == "cpu":
        return "cpu"
    for word in words:
        if re.search(r"[a-z]", word) and re.search(r"[0-9]", word):
            return word
    return "-".join(words) or "device"


def git_commit(cwd=None):
    """The short hash of the checkout's HEAD, or 'nogit' where there is no git or no repository. `BRRR_COMMIT`
    names it where the checkout cannot: a copy of a working tree whose git is not the one its files came from."""
    if os.environ.get("BRRR_COMMIT"):
        return os.environ["BRRR_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd or Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "nogit"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "nogit"


def utc_date():
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def run_environment(device_type, gpus, commit=None):
    """What a run records of where it ran: the device's name ("cpu" off CUDA), torch's and Triton's versions, the
    commit measured (`commit`, else this checkout's), the UTC date and the GPUs it spread over."""
    import torch
    import triton

    device = torch.cuda.get_device_name() if device_type == "cuda" else "cpu"
    return {"device": device, "torch": torch.__version__, "triton": triton.__version__,
            "commit": commit or git_commit(), "date": utc_date(), "gpus": gpus}


def result_stem(out_dir, device_name, commit=None, date=None):
    """`out_dir/<date>-<gpu>-<commit>` (a Path without extension); a run's files add `-<what>` and their
    extension to it. The directory is created."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir / f"{date or utc_date()}-{gpu_slug(device_name)}-{commit or git_commit()}"


def parse_result_name(filename):
    """'2026-11-26-h200-c864cdf-layout-kernels.log' -> ResultName('2026-11-26', 'h200', 'c864cdf',
    'layout-kernels', 'log'); None for a name that does not follow the convention."""
    stem, _, ext = filename.partition(".")
    match = RESULT_STEM.fullmatch(stem)
    if match is None:
        return None
    return ResultName(match["date"], match["gpu"], match["commit"], match["what"] or "", ext)
