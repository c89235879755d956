"""The compiled callable and what runs around it (codegen -> matmul -> **runtime**).

Takes: a scheduled `Plan`, its FX GraphModule and the compile options (CUDA graphs), plus the backend's
`rewrite_kernels` hook (matmul epilogue fusion) to run over the generated kernels.
Hands on: a `compiled.CompiledGraph`, a boxed callable that runs the generated `call(args)`; lean_autograd.py
runs a plain graph's forward and backward without AOTAutograd's wrappers.

compiled.py generates the call and loads the kernels (cache.py); graph_cache.py keeps compiled graphs on disk, so
a second compile of a graph assembles it without planning, and aot_cache.py keeps AOTAutograd's graphs for a Dynamo
graph, so a second compile of a plain one skips AOTAutograd too; launch.py launches them without the JIT's
per-call work (compile_workers.py compiles them in worker processes where BRRR_COMPILE_WORKERS asks);
cuda_graphs.py replays a whole call as a CUDA graph, recordings.py keeps one per shape and per place of a graph's
parameters; replay_choice.py times launching against replaying, and
among_ranks.py makes data-parallel ranks agree on the verdict; handed_over.py keeps a backward's inputs on the host
through its measured first call; kernel_registry.py records every kernel by the name a profiler sees (read by
brrr.analyze).

Must not import: passes, lowering, matmul, backend, explain.
"""
