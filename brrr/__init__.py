"""brrr: diagnose where a PyTorch model's time goes, and fix it with a fusing compiler.

Public API (imports are lazy so `import brrr` stays cheap):
    brrr.analyze(model, *inputs, train=False, verify=False) -> Analysis   (brrr/analyze)
    brrr.compile(model, **options)            -> compiled model  (brrr/compile)
    brrr.explain(fn_or_model, *inputs)        -> Explanation     (brrr/compile/explain.py)
    brrr.bench(model, *inputs, backends=...)  -> BenchResult     (brrr/bench)
"""

__version__ = "0.1.0"
__all__ = ["analyze", "compile", "explain", "bench", "__version__"]


def analyze(model, *inputs, train=False, device=None, progress=False, **options):
    from brrr.analyze import analyze as _analyze

    return _analyze(model, *inputs, train=train, device=device, progress=progress, **options)


def compile(model, **options):
    from brrr.compile.backend import compile as _compile

    return _compile(model, **options)


def explain(fn_or_model, *inputs, **options):
    from brrr.compile.explain import explain as _explain

    return _explain(fn_or_model, *inputs, **options)


def bench(model, *inputs, **options):
    from brrr.bench import bench as _bench

    return _bench(model, *inputs, **options)
