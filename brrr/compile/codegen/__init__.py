"""Kernel -> Triton source (scheduling -> **codegen** -> runtime).

Takes: one `scheduling.schedule.Kernel`, the set of stored nodes and which kernel computes each root.
Hands on: a `triton.KernelSource`: the module's source, its arguments, grid and launch meta, the ATen ops and
bytes it covers. shim.py holds the math helpers generated kernels call, portable between the GPU and the Triton
interpreter; special_functions.py and orthogonal_polynomials.py the special functions among them. The matmul
templates' codegen is in matmul/, which renders epilogues with this package's Codegen.

Must not import: passes, lowering, scheduling, matmul, runtime, backend, explain.
"""
