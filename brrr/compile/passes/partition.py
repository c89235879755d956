"""What a training graph's forward saves for its backward (backend -> **AOTAutograd's partitioner** -> lower).

AOTAutograd's min-cut partitioner picks the saved values: the cut of the joint graph that moves the fewest bytes
from forward to backward, recomputing cheap pointwise values in the backward instead of saving them. brrr's
`recompute` option sets one of its rules:

- "cheap": torch's defaults. A pointwise value the backward must write to memory anyway (the input of a weight
  gradient's matmul: GPT-2's GELU output, a gated MLP's SiLU(gate) * up) is saved, never recomputed, so the
  backward moves no extra bytes.
- "pointwise": such values are recomputed too. The forward saves fewer bytes (GPT-2: one [tokens, 3072] tensor
  a layer instead of two); the backward writes each recomputed value once more and reads what it is made of.

Either way, a gather whose result is larger than what it reads (its table and its indices) is recomputed in the
backward rather than saved (`prefer_recomputing_gathers`): what the backward then needs is no bigger than what
it would have saved, and it reads rows of a small table instead of a large saved tensor. Torch's rule against
recomputing a value used on both sides of an op it cannot fuse (a scatter) kept GAT's h[src], [edges, heads,
channels], saved: 268 MiB of the 970 its launched training step peaked at (H200).
"""

import torch

from brrr.compile.ir.sizes import hint
from brrr.cost.ops import tensor_bytes

RECOMPUTE = ("cheap", "pointwise")
GATHERS = ("index.Tensor", "gather.default", "index_select.default")
MATERIALIZING = ("mm", "bmm", "addmm", "baddbmm", "convolution", "convolution_backward",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_cudnn_attention", "_efficient_attention_forward", "_flash_attention_forward")
VIEWS = ("view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze", "alias",
         "slice", "select")
DEFAULT_RECOMPUTE = "cheap"


def partition_fn(recompute=None):
    """A partition_fn for aot_autograd applying `recompute` (None: DEFAULT_RECOMPUTE)."""
    recompute = recompute or DEFAULT_RECOMPUTE
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}: choose one of {RECOMPUTE}")

    def partition(joint_module, joint_inputs, **kwargs):
        import torch._functorch.config as functorch_config
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        prefer_recomputing_gathers(joint_module, into_matmuls=recompute == "pointwise")
        with functorch_config.patch(ban_recompute_materialized_backward=recompute == "cheap"):
            return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)
    return partition


def prefer_recomputing_gathers(joint_module, into_matmuls=False):
    """Mark each gather of the joint graph whose result outsizes its inputs (integer indices only) as to be
    recomputed in the backward (torch's checkpoint policy PREFER_RECOMPUTE, which the min-cut honours); a node a
    user's checkpoint already marked keeps its mark, and one the graph returns is saved (the caller holds it
    anyway). Unless `into_matmuls`, not one that a matmul or convolution reads (through views): the backward
    would write it to memory again, as "cheap" never has it do."""
    from torch.utils.checkpoint import CheckpointPolicy

    for node in joint_module.graph.nodes:
        if node.op != "call_function" or "recompute" in node.meta or not str(node.target).endswith(GATHERS):
            continue
        if any(user.op == "output" for user in node.users):
            continue   # the caller holds it anyway: saving it costs nothing
        if not into_matmuls and _read_by_a_matmul(node):
            continue
        inputs = [_tensor(a) for a in node.all_input_nodes]
        out = _tensor(node)
        if out is None or any(t is None for t in inputs):
            continue
        if any(not t.dtype.is_floating_point and t.dtype not in (torch.int32, torch.int64) for t in inputs):
            continue   # a boolean mask's result has a data-dependent size
        if hint(tensor_bytes(out)) > sum(hint(tensor_bytes(t)) for t in inputs):
            node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE


def _read_by_a_matmul(node):
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        for user in n.users:
            name = str(user.target)
            if any(f"aten.{op}." in name for op in MATERIALIZING):
                return True
            if user not in seen and any(f"aten.{op}." in name for op in VIEWS):
                seen.add(user)
                todo.append(user)
    return False


def _tensor(node):
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None

