"""What a training graph's forward saves for its backward (backend -> **AOTAutograd's partitioner** -> lower).

AOTAutograd's min-cut partitioner picks the saved values: the cut of the joint graph that moves the fewest bytes
from forward to backward, recomputing cheap pointwise values in the backward instead of saving them. brrr's
`recompute` option sets one of its rules:

- "cheap": torch's defaults. A pointwise value the backward must write to memory anyway (the input of a weight
  gradient's matmul: GPT-2's GELU output, a gated MLP's SiLU(gate) * up) is saved, never recomputed, so the
  backward moves no extra bytes.
- "pointwise": such values are recomputed too. The forward saves fewer bytes (GPT-2: one [tokens, 3072] tensor
  a layer instead of two); the backward writes each recomputed value once more and reads what it is made of.
"""

RECOMPUTE = ("cheap", "pointwise")
DEFAULT_RECOMPUTE = "cheap"


def partition_fn(recompute=None):
    """A partition_fn for aot_autograd applying `recompute` (None: DEFAULT_RECOMPUTE)."""
    recompute = recompute or DEFAULT_RECOMPUTE
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}: choose one of {RECOMPUTE}")

    def partition(joint_module, joint_inputs, **kwargs):
        import torch._functorch.config as functorch_config
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        with functorch_config.patch(ban_recompute_materialized_backward=recompute == "cheap"):
            return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)
    return partition
