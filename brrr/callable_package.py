"""Keep `brrr.analyze(...)`, `brrr.compile(...)` and `brrr.bench(...)` callable after their packages load.

brrr/__init__.py exposes functions named like the subpackages brrr/analyze, brrr/compile and brrr/bench.
Importing a subpackage makes Python set the attribute `brrr.<name>` to the package module, replacing the
function. Each of those packages calls `make_callable(__name__, fn)`, so the module itself calls `fn`.
"""

import sys
import types


def make_callable(module_name, function):
    """Make the module `module_name` callable as `function(*args, **kwargs)`."""

    class CallablePackage(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return function(*args, **kwargs)

    CallablePackage.__call__.__doc__ = function.__doc__
    sys.modules[module_name].__class__ = CallablePackage
