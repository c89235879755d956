"""Fallback scopes: what brrr does when it cannot compile something (capture -> ... -> runtime, all stages).

brrr never breaks a model and never makes it slower than eager because of its own failures. It gives up at
the smallest scope that works:

    op      a lowering refuses one ATen op (no lowering, no kernel code for a dtype): that op runs as an ATen
            call inside the compiled graph; everything around it stays fused (lowering/core.py, ir/mathops.py).
    kernel  a kernel fails to generate, to compile, or on its first launch: brrr re-plans the graph with that
            kernel's ops forced to ATen calls, a bounded number of times (`MAX_REPLANS`); the other kernels
            stay compiled (backend.compile_graph, runtime.compiled.CompiledGraph).
    graph   nothing can be compiled (symbolic shapes, a device brrr has no kernels for, planning fails, or the
            re-plans run out): the graph runs as Dynamo captured it, before decomposition, which is what eager
            runs (backend.brrr_backend).

Every fallback is logged here, process-wide, with its scope and reason: `brrr explain` lists those of kernel and
graph scope seen while models compiled (op-scope ones are part of each plan it shows), and the zoo records all
of a configuration's. BRRR_DEBUG=1 turns
brrr's own failures into exceptions instead (the tests set it). An out-of-memory error is never a fallback:
it propagates as torch's own OutOfMemoryError.

Every stage raises, logs and warns through this module, so it imports nothing of brrr's.
"""

import os
import warnings
from dataclasses import dataclass

MAX_REPLANS = 3   # re-plans of one graph after kernel failures before the graph falls back whole

_WARNED = set()


@dataclass(frozen=True)
class Fallback:
    scope: str      # "op" | "kernel" | "graph"
    graph: str      # inference | forward | backward | dynamo (a graph refused before AOTAutograd)
    what: str       # the op, kernel or graph that fell back
    reason: str


LOG = []   # Fallback records of every compile in the process (op scope too), in the order they happened


def log(scope, graph, what, reason):
    record = Fallback(scope, graph, what, reason)
    LOG.append(record)
    del LOG[:-1000]   # a long-lived process keeps the latest
    return record


class GraphFallback(Exception):
    """This graph cannot be compiled: run Dynamo's own graph instead. The message is the reason."""


class KernelFailed(Exception):
    """Kernel `name` failed at `stage` (generate | compile | launch); `fx_nodes` are the FX nodes it computed,
    which a re-plan runs as ATen calls."""

    def __init__(self, name, stage, cause, fx_nodes=()):
        super().__init__(f"kernel {name} failed to {stage}: {type(cause).__name__}: {str(cause)[:200]}")
        self.name, self.stage, self.cause, self.fx_nodes = name, stage, cause, tuple(fx_nodes)


def debugging():
    return os.environ.get("BRRR_DEBUG") == "1"


def is_out_of_memory(exc):
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


def warn_once(reason):
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"brrr: {reason}", stacklevel=3)


def recover(exc, what, then):
    """A failure inside brrr: raised under BRRR_DEBUG=1 (the tests), and an out-of-memory error always; else
    warned once while the caller goes on as `then` says (the model never breaks because of brrr)."""
    if debugging() or is_out_of_memory(exc):
        raise exc
    warn_once(f"{what} ({type(exc).__name__}: {str(exc)[:200]}); {then}")
