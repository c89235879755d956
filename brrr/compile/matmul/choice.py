"""Whether a fusable matmul runs as brrr's template with its epilogue or as cuBLAS then the epilogue's kernel,
and with which tile: by timing, once per problem, cached on disk (matmul fusion -> **choice** -> runtime).

`brrr.compile(model, matmul_templates=...)` ("off", "always", "auto"), else `BRRR_MATMUL_TEMPLATES` (0, 1, auto),
says how matmul_fusion decides:
- unset or "0": never fuse (every matmul a cuBLAS Extern), the default until GPU measurements say otherwise;
- "1": fuse wherever the epilogue can, with `configs.default_config`'s tile, operand prologues folded
  wherever they can be (tests, probes);
- "auto": on a GPU, time cuBLAS + the epilogue's own kernel against the fused kernel at up to `MAX_TILES`
  candidate tiles (and the kernel with operand prologues at as many, the others then running the operands'
  producers first), on zero-filled tensors of the graph's shapes and strides, and keep the fastest. Elsewhere
  (no GPU to time on) it does not fuse.

Choices are kept per device, torch and Triton versions, and the two ways' kernel sources (which bake in every
size and stride) in `<BRRR_CACHE_DIR or ~/.cache/brrr>/matmul_choices/<sha256>.json`, one file per problem,
written whole (tmp file + rename), so processes compiling at once share them and a warm compile times nothing.
"""

import hashlib
import json
import os

import torch

from brrr.compile.cache import folder, write_atomic

MAX_TILES = 3
_MEMO = {}


MODES = ("off", "always", "auto")


def mode(option=None):
    """`brrr.compile(..., matmul_templates=...)`'s choice where given, else BRRR_MATMUL_TEMPLATES's."""
    if option is not None:
        return option
    value = os.environ.get("BRRR_MATMUL_TEMPLATES", "0")
    return {"1": "always", "auto": "auto"}.get(value, "off")


def choices_dir():
    return folder("matmul_choices")


def problem_key(device_name, *sources):
    import triton
    text = "\n".join([device_name, torch.__version__, triton.__version__, *sources])
    return hashlib.sha256(text.encode()).hexdigest()


def _time_us(fn):
    from triton.testing import do_bench
    return do_bench(fn, warmup=10, rep=40) * 1e3


def cached(key):
    if key in _MEMO:
        return _MEMO[key]
    path = os.path.join(choices_dir(), f"{key}.json")
    try:
        with open(path) as f:
            entry = json.load(f)
        choice = entry["choice"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _MEMO[key] = choice
    return choice


def choose(key, ways, timer=None):
    """The name of the fastest of `ways` ({name: zero-argument launch}), timed once per key; a way that fails to
    run is not chosen. Returns None when none ran."""
    found = cached(key)
    if found is not None and found in ways:
        return found
    timer = timer or _time_us
    times = {}
    for name, run in ways.items():
        try:
            times[name] = timer(run)
        except Exception:   # a tile that does not compile or launch here is simply not a candidate
            continue
    if not times:
        return None
    best = min(times, key=times.get)
    _MEMO[key] = best
    entry = {"choice": best, "times_us": times}
    write_atomic(os.path.join(choices_dir(), f"{key}.json"), json.dumps(entry, indent=1).encode())
    return best
