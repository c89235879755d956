"""Host tensors in a generated call that a CUDA graph must keep out of its capture (codegen -> **runtime**).

A CUDA graph cannot hold a copy from pageable host memory (the capture fails: "Cannot copy between CPU and CUDA
tensors during CUDA graph capture"), and any other work on host tensors runs once, at capture, and never on a
replay. `host_copies(gm)` reads the FX graph a call was generated from (the call keeps its ATen ops, and every
copy across devices is one of them: lowering leaves such copies to ATen):
- `staged`: the positions of inputs on the host that the graph only copies to its device (a CPU tensor argument
  moved with `.to(x.device)` inside forward), through host-side views and copies at most. GraphedCall copies
  each into device memory of its own before every replay, outside the capture, so the captured copy reads
  device memory (cuda_graphs.py).
- `blocker`: why the call cannot be captured at all, or None. An input on the host that anything but a copy to
  the device reads (an op would see the value it had at capture on every replay), an input on the host the
  graph returns, a host tensor an op on the device reads whole (it copies it over inside), a device tensor
  brought back to the host, an ATen op that moves host data to the device by itself (ctc_loss copies its
  lengths) or waits for the device (nonzero), or memory-efficient attention with dropout: it returns its RNG
  seed and offset on the host when launched but on the device when captured, and its backward, launched, reads
  them on the host (a forward replayed beside a launched backward crashed wav2vec2's fp32 training).
  Such a graph launches its kernels, with the reason logged (replay_choice.Decision).
Host constants copied to the device are moved once when the graph is planned (passes/device_constants.py); one
left in the graph is a blocker.
"""

from dataclasses import dataclass

import torch

# ops that copy host data to the device, or read device data back, inside their own implementation: neither
# can be captured, whatever their arguments
_UNCAPTURABLE = {
    "_ctc_loss": "copies its lengths to the device", "_ctc_loss_backward": "copies its lengths to the device",
    "ctc_loss": "copies its lengths to the device", "_cudnn_ctc_loss": "reads its lengths on the host",
    "nonzero": "waits for the device to size its output", "masked_select": "waits for the device to size its output",
    "_unique2": "waits for the device to size its output", "unique_dim": "waits for the device to size its output",
    "unique_consecutive": "waits for the device to size its output", "bincount": "waits for the device",
    "_local_scalar_dense": "reads a device value on the host (.item())",
}


# ops whose RNG state (seed, offset) is a host tensor when launched and a device tensor when captured, where
# dropout is on (the position of dropout_p among their arguments): a launched backward dereferences it on the host
_RNG_STATE_BY_CAPTURE = {"_scaled_dot_product_efficient_attention": 5, "_efficient_attention_forward": 8}


DROPOUT_RNG = "with dropout keeps its RNG state on the host only when launched (its backward reads it there)"


def dropout_on(name, args, kwargs):
    """Whether a call of the ATen op `name` (its short name) runs attention dropout whose RNG state a capture moves
    to the device: `args` and `kwargs` as the call has them (kwargs a dict)."""
    position = _RNG_STATE_BY_CAPTURE.get(name)
    if position is None:
        return False
    p = kwargs.get("dropout_p", args[position] if len(args) > position else 0.0)
    return not isinstance(p, (int, float)) or p != 0


def _short(op):
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else op


def uncapturable(op):
    """Why the ATen op named `op` ("nonzero", or "aten.nonzero.default") cannot be captured in a CUDA graph,
    whatever its arguments, or None (brrr.analyze predicts which graphs will launch from the ops it traced)."""
    return _UNCAPTURABLE.get(_short(op))


def uncapturable_call(op, args, kwargs):
    """Why this call of the ATen op named `op` cannot be captured (uncapturable, or attention with dropout), or
    None."""
    return uncapturable(op) or (DROPOUT_RNG if dropout_on(_short(op), args, kwargs) else None)


# ops that pass a host tensor on as a host tensor: what they make is still only the input, moved or viewed
_PASSING = {"alias", "clone", "lift_fresh_copy", "contiguous", "_to_copy", "detach"}
_METADATA = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset"}


