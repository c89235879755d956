"""Loading a script of benchmarks/ (not a package) as a module, with its folder and benchmarks/ importable."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(folder, name):
    """benchmarks/<folder>/<name>.py as a module named `<folder>_<name>`."""
    where = BENCHMARKS / folder
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", where / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path[:0] = [str(where), str(BENCHMARKS)]
    spec.loader.exec_module(module)
    return module
