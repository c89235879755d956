"""A Dynamo-graph pass run before AOTAutograd (**capture** -> lower -> schedule -> codegen -> runtime).

The attention kernel is chosen while AOTAutograd traces: flash, memory-efficient, or the math fallback
(two bmm plus a materialized [batch*heads, L, S] softmax, upcast to fp32 for half types). On CUDA every
fused kernel requires the mask's last dimension to have stride 1. Hugging Face models under torch.compile
keep a padding mask they would drop in eager, built by broadcasting, so its last stride is 0 and
BERT-base (bf16, 8x512) fell back to math attention in every layer: measured on the H100, torch 2.11.

The pass gives such a mask one contiguous copy, shared by every attention call that reads it (for
BERT-base: 2 MB of bool, once per step), so the memory-efficient kernel can take it. Sizes may be symbolic
(a graph compiled per shape, specialize.py): a broadcast dim's stride is still the int 0 there.
"""

import torch
import torch.nn.functional as F

ATTENTION = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)


def _mask_of(node):
    if len(node.args) > 3:
        return node.args[3]
    return node.kwargs.get("attn_mask")


def _needs_copy(mask, devices):
    value = mask.meta.get("example_value", mask.meta.get("val"))
    if not isinstance(value, torch.Tensor) or value.device.type not in devices or value.dim() == 0:
        return False
    size, stride = value.size(-1), value.stride(-1)
    if isinstance(stride, int):
        return stride != 1 and (not isinstance(size, int) or size > 1)
    return True   # a symbolic stride: `.contiguous()` of a mask already contiguous costs nothing at run time


def contiguous_attention_masks(gm, devices=("cuda",)):
    """Rewrite `gm` in place; returns how many masks got a contiguous copy."""
    copies = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in ATTENTION:
            continue
        mask = _mask_of(node)
        if not isinstance(mask, torch.fx.Node) or not _needs_copy(mask, devices):
            continue
        if mask not in copies:
            with gm.graph.inserting_after(mask):
                copies[mask] = gm.graph.call_method("contiguous", (mask,))
        node.replace_input_with(mask, copies[mask])
    if copies:
        gm.recompile()
    return len(copies)
