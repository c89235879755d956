"""The on-disk cache brrr's stages share: generated kernels by source, compiled cubins, matmul choices.

`load_kernel(source, name, device)` gives the @triton.jit function `name` of a generated module, from
BRRR_CACHE_DIR (default ~/.cache/brrr/kernels)/brrr_<sha256(source, triton version, device)>.py. Every entry is
written via a temporary file and os.replace (`write_atomic`), so concurrent processes never see half a file; an
entry is trusted only when its text is the source it should hold (else rewritten: corrupt, truncated), and the
module runs that source, never cached bytecode. Temporary files older than STALE_TMP_S, left by writers that died
mid-write, are removed the first time a process uses the cache. The runtime loads its kernels here, the launcher
keeps its cubins in `cache_dir()/cubin`, and the matmul stage loads its template's kernels here and writes its
timed choices with `write_atomic`; so that all of them may import it, it imports nothing of brrr's.
"""

import hashlib
import os
import sys
import time
import types
import uuid

_MODULES = {}
_SWEPT = set()   # cache directories whose dead writers' temporary files this process removed
STALE_TMP_S = 600


def cache_dir():
    d = os.environ.get("BRRR_CACHE_DIR")
    d = os.path.join(d, "kernels") if d else os.path.join(os.path.expanduser("~"), ".cache", "brrr", "kernels")
    os.makedirs(d, exist_ok=True)
    if d not in _SWEPT:
        _SWEPT.add(d)
        _remove_stale_tmp((d, os.path.join(d, "cubin")))
    return d


def folder(name):
    """`<BRRR_CACHE_DIR or ~/.cache/brrr>/<name>`, made if missing: where a stage keeps its measured choices."""
    root = os.environ.get("BRRR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "brrr")
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    if d not in _SWEPT:
        _SWEPT.add(d)
        _remove_stale_tmp((d,))
    return d


def _remove_stale_tmp(folders):
    """Delete temporary files of writers that died mid-write (killed, or interrupted again while their threads
    were still writing) in `folders`. A live writer's temporary file exists for microseconds, so an old one is
    dead."""
    cutoff = time.time() - STALE_TMP_S
    for folder in folders:
        try:
            found = [e for e in os.scandir(folder) if e.name.startswith(".tmp-")]
        except OSError:   # no cubin folder (no GPU kernel launched yet)
            continue
        for entry in found:
            try:
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
            except OSError:   # gone already: another process swept it
                pass


def cache_key(source, device):
    import triton
    h = hashlib.sha256()
    for part in (source, triton.__version__, device, os.environ.get("TRITON_INTERPRET", "")):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def write_atomic(path, data):
    """`data` (text or bytes) into `path` through a temporary file renamed into place: whoever reads `path`
    sees the old file or the whole new one. The temporary file is opened as any file is, so the entry gets the
    umask's permissions (mkstemp's are the owner's alone: another user sharing the cache could not read it and
    would rewrite it on every load)."""
    tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "xb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def load_kernel(source, name, device):
    """the @triton.jit function `name` from `source`, via the disk cache (rebuilt if corrupt)."""
    key = cache_key(source, device)
    if key in _MODULES:
        return getattr(_MODULES[key], name)
    path = os.path.join(cache_dir(), f"brrr_{key}.py")
    if _read(path) != source:   # missing, truncated, corrupt
        write_atomic(path, source)
    # The module runs the source in hand, never bytecode Python cached beside the entry (a stale or corrupt .pyc
    # passes Python's mtime-and-size check); the file is there for triton.jit, which reads its function's
    # source back through inspect, and for tracebacks.
    module = types.ModuleType(f"brrr_kernel_{key}")
    module.__file__ = path
    sys.modules[module.__name__] = module
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(module.__name__, None)
        raise
    _MODULES[key] = module
    return getattr(module, name)


def device_name(plan):
    """The device a plan's kernels are cached and timed for: its first tensor's GPU by name, else its type."""
    import torch

    for n in plan.lowering.nodes:
        if n is not None and n.meta.get("fake") is not None and isinstance(n.meta["fake"], torch.Tensor):
            d = n.meta["fake"].device
            if d.type == "cuda":
                return torch.cuda.get_device_name(d)
            return str(d.type)
    return "cpu"
