"""brrr's kernels by the name a profiler sees them under (codegen -> **kernel registry** -> runtime; read by
brrr.analyze, which puts a brrr-compiled model's kernels on the roofline with their FLOPs, bytes and modules).

Names. A kernel's Triton function is named after what it fuses and a digest of its source (naming.py:
`brrr_bn_relu_1f3a9c07`); the launch in the generated call keeps its index in its graph (`brrr_bn_relu_3`). The
registry makes function names unique in the process: a kernel keeps its name unless another live kernel of
different source holds it, and then takes the first free `<name>_v2`, `_v3`, ... The function's name is what
CUPTI reports on CUDA, explain's and the analyzer's. Launches of one source, in one graph (a repeated layer) or in
two, share one name, one entry (with every launch's modules) and one Triton function.

Lifetime. An entry belongs to the graphs (FX GraphModules) that generated it, held weakly: it goes when the last
of them is freed, so the registry holds metadata of live graphs only.

Launch ranges. On CUDA the profiler sees each kernel under its name. Interpreted kernels (TRITON_INTERPRET=1, CPU)
launch no device kernel, so while brrr.analyze traces a CPU step it sets `LAUNCH_HOOK`, and the runtime's JIT launch
path (the only path an interpreted kernel takes) opens `LAUNCH_HOOK(name)` around the launch: the analyzer's
profiler range. Otherwise LAUNCH_HOOK is None and a launch pays one global read, on the JIT path only; the direct
launch path that GPU kernels take after their first launch never looks.
"""

import hashlib
import weakref
from dataclasses import dataclass, field, fields, replace

from brrr.compile.scheduling.pricing import KernelWork

LAUNCH_HOOK = None   # brrr.analyze, while it traces a CPU step: name -> context manager around an interpreted launch


@dataclass(frozen=True)
class KernelMeta(KernelWork):
    """What the analyzer needs about one brrr kernel: its pricing.KernelWork (how each number is counted), its
    name and the graph it belongs to."""

    name: str = ""
    graph: str = "graph"       # forward | backward | inference | graph

    @classmethod
    def of(cls, work, name, graph):
        return cls(**{f.name: getattr(work, f.name) for f in fields(work)}, name=name, graph=graph)


@dataclass
class _Entry:
    digest: str
    meta: KernelMeta = None
    owners: set = field(default_factory=set)   # id() of the live GraphModules that generated it


_ENTRIES = {}   # name -> _Entry


def _digest(source):
    return hashlib.sha256(source.encode()).hexdigest()


def renamed(source, old, new):
    """`source` with kernel `old` called `new` (its def line and its header comment name it)."""
    import re

    return source if old == new else re.sub(rf"\b{re.escape(old)}\b", new, source)


def claim(name, source):
    """(name, source) for a kernel generated as `name`: the first of name, name_v2, ... that no live kernel of other
    source holds, and the source renamed to it."""
    candidate, version = name, 1
    while True:
        text = renamed(source, name, candidate)
        entry = _ENTRIES.get(candidate)
        if entry is None or entry.digest == _digest(text):
            return candidate, text
        version += 1
        candidate = f"{name}_v{version}"


def register(meta, source, owner):
    """Record `meta` for the kernel `meta.name` of `source` (as claimed), generated for `owner` (a GraphModule): the
    entry lives while some owner does. A second graph generating the same source adds its modules."""
    entry = _ENTRIES.get(meta.name)
    if entry is None or entry.digest != _digest(source):
        entry = _ENTRIES[meta.name] = _Entry(_digest(source), meta)
    elif entry.meta is not meta and entry.meta is not None:
        merged = tuple(dict.fromkeys(entry.meta.modules + meta.modules))
        entry.meta = replace(entry.meta, modules=merged)
    if id(owner) not in entry.owners:
        entry.owners.add(id(owner))
        try:
            weakref.finalize(owner, _release, meta.name, id(owner), entry)
        except TypeError:   # an owner that can't be weakly referenced: the entry stays for the process
            pass


def _release(name, owner_id, entry):
    entry.owners.discard(owner_id)
    if not entry.owners and _ENTRIES.get(name) is entry:
        del _ENTRIES[name]


def lookup(name):
    """The KernelMeta of a live brrr kernel named `name`, or None."""
    entry = _ENTRIES.get(name)
    return entry.meta if entry is not None else None


def names():
    """The names of the live kernels (tests, debugging)."""
    return list(_ENTRIES)
