"""Inputs a graph updates, written back (codegen -> **runtime**): batch norm's running statistics in training.

A graph returns the new values of the inputs it updates, and they are copied into the caller's tensors after
it. `torch._foreach_copy_` copies a list of mixed dtypes tensor by tensor: a DenseNet121 step's 121 batch norms
update 242 float32 statistics and 121 int64 counters, one copy each (364 `cudaMemcpyAsync` a step). Grouped by
dtype and device, a multi-tensor copy takes each group in a launch or a few.
"""

import torch


def write_back(targets, values):
    """Copy each of `values` into the tensor at the same place in `targets`, one multi-tensor copy per group of
    one device and one pair of dtypes."""
    groups = {}
    for target, value in zip(targets, values):
        group = groups.setdefault((target.device, target.dtype, value.dtype), ([], []))
        group[0].append(target)
        group[1].append(value)
    with torch.no_grad():
        for group_targets, group_values in groups.values():
            torch._foreach_copy_(group_targets, group_values)
