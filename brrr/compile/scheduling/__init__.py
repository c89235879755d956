"""Which IR nodes share a kernel, and in what memory order (lowering -> **scheduling** -> codegen).

Takes: a `lowering.core.Lowering`.
Hands on: a `schedule.Plan`: its steps in order (a `schedule.Kernel` per fused kernel, ATen steps for Externs,
Fallbacks and views of stored tensors), the nodes stored to memory, and every refusal to fuse with its reason.
layout.py fixes each kernel's walk order and the strides of what it stores, naming.py names kernels after what
they fuse. For the steps after code generation: inplace.py (which outputs take the memory of dead tensors) and
pricing.py (each kernel's FLOPs, bytes and ATen ops).

Must not import: passes, lowering, codegen, matmul, runtime, backend, explain.
"""
