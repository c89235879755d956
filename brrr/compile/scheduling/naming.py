"""Kernel names after what they fuse (schedule's helper; lower -> **schedule** -> codegen -> runtime).

A kernel is named `brrr_<op>_<op>_<n>`: its dominant ops (what it reduces, then the ops it fuses), then its
index in the graph, so names are unique within a graph and read well in a profile, in `explain` and in
`brrr analyze` (`brrr_bn_relu_3`, `brrr_layer_norm_add_7`, `brrr_max_pool2d_bn_add_relu_4`). An op a
decomposition produced counts as the op it came from (the FX node's `original_aten`: the sub, mul and rsqrt of
a batch norm read `bn`); views, copies and constants name a kernel only when it holds nothing else.

The Triton function a kernel launches is named after its source instead of its index (`function_name`:
`brrr_bn_relu_1f3a9c07`): a kernel of the same source elsewhere in the graph (a repeated layer), in another
form of it (the floor's alternatives re-plan the graph and shift every index) or in another graph is then the
same function, compiled once. The index names the launch in the generated call and the floor's verdicts;
`explain`, profiles and `brrr analyze` show the function.
"""

import re

MAX_PARTS = 4
ALIASES = {"batch_norm": "bn", "threshold_backward": "relu_backward", "batch_norm_backward": "bn_backward",
           "max_pool2d_with_indices": "max_pool2d", "max_pool2d_with_indices_backward": "max_pool2d_backward"}
MOVES_DATA = {"view", "_unsafe_view", "reshape", "permute", "expand", "unsqueeze", "squeeze", "alias", "t",
              "transpose", "slice", "select", "as_strided", "broadcast_in_dim", "clone", "_to_copy", "copy",
              "convert_element_type", "detach", "lift_fresh", "lift_fresh_copy", "contiguous", "getitem",
              "split", "split_with_sizes", "unbind", "cat", "constant_pad_nd", "view_as", "clone_view"}
CONSTANTS = {"full", "full_like", "zeros", "ones", "zeros_like", "ones_like", "scalar_tensor", "empty", "empty_like",
             "new_zeros", "new_ones", "new_full", "new_empty", "empty_strided", "fill", "arange"}


def short(op):
    """`_native_batch_norm_legit_no_training` -> `bn`, `native_layer_norm` -> `layer_norm`, `_softmax` -> `softmax`."""
    name = op.split(".")[0].lstrip("_")
    name = re.sub(r"^native_", "", name)
    name = re.sub(r"(_legit_no_training|_legit_functional|_legit|_forward|_data|_default)$", "", name)
    name = re.sub(r"_legit(_no_training|_functional)?", "", name)
    return ALIASES.get(name, name)


def _label(node):
    """(label, whether it names a composite op) of one IR node."""
    own = node.ops[0] if node.ops else ""
    fx = node.fx
    original = getattr(fx, "meta", {}).get("original_aten") if fx is not None else None
    origin = getattr(original, "__name__", None) or (str(original) if original is not None else "")
    origin = origin.split(".")[0]
    if origin and origin != own and origin not in MOVES_DATA | CONSTANTS:
        return short(origin), True
    return short(own) if own else "", False


def kernel_name(members, index, position):
    """`brrr_<dominant ops>_<index>` for a kernel computing `members` (IR nodes, its roots first);
    `position` numbers FX nodes in graph order. A reduction kernel's first reduction names it first, then come
    the ops it came from, then the plain ops, each in graph order."""
    first_reduction = next((n for n in members if n.kind == "reduction"), None)
    composite, plain, moves = [], [], []
    for node in sorted(members, key=lambda n: (position.get(n.fx, len(position)), n.name)):
        label, is_composite = _label(node)
        if not label:
            continue
        if is_composite:
            composite.append(label)
        elif node.ops and node.ops[0] in MOVES_DATA | CONSTANTS:
            moves.append("copy" if node.ops[0] not in CONSTANTS else "fill")
        else:
            plain.append(label)
    lead = [_label(first_reduction)[0]] if first_reduction is not None else []
    parts = []
    for label in lead + composite + plain:
        if label and label not in parts:
            parts.append(label)
    parts = parts[:MAX_PARTS] or moves[:1] or ["kernel"]
    body = re.sub(r"[^0-9a-zA-Z_]", "_", "_".join(parts))
    return f"brrr_{body}_{index}"


def function_name(name, digest):
    """`brrr_bn_relu_3` with a source digest -> `brrr_bn_relu_<digest[:8]>`."""
    body, _, index = name.rpartition("_")
    return f"{body if index.isdigit() and body else name}_{digest[:8]}"
