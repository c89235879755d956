"""Hand-built ceilings and op records with round numbers, so expected values can be computed by hand."""

import torch

from brrr.analyze.capture import OpRecord
from brrr.cost.device import Ceilings


def make_ceilings(kind="cuda", bandwidth=1e12, fp32=1e13, tf32=8e13, bf16=1.6e14, fp16=1.6e14, vector_fp32=1e13,
                  launch_latency=5e-6):
    """Synthetic ceilings: round numbers so expected values can be computed by hand."""
    return Ceilings(device=f"synthetic {kind}", kind=kind, bandwidth=bandwidth,
                    matmul={"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16},
                    vector_fp32=vector_fp32, launch_latency=launch_latency,
                    versions={"torch": torch.__version__}, measured_at="2026-01-01")


def make_record(index, op_class="elementwise", flops=0, bytes_read=0, bytes_written=0, time_s=0.0,
                name="aten.add.Tensor", module="block", phase="forward", dtype=torch.float32,
                inputs_from=(), consumers=(), is_step_output=False, regime="overhead", kernel=False):
    return OpRecord(index=index, name=name, module=module, phase=phase, op_class=op_class, flops=flops,
                    bytes_read=bytes_read, bytes_written=bytes_written, dtype=dtype,
                    inputs_from=list(inputs_from), consumers=list(consumers), time_s=time_s,
                    is_step_output=is_step_output, regime=regime, kernel=kernel)
