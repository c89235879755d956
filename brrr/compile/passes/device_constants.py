"""Host constants copied to the device, moved there once (backend -> **passes** -> lowering).

`x + torch.tensor([1., 2.]).to(x.device)` traces to a CPU constant (a get_attr, often behind `lift_fresh_copy`)
and a `_to_copy` to the device that every call would run: a copy from pageable host memory, which a CUDA
graph's capture refuses. `move_host_constants(gm)` computes each such copy once, here, and makes it a constant
on the device (in gm itself, so the graph's ATen fallback runs without the copy too). Only chains of
deterministic host ops over constants are computed; anything reading an input stays (runtime/host_copies.py
stages those).
"""

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily


def _on_host(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.device.type == "cpu"


def _copied_to_device(node):
    """The host tensor a `_to_copy` to another device copies, or one `copy` writes whole into a device tensor
    (what `device_tensor.copy_(host)` functionalizes to: its value does not depend on the destination's), else
    None."""
    if node.op != "call_function" or _on_host(node):
        return None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
        return None
    if node.target is torch.ops.aten._to_copy.default and node.args:
        src = node.args[0]
    elif node.target is torch.ops.aten.copy.default and len(node.args) >= 2:
        src = node.args[1]
    else:
        return None
    return src if _on_host(src) else None


def _device_value(node, host):
    """What `node` (a copy of a host tensor to the device) computes, from the host tensor's value."""
    val = node.meta["val"]
    if node.target is torch.ops.aten.copy.default:
        return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device).copy_(host)
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device).copy_(
        host.to(val.dtype))


def _host_constant(node, known):
    """Whether `node` is a host tensor computed from constants alone (memoized in `known`)."""
    if node in known:
        return known[node]
    ok = _on_host(node)
    if ok and node.op == "call_function":
        tags = getattr(node.target, "tags", ())
        ok = isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded not in tags \
            and all(_host_constant(a, known) for a in node.all_input_nodes)
    elif ok:
        ok = node.op == "get_attr"
    known[node] = ok
    return ok


def _evaluate(gm, node, values):
    if node not in values:
        if node.op == "get_attr":
            values[node] = getattr(gm, node.target)
        else:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _evaluate(gm, n, values))
            values[node] = node.target(*args, **kwargs)
    return values[node]


def move_host_constants(gm):
    """Rewrite gm's copies of host constants to the device into constants on the device; the number moved."""
    known, values, moved = {}, {}, 0
    for node in list(gm.graph.nodes):
        src = _copied_to_device(node)
        if src is None or not _host_constant(src, known):
            continue
        # planning runs inside AOTAutograd's fake mode: the constant must be a real tensor
        with unset_fake_temporarily():
            on_device = _device_value(node, _evaluate(gm, src, values))
        name = f"_brrr_device_constant_{moved}"
        while hasattr(gm, name):
            name += "_"
        setattr(gm, name, on_device)
        with gm.graph.inserting_before(node):
            constant = gm.graph.create_node("get_attr", name)   # a plain attribute, as traced constants are
        constant.meta.update(node.meta)
        node.replace_all_uses_with(constant)
        gm.graph.erase_node(node)
        moved += 1
    if moved:
        for node in reversed(list(gm.graph.nodes)):   # the host chains nothing reads any more
            if known.get(node) and not node.users:
                gm.graph.erase_node(node)
        gm.recompile()
    return moved
