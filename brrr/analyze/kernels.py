"""Kernels compiled code launched outside every ATen op, as OpRecords (capture -> timing -> **kernels** -> regimes).

timing.py finds them: on CUDA a kernel launched inside the traced step but outside every op range; on CPU an
interpreted brrr kernel's launch range (kernel_registry.LAUNCH_HOOK, opened only while the step is traced). Here
each becomes a record, priced where its compiler says what it is:

- a brrr kernel: its name is unique in the process and brrr.compile.runtime.kernel_registry holds its FLOPs, bytes read
  and written, ATen ops and modules from its plan (pricing.py). Its module is the one doing most of its FLOPs,
  resolved to the analyzer's own names (the module object Dynamo keyed it by, else Dynamo's source path); its phase
  is its graph's.
- an Inductor kernel (`triton_poi_fused_add_relu_0`): the fused ops come from its name; FLOPs and bytes from the
  metadata Inductor keeps on its kernels (`kernel_flop`, `kernel_num_gb`), which it computes only when compiled
  with `torch._inductor.config.benchmark_kernel` (or `profile_bandwidth`, bytes only). Inductor counts one byte
  total: it lands in bytes_read.
- anything else: FLOPs and bytes unknown (0), module and phase of the op that ran before its launch, placed on
  duration alone (regimes.compiled_kernel_regime).
"""

import functools
import re
import sys

from brrr.analyze.capture import OUTSIDE_MODEL, OpRecord

INDUCTOR_NAME = re.compile(r"^triton_(poi|red|per|tem|for|mm|bmm|spl|cat)_(?:fused_)?(.*?)(?:_\d+)?$")
INDUCTOR_CLASSES = {"poi": "elementwise", "red": "normalization", "per": "normalization", "tem": "contraction",
                    "mm": "contraction", "bmm": "contraction"}


def module_names(model):
    """{id(module): the analyzer's name for it}, as capture.ModuleStack names modules, and the root's name."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return {}, OUTSIDE_MODEL["forward"]
    root = getattr(model, "_orig_mod", model)   # torch.compile's OptimizedModule
    names = {id(m): name for name, m in root.named_modules()}
    names[id(root)] = names[id(model)] = type(root).__name__
    return names, type(root).__name__


def _path_name(path, root):
    """The analyzer's name for a Dynamo source path: `L['self'].encoder.layer[0].output` -> `encoder.layer.0.output`."""
    path = re.sub(r"getattr\((.*?), '([^']+)'\)", r"\1.\2", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"^L\['self'\](\._orig_mod)?", "", path)
    path = re.sub(r"^L\['([^']+)'\]", r"\1", path).lstrip(".")
    return path or root


def resolve_module(module, names, root):
    """The analyzer's name of a kernel's module, (Dynamo's nn_module_stack key, source path): the module object
    the key names (Dynamo keys an entry by id(module), `@<n>` for its n-th call), else the path, rewritten."""
    key, path = module
    ident = key.split("@")[0]
    if ident.isdigit() and int(ident) in names:
        return names[int(ident)]
    return _path_name(path, root)


@functools.cache
def _aten_op(name):
    import torch

    try:
        return isinstance(getattr(torch.ops.aten, name), torch._ops.OpOverloadPacket)
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def inductor_ops(fused):
    """ATen op names in an Inductor kernel's fused part (`add_native_layer_norm` -> add, native_layer_norm):
    the longest known op name at each position; unknown words are skipped."""
    words, ops, i = fused.split("_"), [], 0
    while i < len(words):
        for j in range(len(words), i, -1):
            candidate = "_".join(words[i:j])
            if candidate and _aten_op(candidate):
                ops.append(f"aten.{candidate}")
                i = j
                break
        else:
            i += 1
    return tuple(dict.fromkeys(ops))


def inductor_metadata():
    """{kernel name: (flops or None, bytes or None)} from the Inductor kernels loaded in this process, where Inductor
    computed them (benchmark_kernel / profile_bandwidth); a name two kernels share with other numbers is left out."""
    codecache = sys.modules.get("torch._inductor.codecache")
    cache = getattr(codecache, "PyCodeCache", None)
    found, clashes = {}, set()
    modules = list(getattr(cache, "modules", []) or []) + list((getattr(cache, "modules_no_attr", {}) or {}).values())
    for module in modules:
        for name, kernel in list(vars(module).items()):
            meta = getattr(kernel, "inductor_meta", None)
            if not name.startswith("triton_") or not isinstance(meta, dict):
                continue
            flops, gb = meta.get("kernel_flop"), meta.get("kernel_num_gb")
            if flops is None and gb is None:
                continue
            numbers = (flops, int(gb * 1e9) if gb is not None else None)
            if found.setdefault(name, numbers) != numbers:
                clashes.add(name)
    return {name: numbers for name, numbers in found.items() if name not in clashes}


def kernel_records(outside, records, model=None):
    """OpRecords for `outside` ([(kernel name, seconds, index of the op before its launch or -1)]), numbered after
    `records`."""
    from brrr.compile.runtime import kernel_registry

    names, root = module_names(model)
    inductor = None
    out = []
    for name, seconds, before in outside:
        near = records[before] if 0 <= before < len(records) else None
        record = OpRecord(
            index=len(records) + len(out), name=name, module=near.module if near else OUTSIDE_MODEL["forward"],
            phase=near.phase if near else "forward", op_class="other", flops=0, bytes_read=0, bytes_written=0,
            dtype=None, time_s=seconds, kernel=True)
        meta = kernel_registry.lookup(name)
        if meta is not None:
            record.flops, record.bytes_read, record.bytes_written = meta.flops, meta.bytes_read, meta.bytes_written
            record.op_class, record.dtype, record.fused_ops = meta.op_class, meta.dtype, meta.ops
            record.modules = tuple(dict.fromkeys(resolve_module(m, names, root) for m in meta.modules))
            # a function several launches share (a repeated layer's kernel) lists every layer: this launch's is
            # the one of the op launched before it, where that is one of them
            record.module = near.module if near is not None and near.module in record.modules[1:] else \
                record.modules[0] if record.modules else root
            record.phase = "backward" if meta.graph == "backward" else "forward"
        else:
            match = INDUCTOR_NAME.match(name)
            if match is not None:
                record.fused_ops = inductor_ops(match.group(2))
                record.op_class = INDUCTOR_CLASSES.get(match.group(1), "other")
                if inductor is None:
                    inductor = inductor_metadata()
                flops, nbytes = inductor.get(name, (None, None))
                record.flops, record.bytes_read = flops or 0, nbytes or 0
        out.append(record)
    return out
