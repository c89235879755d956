"""A backward's first call on a GPU runs its graph several times (the check, the floor's timings, the call itself)
on one set of saved tensors: with them kept on the host (runtime/handed_over.py), each run gets a fresh copy that
it frees at its last use, and a kernel failing half-way still has the graph run again."""

from types import SimpleNamespace

import pytest
import torch

from brrr.compile.fallbacks import KernelFailed
from brrr.compile.runtime import floor, handed_over
from brrr.compile.runtime.compiled import CompiledGraph


class RunsTimer:
    """The floor's timer, timing nothing: each measurement is one run of the graph, as the device timer's are."""

    def __init__(self):
        self.runs = 0

    def kernel_times(self, graph, args, names):
        self.runs += 1
        handed_over.run(graph.call, args)
        return {}

    def call_time(self, graph, args):
        handed_over.run(graph.call, args)
        return 1.0

    def roofline(self, choice, device):
        return 1e-6


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """The floor measures (a test-double timer), and inputs on the host count as a device's (no GPU here)."""
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(floor, "DECISIONS", [])
    timer = RunsTimer()
    monkeypatch.setattr(floor, "TIMER", timer)
    monkeypatch.setattr(handed_over, "_device_bytes",
                        lambda args: sum(t.numel() * t.element_size() for t in args if isinstance(t, torch.Tensor)))
    return timer


def measured_backward(call, source=""):
    """A backward CompiledGraph the floor measures: it owns its inputs and has a kernel to time."""
    graph = CompiledGraph(call, None, source, kind="backward")
    graph.owns_inputs = True
    graph.kernel_choices = [SimpleNamespace(name="brrr_kernel", digest="d")]
    graph.alternative = lambda *a, **k: None
    return graph


def backward_of(runs, fail_first=False):
    """A backward's generated call: saved * grad, recording for each run whether it owned its inputs and which
    tensors it read; the first run may fail as a kernel would."""
    def call(args, owned=False):
        saved, grad = args
        runs.append((owned, id(saved)))
        if owned:
            args.clear()
        if fail_first and len(runs) == 1:
            raise KernelFailed("brrr_kernel", "launch", RuntimeError("out of resources"), ())
        return (saved * grad,)
    return call


def test_every_run_of_a_backwards_first_call_owns_a_fresh_copy(measured):
    runs = []
    graph = measured_backward(backward_of(runs))
    saved, grad = torch.randn(4, 3), torch.randn(4, 3)
    args = [saved, grad]
    (out,) = graph(args)
    torch.testing.assert_close(out, saved * grad)
    assert args == []   # handed over at once: the caller's tensors go before the first run
    assert measured.runs == floor.KERNEL_SAMPLES and len(runs) == 1 + floor.KERNEL_SAMPLES + 1
    assert all(owned for owned, _ in runs) and id(saved) not in {i for _, i in runs}   # copies, each owned
    # later calls own the caller's list directly, as before
    runs.clear()
    (again,) = graph([saved, grad])
    assert runs == [(True, id(saved))] and torch.equal(again, saved * grad)


def test_a_kernel_failing_half_way_reruns_on_a_fresh_copy(measured, monkeypatch):
    monkeypatch.delenv("BRRR_DEBUG", raising=False)   # recover, as a user's run does
    runs = []
    graph = measured_backward(backward_of(runs, fail_first=True))
    graph.replan = lambda e: measured_backward(backward_of(runs), "replanned")
    saved, grad = torch.randn(4, 3), torch.randn(4, 3)
    (out,) = graph([saved, grad])
    torch.testing.assert_close(out, saved * grad)
    assert graph.source == "replanned" and len(runs) >= 3 and all(owned for owned, _ in runs)


def test_inputs_past_the_host_budget_stay_held(measured, monkeypatch):
    monkeypatch.setattr(handed_over, "MAX_BYTES", 8)
    runs = []
    graph = measured_backward(backward_of(runs))
    saved, grad = torch.randn(4, 3), torch.randn(4, 3)
    (out,) = graph([saved, grad])
    assert runs[0] == (False, id(saved)) and runs[-1] == (True, id(saved))   # held, then the last run owns them


def test_with_cached_verdicts_the_one_run_owns_the_callers_inputs(measured, monkeypatch):
    """Verdicts measured before (another process) leave one run, which frees the saved tensors themselves: no
    host copy is made."""
    first = measured_backward(backward_of([]))
    saved, grad = torch.randn(4, 3), torch.randn(4, 3)
    first([saved, grad])
    runs = []
    graph = measured_backward(backward_of(runs))
    copies, original = [], handed_over.HandedOver.__init__
    monkeypatch.setattr(handed_over.HandedOver, "__init__", lambda self, args: copies.append(1) or original(self, args))
    args = [saved, grad]
    (out,) = graph(args)
    torch.testing.assert_close(out, saved * grad)
    assert runs == [(True, id(saved))] and args == [] and not copies
    assert measured.runs == floor.KERNEL_SAMPLES   # the first graph's measurement only


def test_views_of_one_buffer_share_one_copy_of_the_memory_they_span():
    """q, k and v of one [rows, 3 * width] projection (interleaved views, each spanning nearly all of it) and a
    tensor of its own: each run's copies hold the projection once, not three times, and equal the originals in
    values, sizes, strides and offsets; a view of another dtype over the same memory is copied on its own."""
    qkv = torch.randn(5, 3 * 4)
    q, k, v = qkv.view(5, 3, 4).unbind(1)
    other = torch.randn(7)
    as_ints = qkv.view(torch.int32)[:, :2]
    args = [q, k, 2, v, other, as_ints]
    handed = handed_over.HandedOver(args)
    for fresh in (handed.fresh(), handed.fresh()):
        for got, want in zip(fresh, args):
            if isinstance(want, torch.Tensor):
                assert torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype
            else:
                assert got == want
        q2, k2, v2 = fresh[0], fresh[1], fresh[3]
        assert q2.untyped_storage().data_ptr() == k2.untyped_storage().data_ptr() == v2.untyped_storage().data_ptr()
        assert q2.untyped_storage().nbytes() <= qkv.untyped_storage().nbytes()
        assert (k2.storage_offset() - q2.storage_offset(), v2.storage_offset() - q2.storage_offset()) == (4, 8)
        assert fresh[5].untyped_storage().data_ptr() != q2.untyped_storage().data_ptr()
        assert fresh[1].data_ptr() != k.data_ptr()   # copies, not the originals
