"""brrr's fusing compiler: `torch.compile(model, backend="brrr")`.

    backend.py          Dynamo + AOTAutograd capture (core-ATen fw/bw graphs, min-cut partitioner)
    lower.py            FX node -> IR node: the driver, registry and shared helpers
    lowering/           one module per op family: pointwise.py, views.py (+cat/pad/gather/scatter), reductions.py
    ir.py, indexing.py  the IR (index -> value functions) and affine index expressions
    schedule.py         which nodes share a kernel, which are stored, and every refusal's reason
    codegen/triton.py   Triton source per kernel (pointwise, persistent and looped reductions); shim.py: math
    runtime.py          generated call(), on-disk kernel cache, worker pool, CUDA graphs, ATen fallback
    explain.py          what was fused, what was not and why, bytes before/after (brrr.cost)
"""

from brrr.callable_package import make_callable


def _compile(model, **options):
    """torch.compile(model, backend=brrr with `options`), e.g. cuda_graphs=True."""
    from brrr.compile.backend import compile

    return compile(model, **options)


make_callable(__name__, _compile)
