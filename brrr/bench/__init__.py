"""brrr.bench: backends side by side — eager, inductor, brrr — same process, same inputs.

    result = brrr.bench(model, x, backends=("eager", "inductor", "brrr"), train=False)
    result.print(console); result.to_dict()

Modules: timing (how a call is timed), compare (error metrics and tolerance), step (inference or
forward+backward), backends (name -> compiled callable), runner (bench itself), result (table, dict),
micro (the suite's memory-bound micro-benchmarks with their ideal bytes and FLOPs).
"""

from brrr.bench.result import BenchResult, BenchRow
from brrr.bench.runner import DEFAULT_BACKENDS, bench

__all__ = ["bench", "BenchResult", "BenchRow", "DEFAULT_BACKENDS"]


def _make_module_callable():
    """`brrr.bench(...)` keeps working after this package is imported.

    Importing the subpackage `brrr.bench` replaces the `brrr.bench` function of brrr/__init__.py with this
    module (Python sets the attribute on import); a callable module makes both spellings the same call.
    """
    import sys
    import types

    class _CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return bench(*args, **kwargs)

    sys.modules[__name__].__class__ = _CallableModule


_make_module_callable()
