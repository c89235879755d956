"""brrr's fusing compiler: `torch.compile(model, backend="brrr")`. The folders follow a graph through it:

    backend.py     Dynamo + AOTAutograd capture (core-ATen forward/backward graphs), then the stages below
    passes/        FX-graph rewrites before lowering: linear + cross-entropy, matmul padding, attention masks, ...
    ir/            the loop-level IR: nodes, affine index expressions, symbolic sizes, the math-op table
    lowering/      core-ATen FX node -> IR node: core.py, then one module per op family
    scheduling/    which nodes share a kernel and which are stored, memory order, in-place reuse, pricing, names
    codegen/       kernel -> Triton source
    matmul/        matmul templates, epilogue and prologue fusion, the choice against cuBLAS, the chunked loss op
    runtime/       the generated call(), launches, CUDA graphs and the launch-or-replay trial, lean autograd
    cache.py       the on-disk cache; fallbacks.py: what brrr does when it cannot compile something
    explain.py     what was fused, what was not and why, bytes before/after (brrr.cost)

docs/architecture.md walks through them in order.
"""

from brrr.callable_package import make_callable


def _compile(model, **options):
    """torch.compile(model, backend=brrr with `options`), e.g. cuda_graphs=True."""
    from brrr.compile.backend import compile

    return compile(model, **options)


make_callable(__name__, _compile)
