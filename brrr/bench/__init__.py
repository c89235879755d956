"""brrr.bench: backends side by side — eager, inductor, brrr — same process, same inputs.

    result = brrr.bench(model, x, backends=("eager", "inductor", "brrr"), train=False)
    result.print(console); result.to_dict()

Modules: timing (how a call is timed), compare (error metrics and tolerance), step (inference or
forward+backward), backends (name -> compiled callable), runner (bench itself), result (table, dict),
shapes (bench_shapes: a model whose input shapes change between calls), micro (the suite's memory-bound
micro-benchmarks with their ideal bytes and FLOPs).
"""

from brrr.callable_package import make_callable
from brrr.bench.result import BenchResult, BenchRow
from brrr.bench.runner import DEFAULT_BACKENDS, bench
from brrr.bench.shapes import bench_shapes

__all__ = ["bench", "bench_shapes", "BenchResult", "BenchRow", "DEFAULT_BACKENDS"]


make_callable(__name__, bench)
