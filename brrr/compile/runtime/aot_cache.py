"""AOTAutograd's product for a Dynamo graph, kept on disk (capture -> **runtime**): a second compile of a plain
graph skips AOTAutograd's tracing and partition as well as brrr's planning.

A warm start of BERT MLM training spent 4.7 of its 10.9 s in AOTAutograd (benchmarks/NOTES.md, "What does the
graph cache leave of a warm start?"), and torch's own AOTAutograd cache keeps only Inductor's compiled graphs. Where
brrr runs a graph with its lean runtime (lean_autograd.py: AOTAutograd's metadata says the graph is plain),
everything that runtime reads is kept: the forward (or inference) and backward graphs AOTAutograd made, with their
node metadata (torch's GraphPickler, fake tensors and all; not the user-code stack traces, which no stage of brrr
reads after AOTAutograd), the positions of the static inputs and the LeanSpec. A plain fake tensor is written as
its layout and a storage number (`_pickler`), and an entry is read with the garbage collector paused: together they
cut loading a 12-layer BERT's graphs from 0.76 to 0.27 s on the CPU.
A hit compiles each graph through `compile_graph` (the graph cache then serves its plan) and wraps them in the
lean runtime; a graph needing AOTAutograd's runtime is never kept here.

The key (`key`): Dynamo's graph after the Dynamo-graph passes (its code, every node's value metadata, its
constants' values), each example input's type, sizes, strides, dtype, device and requires_grad, the caller's grad
mode and autocast state, brrr's options and the rest of what a graph cache key holds (graph_cache.key). An entry is
one file, a digest of its content ahead of it, written atomically; one that is damaged, of another format or that
this torch cannot unpickle is a miss. BRRR_GRAPH_CACHE=0 turns this cache off with the graph cache.
"""

import functools
import gc
import hashlib
import os
import pickle

import torch
from torch._subclasses.fake_tensor import FakeTensor

from brrr.compile.cache import folder, write_atomic
from brrr.compile.runtime import graph_cache
from brrr.compile.runtime.lean_autograd import LeanSpec

FORMAT = 2
STATS = {"hits": 0, "misses": 0, "stored": 0, "refused": 0}
# user-code provenance, for torch's logs (source_fn_stack may hold a local function: F.max_pool2d's dispatcher);
# tensor_meta, what the partitioner read of "val" before it: 40% of unpickling a BERT's graphs on the CPU
UNREAD_META = ("stack_trace", "from_node", "output_stack_traces", "source_fn_stack", "fwd_source_fn_stack",
               "tensor_meta")


def _caller_state(example_inputs):
    """What AOTAutograd's product depends on besides the graph: grad mode, autocast, and the inputs."""
    state = [f"grad={torch.is_grad_enabled()}"]
    for device in ("cuda", "cpu"):
        try:
            state.append(f"autocast {device}={torch.is_autocast_enabled(device)} {torch.get_autocast_dtype(device)}")
        except (AttributeError, RuntimeError, TypeError):
            state.append(f"autocast {device}=?")
    for x in example_inputs:
        state.append(f"{type(x).__name__}:{graph_cache._value_meta(x) if isinstance(x, torch.Tensor) else x!r}")
    return state


def key(gm, example_inputs, options):
    """The entry's name for Dynamo's graph `gm` called with `example_inputs`, or None where it is not kept."""
    try:
        state = _caller_state(example_inputs)
    except graph_cache.Unkept:
        STATS["refused"] += 1
        return None
    return graph_cache.key(gm, "dynamo", options=options, extra=state)


def _path(k):
    return os.path.join(folder("aot"), f"{k}.pkl")


def _plain(t):
    """A fake tensor that its storage, sizes, strides, offset, dtype, device and requires_grad describe whole."""
    return (type(t) is FakeTensor and t.layout == torch.strided and not t._is_view() and
            (t.is_leaf or not t.requires_grad) and not t.is_quantized and not t.is_nested and
            not any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride(), t.storage_offset())))


