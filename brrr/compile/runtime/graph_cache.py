"""Compiled graphs on disk (codegen -> **runtime**): a second compile of the same graph, in any process, plans
nothing.

Lowering, scheduling and code generation are a pure function of a graph and what brrr was asked, so their
product is kept: the generated `call`, its constants, and each kernel's source, grid and launch meta
(compiled.KernelSpec) with its compiled binary where torch's static launcher takes it (launch.binary_of), the
floor's view of each kernel (floor.KernelChoice) and the analyzer's (kernel_registry.KernelMeta). A hit hands
them to `compiled.assemble`, which loads each kernel's binary without Triton's JIT (the others from the kernel
cache, their binaries from Triton's) and runs the call; nothing is lowered, scheduled or generated
(`STATS["planned"]` counts what was).

The key (`key`): the graph's code, every node's value metadata (sizes, strides, dtypes, devices), the value
of each constant it reads, the graph's kind, the ops forced to ATen and the plan's splits (the floor's and a
re-plan's choices: each form is an entry of its own), brrr's options, every `BRRR_*` setting and
TRITON_INTERPRET, the sources of brrr itself, torch's and Triton's versions and the device's name. A graph of
symbolic sizes is not kept (its plan adds guards to Dynamo's shape environment, which a hit would not), nor is
one whose constants are not tensors of the graph or whose call holds a value this file cannot name again.

Measured choices live in their own caches and are read again on a hit: the floor's verdicts (floor.py, by the
kernels' sources), the launch-or-replay trial (run again: it times this process's host), the matmul and
convolution timings (cached by shape, before planning, so baked into the kept call).

Safety, as the kernel cache's: an entry is one JSON file written atomically (cache.write_atomic), carrying a
digest of its own content; one that is missing, truncated, corrupt or of another format is a miss and is
written again; two processes writing one key leave one whole entry; a compile interrupted before its entry is
written leaves none. A kept graph whose first call fails is forgotten (`forget`). BRRR_GRAPH_CACHE=0 turns the
cache off.
"""

import base64
import functools
import hashlib
import importlib
import json
import os
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from brrr.compile.cache import folder, write_atomic
from brrr.compile.runtime import floor, kernel_registry
from brrr.compile.runtime.compiled import KernelSpec, assemble

FORMAT = 4
MAX_CONSTANT_BYTES = 16 << 20   # constants hashed into the key; a graph reading a larger one is not kept
STATS = {"hits": 0, "misses": 0, "stored": 0, "planned": 0, "refused": 0}
_IGNORED_SETTINGS = {"BRRR_CACHE_DIR", "BRRR_DUMP_DIR", "BRRR_GRAPH_CACHE"}


class Unkept(Exception):
    """This graph, or what its call holds, cannot be named in an entry: it is compiled every time."""


def enabled():
    return os.environ.get("BRRR_GRAPH_CACHE") != "0"