@dataclass(frozen=True)
class HostCopies:
    device: torch.device | None   # the graph's device
    staged: tuple = ()            # input positions copied to the device before each replay
    blocker: str | None = None    # why the graph cannot be captured


def op_name(target):
    return getattr(getattr(target, "_schema", None), "name", str(target)).split("::")[-1]


def _val(node):
    val = node.meta.get("val", node.meta.get("example_value")) if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _on_host(node):
    val = _val(node)
    return val is not None and val.device.type == "cpu"


def graph_device(gm):
    """The graph's accelerator device (the first non-CPU tensor's), or None for a graph on the host alone."""
    for node in gm.graph.nodes:
        val = _val(node)
        if val is not None and val.device.type not in ("cpu", "meta"):
            return val.device
    return None


def is_device_copy(node):
    """A copy of a host tensor to another device: (the host tensor, the copy), else None."""
    if node.op != "call_function" or _on_host(node):
        return None
    name = op_name(node.target)
    src = node.args[0] if name == "_to_copy" else node.args[1] if name == "copy" and len(node.args) > 1 else None
    return src if isinstance(src, torch.fx.Node) and _on_host(src) else None


def _passes_on(node):
    """A host op whose result is its (host) input moved, copied or viewed."""
    if node.op != "call_function" or not _on_host(node):
        return False
    return op_name(node.target) in _PASSING or getattr(node.target, "is_view", False)


def host_copies(gm):
    """HostCopies for the call generated from `gm` (module docstring)."""
    device = graph_device(gm)
    if device is None:
        return HostCopies(None)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    blockers, staged = [], []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = op_name(node.target)
        if name in _UNCAPTURABLE:
            blockers.append(f"aten.{name} {_UNCAPTURABLE[name]}")
        elif dropout_on(name, node.args, node.kwargs):
            blockers.append(f"aten.{name} {DROPOUT_RNG}")
    for position, node in enumerate(placeholders):
        if not _on_host(node):
            continue
        why = _host_input_use(node)
        if why is None:
            staged.append(position)
        else:
            blockers.append(f"host input {node.name} {why}")
    for node in gm.graph.nodes:   # host tensors other than inputs (constants, host-side results) read on the device
        if node.op != "call_function" or is_device_copy(node) is not None:
            continue
        if _on_host(node):
            on_device = [a.name for a in node.all_input_nodes
                         if _val(a) is not None and _val(a).device.type not in ("cpu", "meta")]
            if on_device:   # a copy back to the host waits for the device
                blockers.append(f"aten.{op_name(node.target)} brings {on_device[0]} back to the host")
            continue
        for arg in node.all_input_nodes:
            val = _val(arg)
            if _on_host(arg) and val.dim() > 0 and not _from_input(arg):
                blockers.append(f"aten.{op_name(node.target)} reads host tensor {arg.name} on {device}")
    for node in gm.graph.nodes:
        src = is_device_copy(node)
        if src is not None and not _from_input(src):
            blockers.append(f"{node.name} copies host tensor {src.name} to {device} on every call")
    blocker = "; ".join(dict.fromkeys(blockers)) or None
    return HostCopies(device, tuple(staged), f"cannot capture: {blocker}" if blocker else None)


def _from_input(node):
    """Whether a host value is an input, or passed on from one."""
    while node.op == "call_function" and _passes_on(node) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node.op == "placeholder"


def _host_input_use(node):
    """None where every use of host value `node` copies it to the device (through host-side views and copies);
    else what else reads it."""
    for user in node.users:
        if user.op == "output":
            return "is returned"
        if user.op == "call_function" and op_name(user.target) in _METADATA:
            continue
        if is_device_copy(user) is node:
            continue
        if _passes_on(user) and user.args and user.args[0] is node:
            why = _host_input_use(user)
            if why is not None:
                return why
            continue
        return f"is read by aten.{op_name(user.target)}, which would see its value at capture on every replay"
    return None