def _light_fake(state, shape, stride, offset, dtype, device, requires_grad, storage, nbytes):
    """A fake tensor `_LightPickler` wrote; tensors that shared a storage share one again."""
    from torch.utils._mode_utils import no_dispatch

    storages = state.__dict__.setdefault("brrr_storages", {})
    with no_dispatch():
        if storage not in storages:
            storages[storage] = torch.empty(nbytes, dtype=torch.uint8, device="meta").untyped_storage()
        meta = torch.empty(0, dtype=dtype, device="meta").set_(storages[storage], offset, shape, stride)
        if requires_grad:
            meta.requires_grad_(True)
        return FakeTensor(state.fake_mode, meta, torch.device(device))


@functools.lru_cache(maxsize=1)
def _pickler():
    """torch's GraphPickler, with plain fake tensors written as their metadata alone: rebuilding each through
    torch's MetaConverter was half of loading a BERT's graphs (2539 tensors, 0.49 of 1.09 s on the CPU)."""
    from torch.fx._graph_pickler import GraphPickler, Options

    class _LightPickler(GraphPickler):
        def reducer_override(self, obj):
            if isinstance(obj, FakeTensor) and _plain(obj):
                storages, storage = self.__dict__.setdefault("brrr_storages", {}), obj.untyped_storage()
                sid = storages.setdefault(storage._cdata, len(storages))
                return _light_fake, (self._unpickle_state, tuple(obj.shape), obj.stride(), obj.storage_offset(),
                                     obj.dtype, str(obj.device), obj.requires_grad, sid, storage.nbytes())
            return super().reducer_override(obj)

    return _LightPickler, Options(ops_filter=None)   # brrr's own ops (the fused loss) are kept too


def _unviewed(val):
    """`val` with each fake view replaced by a tensor of its own over the same fake storage, sizes, strides and
    offset: GraphPickler cannot write a view of a fake tensor (the description of its base keeps the fake mode).
    A pass that re-propagates fake tensors through the graph (layouts.py) leaves such views in node metadata."""
    if isinstance(val, (tuple, list)):
        return type(val)(_unviewed(v) for v in val)
    if not isinstance(val, FakeTensor) or not val._is_view():
        return val
    with val.fake_mode:
        return torch.empty(0, dtype=val.dtype, device=val.device).set_(
            val.untyped_storage(), val.storage_offset(), val.shape, val.stride())


def store(k, spec, graphs, statics):
    """Keep `graphs` (kind -> GraphModule AOTAutograd made), `spec` and `statics` under `k`."""
    # what no stage of brrr reads after AOTAutograd (half an entry's bytes, BERT-base) is left out of the entry, and
    # fake views are written as tensors of their own; every node's metadata is put back as it was afterwards
    left_out = []
    for n in (n for g in graphs.values() for n in g.graph.nodes):
        left_out += [(n.meta, key, n.meta.pop(key)) for key in UNREAD_META if key in n.meta]
        val = n.meta.get("val")
        unviewed = _unviewed(val)
        if unviewed is not val:
            left_out.append((n.meta, "val", val))
            n.meta["val"] = unviewed
    try:
        pickler, options = _pickler()
        body = pickler.dumps({"format": FORMAT, "spec": spec, "graphs": graphs, "statics": statics}, options)
    except Exception:   # a graph holding what GraphPickler cannot write: compiled in full every time
        STATS["refused"] += 1
        return False
    finally:
        for meta, key, value in left_out:
            meta[key] = value
    write_atomic(_path(k), hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    STATS["stored"] += 1
    return True


def load(k, fake_mode):
    """(spec, graphs, statics) kept under `k`, their fake tensors in `fake_mode`, or None (a miss)."""
    try:
        with open(_path(k), "rb") as f:
            data = f.read()
        digest, _, body = data.partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            raise ValueError("damaged")
        pickler, _ = _pickler()
        collecting = gc.isenabled()
        gc.disable()   # unpickling makes ~10^5 objects that all live on: collections found nothing (BERT: 0.2 s)
        try:
            entry = pickler.loads(body, fake_mode)
        finally:
            if collecting:
                gc.enable()
        if entry.get("format") != FORMAT or not isinstance(entry.get("spec"), LeanSpec):
            raise ValueError("another format")
        for gm in entry["graphs"].values():
            gm.recompile()
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, ImportError, pickle.UnpicklingError,
            RuntimeError):
        STATS["misses"] += 1
        return None
    STATS["hits"] += 1
    return entry["spec"], entry["graphs"], entry["statics"]


def forget(k):
    try:
        os.unlink(_path(k))
    except OSError:
        pass
