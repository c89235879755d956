"""Turning a backend name into something to run: eager, a torch.compile backend, or brrr's own.

`resolve_backend("brrr")` falls back to importing `brrr.compile.backend.brrr_backend` when the
`torch_dynamo_backends` entry point is not installed (e.g. a checkout run with PYTHONPATH);
"brrr-cudagraphs" is brrr with `cuda_graphs=True` (each compiled graph replayed from a CUDA graph) and
"brrr-launches" brrr with `cuda_graphs=False` (never replayed; plain "brrr" chooses by timing), "brrr-templates"
brrr with `matmul_templates="auto"` (matmul epilogues fused where timing says so), "brrr-recompute" brrr with
`recompute="pointwise"` (the forward saves no pointwise value its backward can recompute);
"inductor-reduce-overhead" is Inductor with `mode="reduce-overhead"` (its CUDA graphs). Callables are
passed through (tests register doubles that way). `fresh_compile` resets Dynamo first, so every backend
starts from nothing and the first call pays the whole compile.
"""

import contextlib

import torch


BRRR_VARIANTS = {   # name -> brrr.compile's options
    "brrr-cudagraphs": {"cuda_graphs": True},
    "brrr-launches": {"cuda_graphs": False},
    "brrr-templates": {"matmul_templates": "auto"},
    "brrr-recompute": {"recompute": "pointwise"},
}


INDUCTOR_MODES = {"inductor-reduce-overhead": "reduce-overhead"}   # name -> torch.compile's mode


def backend_name(backend):
    if isinstance(backend, str):
        return backend
    return getattr(backend, "__name__", type(backend).__name__)


def resolve_backend(backend):
    """'eager' -> None (no compile); a registered name -> the name; 'brrr' -> brrr's backend callable."""
    if backend is None or backend == "eager":
        return None
    if not isinstance(backend, str):
        return backend
    if backend in BRRR_VARIANTS:
        from brrr.compile.backend import make_backend

        fn = make_backend(**BRRR_VARIANTS[backend])
        fn.__name__ = backend
        return fn
    from torch._dynamo.backends.registry import lookup_backend

    try:
        lookup_backend(backend)
        return backend
    except Exception:
        if backend != "brrr":
            raise
    from brrr.compile.backend import brrr_backend  # ImportError here means: brrr's compiler is not built yet

    return brrr_backend


def dynamo_limits(minimum):
    """Config overrides raising Dynamo's recompile/cache limits to at least `minimum` (names differ by version)."""
    import torch._dynamo.config as config

    names = ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit")
    overrides = {}
    for name in names:
        try:
            current = getattr(config, name)
        except AttributeError:
            continue
        if isinstance(current, int):
            overrides[name] = max(current, minimum)
    return overrides


LOGGING_METHODS = ("debug", "info", "warning", "warn", "warning_once", "info_once", "warning_advice")


def ignored_logging_setting():
    """The name of Dynamo's set of logging functions it skips while tracing (it was renamed), or None."""
    import torch._dynamo.config as config

    return next((n for n in ("ignore_logging_functions", "ignore_logger_methods")
                 if isinstance(getattr(config, n, None), set)), None)


@contextlib.contextmanager
def skip_logging_in_graphs(enabled=True):
    """While in this context (a no-op when not `enabled`), Dynamo skips `logging.Logger` calls met while tracing, for every backend, instead
    of breaking the graph there (Dynamo's own hint for that break); a model's logging call inside a compiled
    region then does not run. The methods Hugging Face adds (`warning_once`...) are included where present, so
    enter it after the model's package is imported. Yields the names skipped: none where this torch has no such
    setting."""
    import logging

    import torch._dynamo.config as config

    name = ignored_logging_setting() if enabled else None
    if name is None:
        yield []
        return
    added = [m for m in LOGGING_METHODS if callable(getattr(logging.Logger, m, None))]
    with config.patch(**{name: getattr(config, name) | {getattr(logging.Logger, m) for m in added}}):
        yield added


@contextlib.contextmanager
def strict_dynamo(recompile_limit=64):
    """Errors raise instead of silently falling back to eager; enough recompiles for a sweep."""
    import torch._dynamo.config as config

    overrides = dynamo_limits(recompile_limit)
    if hasattr(config, "suppress_errors"):
        overrides["suppress_errors"] = False
    with config.patch(**overrides):
        yield


def fresh_compile(fn, backend, dynamic=None):
    """`fn` compiled with `backend` after a Dynamo reset; `fn` itself for eager."""
    options = {"mode": INDUCTOR_MODES[backend]} if backend in INDUCTOR_MODES else {}
    resolved = "inductor" if options else resolve_backend(backend)
    if resolved is None:
        return fn
    torch._dynamo.reset()
    return torch.compile(fn, backend=resolved, dynamic=dynamic, **options)


def stop_inductor_workers():
    """Stop Inductor's compile worker pool: idle workers share the host with whatever is timed next."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers
    except ImportError:
        return
    shutdown_compile_workers()
