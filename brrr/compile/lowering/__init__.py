"""Core-ATen FX node -> IR node (passes -> **lowering** -> scheduling).

Takes: a core-ATen FX GraphModule and the FX nodes forced to run as ATen (a failed kernel's ops).
Hands on: a `core.Lowering`: an IR node per FX node, the graph's outputs, and the ops that stay ATen calls
(Externs such as matmuls and convolutions, Fallbacks with their reasons).

core.py is the driver, the tables (`LOWERINGS`, `PRIMS`) and the helpers the op families share; pointwise.py,
views.py, scatter.py, reductions.py and windows.py each register their ops into those tables when imported.
This package imports them after core, so importing any module of the lowering registers every family, and
core never imports a family back.

Must not import: passes, matmul, runtime, backend, explain.
"""

from brrr.compile.lowering import core, pointwise, reductions, scatter, views, windows  # noqa: F401  (registration)
