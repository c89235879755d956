"""Compiler tests run brrr's kernels in the Triton interpreter on CPU tensors (no GPU needed)."""

import os
import tempfile

os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported anywhere
os.environ["BRRR_DEBUG"] = "1"                # brrr errors raise here instead of quietly running ATen
os.environ.setdefault("BRRR_CACHE_DIR", tempfile.mkdtemp(prefix="brrr-test-cache-"))
# tests watch planning (spies, injected failures): a graph kept by an earlier test would skip it; the graph
# cache's own tests (test_graph_cache.py) turn it on
os.environ.setdefault("BRRR_GRAPH_CACHE", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

np.seterr(all="ignore")

class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on the CPU: replays by rerunning the call captured with it and writing
    into the captured outputs. `replays` counts them; `replaying` is True while one runs, `capturing` while
    torch.cuda.graph's context is open."""

    replays = 0
    replaying = False
    capturing = False

    def pool(self):
        return ("pool of", id(self))   # a handle other captures may share

    consumed = ()   # inputs a consuming capture freed into the pool: a real replay reuses their memory
    written = ()    # (input, output): the copies of updated inputs the capture recorded (GraphedCall.written)

    def replay(self):
        FakeGraph.replays += 1
        FakeGraph.replaying = True
        try:
            for static, new in zip(self.outputs, self.call(list(self.args))):
                if isinstance(static, torch.Tensor):   # a backward returns None for an input needing no gradient
                    _write(static, new)
            for target, value in self.written:   # the updated inputs' copies recorded after the call
                target.copy_(value)
            for t in self.consumed:   # what the pool's later buffers leave there: a stale read gives NaN
                if t.is_floating_point():
                    t.fill_(float("nan"))
        finally:
            FakeGraph.replaying = False


def _write(static, new):
    """What the graph's kernels would write into `static`: an expanded output (elements sharing memory, which
    copy_ refuses) gets the memory it spans written."""
    if torch._debug_has_internal_overlap(static) == 1:
        assert new.stride() == static.stride()
        span = lambda t: t.as_strided((1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())),), (1,),
                                      t.storage_offset())
        span(static).copy_(span(new))
    else:
        static.copy_(new)


@pytest.fixture
def fake_cuda_graphs(monkeypatch):
    """CUDA-graph capture and replay on the CPU (cuda_graphs.GraphedCall with FakeGraph); yields FakeGraph."""
    import contextlib

    from brrr.compile.runtime.cuda_graphs import GraphedCall

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    @contextlib.contextmanager
    def graph(g, pool=None, **kw):
        g.captured_into = pool   # the pool handle the capture shared, if any
        FakeGraph.capturing = True
        try:
            yield
        finally:
            FakeGraph.capturing = False
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(FakeGraph, "replays", 0)
    capture = GraphedCall._capture

    def capture_and_remember(self, args):
        updated = {j: args[j].clone() for _, j in self.write_back}
        ok = capture(self, args)
        if ok:
            self.graph.call, self.graph.args, self.graph.outputs = self.call, self.static, self.static_out
            self.graph.written = [(self.static[j], self.static_out[i]) for i, j in self.written.items()]
            for j in self.written.values():   # a real capture records the copies into them and runs nothing
                self.static[j].copy_(updated[j])
            if self.consume:   # those of the forward's pool (a view of a parameter is the caller's memory)
                pooled = self.after().lent_ptrs
                self.graph.consumed = [self.static[i] for i in self.pin
                                       if self.static[i].untyped_storage().data_ptr() in pooled]
        return ok
    monkeypatch.setattr(GraphedCall, "_capture", capture_and_remember)
    yield FakeGraph


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    from brrr.compile.runtime import trial_turns

    torch._dynamo.reset()
    trial_turns.reset()   # a graph an earlier test left mid-trial holds no turn here
    torch.manual_seed(0)
    yield


class _BoundsGuard:
    """Fails any interpreted kernel whose unmasked loads or stores leave the tensors it was given.

    On a GPU such an access is an illegal address (or silent garbage); the interpreter reads host memory and
    would not notice, so every masked load/store is checked against the storages of the launch's tensors."""

    def __init__(self):
        from triton.runtime import interpreter

        self.interpreter, self.ranges = interpreter, []

    def install(self):
        it = self.interpreter
        guard = self
        init_args, load, store = (it.GridExecutor._init_args_hst, it.InterpreterBuilder.create_masked_load,
                                  it.InterpreterBuilder.create_masked_store)

        def init_args_hst(executor, args_dev, kwargs):
            args_hst, kwargs_hst = init_args(executor, args_dev, kwargs)
            # a TMA descriptor's tensor is its `base` (TMA itself reads only inside it, zero-filling the rest)
            tensors = [getattr(a, "base", a) for a in list(args_hst) + list(kwargs_hst.values())]
            guard.ranges = [(s.data_ptr(), s.data_ptr() + s.nbytes())
                            for s in (a.untyped_storage() for a in tensors if isinstance(a, torch.Tensor))]
            return args_hst, kwargs_hst

        def checked(op):
            def run(builder, ptrs, *rest, **kwargs):
                mask = rest[1] if op is store else rest[0]
                guard.check(ptrs, mask)
                return op(builder, ptrs, *rest, **kwargs)
            return run

        it.GridExecutor._init_args_hst = init_args_hst
        it.InterpreterBuilder.create_masked_load = checked(load)
        it.InterpreterBuilder.create_masked_store = checked(store)

    def check(self, ptrs, mask):
        addresses = np.asarray(ptrs.data, dtype=np.uint64).ravel()
        if mask is not None:
            addresses = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), ptrs.data.shape).ravel()]
        if not addresses.size or not self.ranges:
            return
        itemsize = self.interpreter._get_np_dtype(ptrs.get_element_ty()).itemsize
        inside = np.zeros(addresses.shape, dtype=bool)
        for start, end in self.ranges:
            inside |= (addresses >= start) & (addresses + itemsize <= end)
        if not inside.all():
            raise AssertionError(f"kernel accesses {int((~inside).sum())} element(s) outside its tensors")


_BoundsGuard().install()


@pytest.fixture
def small_column_splits(monkeypatch):
    """The column split's thresholds scaled down, so that its three kinds of chunk appear at ~150k elements (the
    interpreter runs them ~10x faster than at the ~2M elements the real thresholds need): a split from 128 rows
    and 32k elements, chunks of at least 100 rows (64 where they tile the rows), and partial sums over more than
    512 columns looped rather than held whole."""
    from brrr.compile.codegen import triton as codegen
    from brrr.compile.lowering import core

    for name, value in dict(SPLIT_COLUMN_MIN_R=128, SPLIT_COLUMN_MIN_NUMEL=1 << 15, SPLIT_COLUMN_PROGRAMS=32,
                            SPLIT_COLUMN_MIN_CHUNK=100, SPLIT_COLUMN_MIN_EXACT_CHUNK=64).items():
        monkeypatch.setattr(core, name, value)
    monkeypatch.setattr(codegen, "FEW_COLUMNS", 512)