@functools.lru_cache(maxsize=1)
def brrr_digest():
    """sha256 of brrr's own sources: any change to the compiler makes every entry miss."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _device_name(gm):
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return torch.cuda.get_device_name(val.device)
    return "cpu"


def _value_meta(val):
    if isinstance(val, torch.Tensor):
        return f"T{tuple(val.shape)}{val.stride()}{val.storage_offset()}{val.dtype}{val.device}{val.requires_grad}"
    if isinstance(val, (tuple, list)):
        return "(" + ",".join(_value_meta(v) for v in val) + ")"
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Unkept("symbolic sizes")
    return type(val).__name__ if val is not None else "-"


def _symbolic(val):
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(val, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride()))
    if isinstance(val, (tuple, list)):
        return any(_symbolic(v) for v in val)
    return False


def key(gm, kind, forced=(), split=(), options=None, extra=(), wider=()):
    """The entry's name for `gm` planned as `kind` with the FX nodes `forced` to ATen, the plan `split` at
    `split` and the reductions of `wider` split wider, or None when it is not kept (symbolic sizes, constants
    this cache cannot key). `extra`: more of what the entry depends on, as text (aot_cache.py: the caller's grad
    and autocast state)."""
    import triton

    try:
        h = hashlib.sha256()

        def part(text):
            h.update(str(text).encode())
            h.update(b"\0")

        for p in (FORMAT, brrr_digest(), torch.__version__, triton.__version__, _device_name(gm), kind,
                  sorted((k, v) for k, v in os.environ.items()
                         if k.startswith("BRRR_") and k not in _IGNORED_SETTINGS),
                  os.environ.get("TRITON_INTERPRET", ""), sorted((options or {}).items()),
                  # fp32 matmuls as TF32 or IEEE: the padding decisions and the matmul templates follow it
                  torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
                  sorted(n.name for n in forced), sorted(n.name for n in split), sorted(n.name for n in wider),
                  list(extra), gm.code):
            part(p)
        for node in gm.graph.nodes:
            val = node.meta.get("val", node.meta.get("example_value"))
            if _symbolic(val):
                raise Unkept("symbolic sizes")
            part(f"{node.name}:{_value_meta(val)}")
            if node.op == "get_attr":
                part(_constant_digest(getattr(gm, node.target, None)))
        return h.hexdigest()[:40]
    except Unkept:
        STATS["refused"] += 1
        return None


def _constant_digest(value):
    if not isinstance(value, torch.Tensor):
        raise Unkept(f"a constant of type {type(value).__name__}")
    nbytes = value.numel() * value.element_size()
    if nbytes > MAX_CONSTANT_BYTES:
        raise Unkept("a constant too large to key")
    with unset_fake_temporarily():   # the compiler runs under AOTAutograd's fake mode; constants are real
        data = value.detach().cpu().contiguous().reshape(-1)
        raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
    return _value_meta(value) + hashlib.sha256(raw).hexdigest()


def _path(k):
    return os.path.join(folder("graphs"), f"{k}.json")


# ------------------------------------------------------------------------------------------- values, named

def _resolve_op(name):
    """`aten::add.Tensor` -> torch.ops.aten.add.Tensor."""
    ns, rest = name.split("::", 1)
    op, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), op)
    return getattr(packet, overload or "default")


def encode(value, gm):
    """A JSON name for `value`, a constant of a generated call, that `decode` turns back into it."""
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch._ops.OpOverload):
        return {"op": value.name()}
    if isinstance(value, torch.Tensor):
        for node in gm.graph.nodes:
            if node.op == "get_attr" and getattr(gm, node.target, None) is value:
                return {"attr": node.target}
        raise Unkept("a tensor the graph does not hold")
    for node in gm.graph.nodes:   # an OpOverload's C++ entry point: the generated call skips its Python frame
        target = node.target if node.op == "call_function" else None
        if isinstance(target, torch._ops.OpOverload) and getattr(target, "_op", None) is value:
            return {"op": target.name(), "entry": True}
    name = str(value).removeprefix("torch.")
    if getattr(torch, name, None) is value and not callable(value):   # memory formats, layouts
        return {"torch": name}
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qualname and _lookup(module, qualname) is value:
        return {"py": module, "name": qualname}
    raise Unkept(f"a constant {type(value).__name__} with no name")


def _lookup(module, qualname):
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError):
        return None


def decode(named, gm):
    if "dtype" in named:
        return getattr(torch, named["dtype"])
    if "device" in named:
        return torch.device(named["device"])
    if "op" in named:
        op = _resolve_op(named["op"])
        return op._op if named.get("entry") else op
    if "attr" in named:
        value = getattr(gm, named["attr"], None)
        if not isinstance(value, torch.Tensor):
            raise Unkept(f"constant {named['attr']} missing")
        return value
    if "torch" in named:
        return getattr(torch, named["torch"])
    value = _lookup(named["py"], named["name"])
    if value is None:
        raise Unkept(f"{named['py']}.{named['name']} not found")
    return value


# ------------------------------------------------------------------------------------------------ entries

def store(k, compiled, gm):
    """Write `compiled` (fresh from compiled.build) under key `k`; a graph holding what cannot be named is
    not kept."""
    constants, specs = compiled.recipe
    try:
        payload = {
            "format": FORMAT, "kind": compiled.kind, "source": compiled.source,
            "constants": {name: encode(v, gm) for name, v in constants.items()},
            "kernels": [{"name": s.name, "function": s.function, "source": s.source, "grid": list(s.grid),
                         "meta": s.meta, "fx_nodes": [n.name for n in s.fx_nodes], "fresh_slots": list(s.fresh_slots),
                         "symbols": s.symbols,
                         "binary": None if s.binary is None else base64.b64encode(s.binary).decode(),
                         "warm_dtypes": None if s.warm_dtypes is None else [str(d).removeprefix("torch.")
                                                                            for d in s.warm_dtypes]}
                        for s in specs],
            "choices": [{"name": c.name, "digest": c.digest, "flops": c.flops, "bytes": c.bytes,
                         "fx_nodes": [n.name for n in c.fx_nodes], "split_at": [n.name for n in c.split_at],
                         "reductions": [n.name for n in c.reductions]}
                        for c in compiled.kernel_choices],
            "registry": {s.function: _registry_entry(s.function) for s in specs},
            "fallbacks": [list(f) for f in getattr(compiled, "op_fallbacks", ())],
        }
        body = json.dumps(payload, sort_keys=True)
    except (Unkept, TypeError, ValueError):
        STATS["refused"] += 1
        return False
    write_atomic(_path(k), json.dumps({"digest": hashlib.sha256(body.encode()).hexdigest(), "entry": body}))
    STATS["stored"] += 1
    return True


def _registry_entry(name):
    meta = kernel_registry.lookup(name)
    if meta is None:
        return None
    return {"flops": meta.flops, "bytes_read": meta.bytes_read, "bytes_written": meta.bytes_written,
            "op_class": meta.op_class, "dtype": None if meta.dtype is None else str(meta.dtype).removeprefix("torch."),
            "ops": list(meta.ops), "modules": [list(m) for m in meta.modules], "graph": meta.graph}


def read_entry(path):
    """The entry in file `path`, or None where it is missing, damaged or of another format."""
    try:
        with open(path, encoding="utf-8") as f:
            outer = json.load(f)
        body = outer["entry"]
        if hashlib.sha256(body.encode()).hexdigest() != outer["digest"]:
            return None
        payload = json.loads(body)
        return payload if payload.get("format") == FORMAT else None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None   # missing, truncated, corrupt: compiled and written again


def forget(k):
    try:
        os.unlink(_path(k))
    except OSError:
        pass


def _device_index(gm):
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return val.device.index if val.device.index is not None else torch.cuda.current_device()
    return None


def load(k, gm, cuda_graphs):
    """The CompiledGraph kept under `k`, assembled on `gm` (the graph it was planned from), or None (a miss)."""
    payload = read_entry(_path(k))
    if payload is None:
        STATS["misses"] += 1
        return None
    try:
        nodes = {n.name: n for n in gm.graph.nodes}
        constants = {name: decode(v, gm) for name, v in payload["constants"].items()}
        source, specs, functions = payload["source"], [], {}
        for spec in payload["kernels"]:
            function, text = spec["function"], spec["source"]
            if function not in functions:
                functions[function] = kernel_registry.claim(function, text)
            claimed, text = functions[function]
            binary = None if spec["binary"] is None else base64.b64decode(spec["binary"])
            if claimed != function:   # another live graph holds the name for other code
                binary = None   # compiled under the old name, which profiles would show: compiled again
            specs.append(KernelSpec(spec["name"], text, tuple(spec["grid"]), spec["meta"],
                                    tuple(nodes[n] for n in spec["fx_nodes"]), tuple(spec["fresh_slots"]),
                                    spec["symbols"], None if spec["warm_dtypes"] is None else
                                    tuple(getattr(torch, d) for d in spec["warm_dtypes"]), binary, claimed))
        choices = [floor.KernelChoice(c["name"], c["digest"], c["flops"], c["bytes"],
                                      tuple(nodes[n] for n in c["fx_nodes"]), tuple(nodes[n] for n in c["split_at"]),
                                      tuple(nodes[n] for n in c["reductions"]))
                   for c in payload["choices"]]
    except (Unkept, KeyError, AttributeError, RuntimeError, TypeError, ValueError):
        STATS["misses"] += 1
        return None
    compiled = assemble(source, constants, specs, gm, cuda_graphs, payload["kind"], _device_name(gm),
                        _device_index(gm))
    compiled.kernel_choices = choices
    compiled.op_fallbacks = [tuple(f) for f in payload["fallbacks"]]
    for function, (claimed, text) in functions.items():
        meta = payload["registry"].get(function)
        if meta is not None:
            kernel_registry.register(kernel_registry.KernelMeta(
                meta["flops"], meta["bytes_read"], meta["bytes_written"], meta["op_class"],
                None if meta["dtype"] is None else getattr(torch, meta["dtype"]), tuple(meta["ops"]),
                tuple(tuple(m) for m in meta["modules"]), name=claimed, graph=meta["graph"]), text, gm)
    STATS["hits"] += 1
    return compiled
