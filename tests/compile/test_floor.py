"""The floor (runtime/floor.py) on the CPU, with a test-double timer: a kernel far below its roofline is replaced
by whichever form of its graph times fastest (the plan split at its fusion, or its ops as ATen), the verdicts
are cached on disk and a second process times nothing."""

import contextlib
import os
import subprocess
import sys

import pytest
import torch

from brrr.compile.runtime import floor, kernel_registry as registry
from tests.compile.helpers import ROOT, compiled


def norm_block(x, w):
    """A reduction with a prologue: one fused kernel (relu, mul, mean, sub) in brrr's plan."""
    y = torch.relu(x) * w
    return y - y.mean(-1, keepdim=True)


class FakeTimer:
    """Times kernels and whole calls by what a graph's call holds: `slow` kernels (those fusing a mean after a
    relu) take `kernel_s`; a whole call costs `fused_s` while such a kernel is in it, else `split_s` when the
    graph stores the relu's product for a kernel of its own, else `aten_s` (the ops run as ATen calls)."""

    def __init__(self, fused_s, split_s, aten_s, kernel_s=1.0, roofline_s=1e-6):
        self.fused_s, self.split_s, self.aten_s = fused_s, split_s, aten_s
        self.kernel_s, self.roofline_s = kernel_s, roofline_s
        self.kernel_calls = self.call_calls = 0
        self.forms = []

    def kernel_times(self, graph, args, names):
        self.kernel_calls += 1
        graph.call(args)
        return {n: self.kernel_s if _fuses_relu_and_mean(n) else self.roofline_s for n in names}

    def call_time(self, graph, args):
        self.call_calls += 1
        graph.call(args)
        form = _form(graph.source)
        self.forms.append(form)
        return {"fused": self.fused_s, "split": self.split_s, "aten": self.aten_s}[form]

    def roofline(self, choice, device):
        return self.roofline_s


def _fuses_relu_and_mean(name):
    return "relu" in name and "mean" in name


def _form(source):
    launched = [line for line in source.splitlines() if line.strip().startswith("brrr_")]
    if any(_fuses_relu_and_mean(line.split("(")[0]) for line in launched):
        return "fused"
    return "aten" if "fallback: measured" in source else "split"


@pytest.fixture
def timer_of(monkeypatch, tmp_path):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(floor, "DECISIONS", [])

    def install(timer):
        monkeypatch.setattr(floor, "TIMER", timer)
        return timer
    return install


def _run(x, w):
    torch._dynamo.reset()
    return compiled(norm_block)(x, w)


@pytest.mark.parametrize("fastest", ["split", "aten", "fused"])
def test_a_slow_kernel_keeps_the_form_that_times_fastest(timer_of, fastest):
    times = {"fused": 3.0, "split": 2.0, "aten": 2.5} if fastest == "split" else \
        {"fused": 3.0, "split": 2.9, "aten": 1.0} if fastest == "aten" else {"fused": 1.0, "split": 2.0, "aten": 2.0}
    timer = timer_of(FakeTimer(times["fused"], times["split"], times["aten"]))
    x, w = torch.randn(8, 64), torch.randn(64)
    out = _run(x, w)
    torch.testing.assert_close(out, norm_block(x, w))
    slow = [v for v in floor.DECISIONS if _fuses_relu_and_mean(v.kernel)]
    assert len(slow) == 1 and slow[0].fraction < floor.THRESHOLD
    assert set(slow[0].tried) == {"fused", "split", "aten", "2 warps", "8 warps"}
    assert slow[0].kept == fastest
    assert timer.forms[0] == "fused" and set(timer.forms) == {"fused", "split", "aten"}
    again = compiled(norm_block)(x, w)   # the same compiled function, second call: the kept form runs
    torch.testing.assert_close(again, norm_block(x, w))


def test_the_kept_form_runs_from_the_second_call_on(timer_of):
    timer_of(FakeTimer(3.0, 2.0, 2.5))
    x, w = torch.randn(8, 64), torch.randn(64)
    torch._dynamo.reset()
    fn = compiled(norm_block)
    fn(x, w)
    launched = []   # interpreted launches take the JIT path, which opens LAUNCH_HOOK around each
    registry.LAUNCH_HOOK = lambda name: launched.append(name) or contextlib.nullcontext()
    try:
        x2 = torch.randn(8, 64)
        torch.testing.assert_close(fn(x2, w), norm_block(x2, w))
    finally:
        registry.LAUNCH_HOOK = None
    assert launched and not any(_fuses_relu_and_mean(n) for n in launched)
    assert len(launched) >= 2   # split: the stored product and the reduction over it


def test_kernels_at_their_roofline_are_not_given_alternatives(timer_of):
    timer = timer_of(FakeTimer(3.0, 1.0, 1.0, kernel_s=2e-6, roofline_s=1e-6))
    x, w = torch.randn(8, 64), torch.randn(64)
    torch.testing.assert_close(_run(x, w), norm_block(x, w))
    assert timer.kernel_calls == floor.KERNEL_SAMPLES and timer.call_calls == 0
    assert floor.DECISIONS and all(not v.tried for v in floor.DECISIONS)


def test_a_slow_kernel_whose_whole_gap_cannot_reach_the_margin_is_given_no_alternative(timer_of, monkeypatch,
                                                                                       tmp_path):
    """No alternative can save more than a kernel's time above its roofline: where that is under the 3% an
    alternative must save of the whole call, none is compiled (the timer double would have split won)."""
    timer = timer_of(FakeTimer(3.0, 1.0, 1.0, kernel_s=0.08))
    x, w = torch.randn(8, 64), torch.randn(64)
    torch.testing.assert_close(_run(x, w), norm_block(x, w))
    [slow] = [v for v in floor.DECISIONS if _fuses_relu_and_mean(v.kernel)]
    assert slow.fraction < floor.THRESHOLD and slow.tried == {"fused": 3.0} and slow.kept == "fused"
    assert timer.call_calls == 1 and timer.forms == ["fused"]
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path / "measured-again"))   # no verdict cached
    timer_of(FakeTimer(3.0, 1.0, 1.5, kernel_s=0.1))   # over 3% of the call: tried, and split kept
    torch.testing.assert_close(_run(x, w), norm_block(x, w))
    [slow] = [v for v in floor.DECISIONS if _fuses_relu_and_mean(v.kernel) and v.kept != "fused"]
    assert slow.kept == "split" and {"split", "aten"} <= set(slow.tried)


def test_cached_verdicts_are_applied_without_timing(timer_of):
    first = timer_of(FakeTimer(3.0, 2.0, 2.5))
    x, w = torch.randn(8, 64), torch.randn(64)
    _run(x, w)
    assert first.call_calls == 5   # the graph, with 2 and 8 warps, split, as ATen
    second = timer_of(FakeTimer(3.0, 2.0, 2.5))
    torch.testing.assert_close(_run(x, w), norm_block(x, w))
    assert second.kernel_calls == 0 and second.call_calls == 0
    assert [v.kept for v in floor.DECISIONS if v.tried] == ["split", "split"]


def test_a_corrupt_verdict_file_is_measured_again(timer_of, tmp_path):
    timer_of(FakeTimer(3.0, 2.0, 2.5))
    x, w = torch.randn(8, 64), torch.randn(64)
    _run(x, w)
    for f in (tmp_path / "floor").iterdir():
        f.write_text(f.read_text()[:20])
    again = timer_of(FakeTimer(3.0, 2.0, 2.5))
    torch.testing.assert_close(_run(x, w), norm_block(x, w))
    assert again.kernel_calls == floor.KERNEL_SAMPLES and again.call_calls == 5


def test_the_floor_keeps_the_users_random_stream(timer_of):
    timer_of(FakeTimer(3.0, 2.0, 2.5))
    torch.manual_seed(0)
    x, w = torch.randn(8, 64), torch.randn(64)
    _run(x, w)
    after_compile = torch.rand(3)
    torch.manual_seed(0)
    torch.randn(8, 64), torch.randn(64)
    torch.testing.assert_close(after_compile, torch.rand(3))


def test_a_second_process_reuses_the_verdicts(tmp_path):
    worker = ROOT / "tests" / "compile" / "floor_worker.py"
    env = dict(os.environ, BRRR_CACHE_DIR=str(tmp_path), TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    runs = [subprocess.run([sys.executable, str(worker)], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    first, second = (dict(line.split("=") for line in r.stdout.split()) for r in runs)
    assert first["timed_calls"] == "5" and first["kept"] == "split"
    assert second["timed_calls"] == "0" and second["timed_kernels"] == "0" and second["kept"] == "split"


def test_explain_lists_each_kernels_measurement_and_what_was_kept(timer_of):
    import brrr

    timer_of(FakeTimer(3.0, 2.0, 2.5))
    x, w = torch.randn(8, 64), torch.randn(64)
    _run(x, w)
    text = str(brrr.explain(norm_block, x, w))
    [line] = [line for line in text.splitlines() if "whole calls" in line]
    assert "roofline 1 us (0%)" in line and "fused 3000000 us" in line and "split 2000000 us" in line
    assert line.endswith("kept split")


class WarpsTimer(FakeTimer):
    """The fused kernel is fastest launched with 8 warps; split and ATen lose."""

    def call_time(self, graph, args):
        self.call_calls += 1
        graph.call(args)
        glb = graph.call.__globals__
        [name] = [n for n in glb if n.startswith("brrr_") and _fuses_relu_and_mean(n)] or [None]
        if name is None:
            return 5.0
        return 1.0 if glb[name].meta["num_warps"] == 8 else 3.0


def test_a_slow_kernel_keeps_the_warps_that_time_fastest_and_a_second_compile_applies_them(timer_of, monkeypatch):
    timer_of(WarpsTimer(0, 0, 0))
    x, w = torch.randn(8, 64), torch.randn(64)
    torch._dynamo.reset()
    fn = compiled(norm_block)
    torch.testing.assert_close(fn(x, w), norm_block(x, w))
    [slow] = [v for v in floor.DECISIONS if v.tried]
    assert slow.kept == "8 warps" and slow.tried["8 warps"] == 1.0 and slow.tried["fused"] == 3.0
    again = timer_of(WarpsTimer(0, 0, 0))
    torch._dynamo.reset()
    fn = compiled(norm_block)
    torch.testing.assert_close(fn(x, w), norm_block(x, w))
    assert again.call_calls == 0
    from brrr.compile.runtime.launch import Launcher

    warps, launch = [], Launcher.__call__
    monkeypatch.setattr(Launcher, "__call__", lambda self, *a, **k: warps.append(
        (self.name, self.meta["num_warps"])) or launch(self, *a, **k))
    torch.testing.assert_close(fn(x, w), norm_block(x, w))
    assert [n for name, n in warps if _fuses_relu_and_mean(name)] == [8]


def column_sum(x):
    """Batch-norm statistics' shape of sum: over N, H, W of a channels_last tensor (a column reduction)."""
    return torch.relu(x).sum((0, 2, 3))


class WiderTimer(FakeTimer):
    """A whole call is fast only while the slow kernel's reduction is split into partial sums, the ReLU still
    fused into them (a wider split; splitting at the fusion stores the ReLU's value for a kernel of its own)."""

    def kernel_times(self, graph, args, names):
        self.kernel_calls += 1
        graph.call(args)
        return {n: self.kernel_s if "relu" in n else self.roofline_s for n in names}

    def call_time(self, graph, args):
        self.call_calls += 1
        graph.call(args)
        launched = [line.split("(")[0].strip() for line in graph.source.splitlines()
                    if line.strip().startswith("brrr_")]
        wider = "fallback" not in graph.source and len(launched) >= 2 and \
            any("relu" in n and ("mean" in n or "sum" in n) for n in launched)
        self.forms.append("wider" if wider else "other")
        return 1.0 if wider else 3.0


@pytest.mark.parametrize("fn,shape,channels_last", [(norm_block, (4, 2048), False),
                                                    (column_sum, (4, 8, 16, 16), True)],
                         ids=["rows", "columns"])
def test_a_slow_reduction_keeps_a_wider_split_and_a_second_compile_applies_it(timer_of, fn, shape, channels_last):
    """The floor's "wider" alternative: the slow kernel's reductions split across more programs. Kept where it
    times fastest, equal to eager, and applied by a second compile, which times nothing."""
    timer = timer_of(WiderTimer(0, 0, 0))
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(shape, generator=g, dtype=torch.float64)]
    if channels_last:
        args[0] = args[0].contiguous(memory_format=torch.channels_last)
    else:
        args.append(torch.randn(shape[-1], generator=g, dtype=torch.float64))
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(fn)(*args), fn(*args))
    [slow] = [v for v in floor.DECISIONS if v.tried]
    assert slow.kept == "wider" and slow.tried["wider"] == 1.0 and slow.tried["fused"] == 3.0
    assert "wider" in timer.forms
    again = timer_of(WiderTimer(0, 0, 0))
    torch._dynamo.reset()
    refn = compiled(fn)
    torch.testing.assert_close(refn(*args), fn(*args))
    assert again.kernel_calls == 0 and again.call_calls == 0
    launched = []
    registry.LAUNCH_HOOK = lambda name: launched.append(name) or contextlib.nullcontext()
    try:
        torch.testing.assert_close(refn(*args), fn(*args))
    finally:
        registry.LAUNCH_HOOK = None
    assert len(launched) >= 2   # the partial sums across more programs, then their sum


def test_a_wider_split_takes_more_programs_than_the_plans_own():
    """lowering.core's `wide` split: WIDE_FACTOR times the partial sums of the plan's own split of a few long
    rows, and a split of columns the plan reduces whole (their values: the floor test above)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from brrr.compile.backend import plan_graph
    from brrr.compile.lowering import core

    def kernels(gm, wider):
        return [k for kind, k in plan_graph(gm, {}, (), wider).steps if kind == "kernel"]

    rows = make_fx(lambda t: (t.sum(1),))(torch.randn(4, 65536))
    [fx] = [n for n in rows.graph.nodes if n.op == "call_function"]
    planned, wide = kernels(rows, ()), kernels(rows, (fx,))
    assert len(planned) == len(wide) == 2   # partial sums, then their sum
    assert wide[0].roots[0].shape == (4, core.WIDE_FACTOR * planned[0].roots[0].shape[1])   # (rows, chunks)
    assert planned[0].roots[0].meta["widenable"] and planned[1].roots[0].meta["widenable"]
    columns = make_fx(lambda t: (t.sum((0, 2, 3)),))(torch.randn(4, 8, 16, 16).contiguous(
        memory_format=torch.channels_last))
    [fx] = [n for n in columns.graph.nodes if n.op == "call_function"]
    planned, wide = kernels(columns, ()), kernels(columns, (fx,))
    assert len(planned) == 1 and len(wide) == 2 and wide[0].roots[0].shape[1] == 8   # (chunks, channels)
    short = make_fx(lambda t: (t.sum(1),))(torch.randn(4, 256))
    assert not any(k.roots[0].meta["widenable"] for k in kernels(short, ()))   # too short to cut in two chunks


def test_the_kept_form_comes_from_the_graph_cache_planning_nothing(timer_of, monkeypatch):
    from brrr.compile.runtime import graph_cache

    monkeypatch.setenv("BRRR_GRAPH_CACHE", "1")
    monkeypatch.setattr(graph_cache, "STATS", dict.fromkeys(graph_cache.STATS, 0))
    timer_of(FakeTimer(3.0, 2.0, 2.5))
    x, w = torch.randn(8, 64), torch.randn(64)
    _run(x, w)
    assert graph_cache.STATS["planned"] == 3 and graph_cache.STATS["stored"] == 3   # as planned, split, as ATen
    second = timer_of(FakeTimer(3.0, 2.0, 2.5))
    torch._dynamo.reset()
    fn = compiled(norm_block)
    torch.testing.assert_close(fn(x, w), norm_block(x, w))
    assert graph_cache.STATS["planned"] == 3 and graph_cache.STATS["hits"] == 2   # as planned, then the kept form
    assert second.kernel_calls == 0 and second.call_calls == 0
    launched = _launched(fn, x, w)
    assert launched and not any(_fuses_relu_and_mean(n) for n in launched)   # the split form runs


def test_with_cached_verdicts_the_first_call_runs_the_graph_once(timer_of):
    timer_of(FakeTimer(3.0, 3.0, 3.0))   # nothing faster: the kept form is the graph as planned
    x, w = torch.randn(8, 64), torch.randn(64)
    _run(x, w)
    second = timer_of(FakeTimer(3.0, 3.0, 3.0))
    torch._dynamo.reset()
    fn = compiled(norm_block)
    counts = [len(_launched(fn, x, w)) for _ in range(2)]
    assert second.kernel_calls == 0 and second.call_calls == 0
    assert counts[0] == counts[1] > 0   # the checking run's outputs are returned: no second run


def _launched(fn, x, w):
    """The kernels one call of `fn` launched (interpreted launches open LAUNCH_HOOK), its values checked."""
    launched = []
    registry.LAUNCH_HOOK = lambda name: launched.append(name) or contextlib.nullcontext()
    try:
        torch.testing.assert_close(fn(x, w), norm_block(x, w))
    finally:
        registry.LAUNCH_HOOK = None
    return launched


def two_blocks(x, m, w):
    """norm_block, a matmul, norm_block again at the same size: two kernels of one source."""
    return norm_block(norm_block(x, w) @ m, w)


def test_kernels_of_one_source_are_one_decision_and_a_second_compile_builds_the_timed_form(timer_of, monkeypatch):
    """A repeated layer's kernels share a source, and a cached verdict is applied by source: the alternative timed
    is the one with every such kernel replaced, so the second compile builds that very form, from the graph
    cache."""
    from brrr.compile.runtime import graph_cache

    monkeypatch.setenv("BRRR_GRAPH_CACHE", "1")
    monkeypatch.setattr(graph_cache, "STATS", dict.fromkeys(graph_cache.STATS, 0))
    timer = timer_of(FakeTimer(3.0, 2.0, 2.5))
    x, y, w = torch.randn(8, 64), torch.randn(64, 64), torch.randn(64)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(two_blocks)(x, y, w), two_blocks(x, y, w))
    slow = [v for v in floor.DECISIONS if _fuses_relu_and_mean(v.kernel)]
    assert len(slow) == 2 and len({v.kernel for v in slow}) == 2
    assert timer.call_calls == 5 and set(timer.forms) == {"fused", "split", "aten"}   # one decision, not two
    assert [v.kept for v in slow] == ["split", "split"]
    planned = graph_cache.STATS["planned"]
    second = timer_of(FakeTimer(3.0, 2.0, 2.5))
    torch._dynamo.reset()
    fn = compiled(two_blocks)
    torch.testing.assert_close(fn(x, y, w), two_blocks(x, y, w))
    assert second.kernel_calls == 0 and second.call_calls == 0
    assert graph_cache.STATS["planned"] == planned and graph_cache.STATS["hits"] == 2
    launched = []
    registry.LAUNCH_HOOK = lambda name: launched.append(name) or contextlib.nullcontext()
    try:
        torch.testing.assert_close(fn(x, y, w), two_blocks(x, y, w))
    finally:
        registry.LAUNCH_HOOK = None
    assert launched and not any(_fuses_relu_and_mean(n) for n in launched)


def test_a_head_start_the_host_outlasts_grows_until_it_covers_the_call():
    runs = []

    def ahead(queue, cycles):   # the host takes as long to queue the call as 50M cycles of spin
        queue()
        return cycles >= 50_000_000

    cycles, covered = floor.behind_head_start(lambda: runs.append(1), floor.HEAD_START_CYCLES, ahead)
    assert (cycles, covered) == (4 * floor.HEAD_START_CYCLES, True) and len(runs) == 2   # timed again, longer
    assert floor.behind_head_start(lambda: runs.append(1), cycles, ahead) == (cycles, True) and len(runs) == 3


def test_a_call_no_head_start_covers_stops_growing_it(monkeypatch):
    runs = []
    never = lambda queue, cycles: queue() and False   # noqa: E731  (a call that synchronizes inside)
    cycles, covered = floor.behind_head_start(lambda: runs.append(1), floor.HEAD_START_CYCLES, never)
    assert (cycles, covered) == (floor.MAX_HEAD_START_CYCLES, False) and len(runs) == 3   # 20M, 80M, 320M
    monkeypatch.setattr(floor, "_queued_ahead", never)
    timer = floor.DeviceTimer()
    timer._queue(lambda: runs.append(1))
    timer._queue(lambda: runs.append(1))   # no longer grown: each later call is timed once
    assert len(runs) == 3 + 3 + 1 and (timer.cycles, timer.grow) == (floor.HEAD_START_CYCLES, False)


class PeakTimer(FakeTimer):
    """FakeTimer in a process with `allocated` bytes allocated as the call begins and a peak so far placed
    `over` bytes (of the slack's reach) above them and the slow kernel's operands."""

    def __init__(self, allocated, over, *times):
        super().__init__(*times)
        self.allocated, self.over, self.operands = allocated, over, None

    def memory(self, graph):
        [self.operands] = [c.bytes for c in graph.kernel_choices if _fuses_relu_and_mean(c.name)]
        return (self.allocated + self.operands + self.over) / (1 + floor.MEMORY_SLACK), self.allocated


def test_an_alternative_whose_call_would_pass_the_peak_so_far_is_not_tried(timer_of, monkeypatch, tmp_path):
    """[8, 64] fp32: split stores the relu's product (one value, 2 KiB); ATen also holds the relu's value while
    the product is made (two at once). With the peak so far reached by 1.5 values over what is allocated and the
    kernel's operands (the slack included), the split is tried and ATen is not; explain says why. Three values'
    headroom admits both."""
    x, w = torch.randn(8, 64), torch.randn(64)
    value = x.numel() * x.element_size()
    timer = timer_of(PeakTimer(10 * 2**20, 1.5 * value, 3.0, 2.0, 1.0))
    torch.testing.assert_close(_run(x, w), norm_block(x, w))
    [slow] = [v for v in floor.DECISIONS if _fuses_relu_and_mean(v.kernel)]
    assert "split" in slow.tried and "aten" not in slow.tried and slow.kept == "split"
    peak = (10 * 2**20 + timer.operands + 1.5 * value) / (1 + floor.MEMORY_SLACK)
    assert slow.untried == {"aten": (10 * 2**20 + timer.operands + 2 * value, peak)}
    assert "aten" not in timer.forms
    assert "aten not tried: its call would hold 10 MiB at the kernel, over 1.1x the 9 MiB peak so far" in str(slow)
    floor.DECISIONS.clear()
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path / "more-headroom"))   # no verdict cached
    timer_of(PeakTimer(10 * 2**20, 3 * value, 3.0, 2.0, 1.0))
    torch.testing.assert_close(_run(x, w), norm_block(x, w))
    [slow] = [v for v in floor.DECISIONS if _fuses_relu_and_mean(v.kernel)]
    assert {"split", "aten"} <= set(slow.tried) and slow.kept == "aten" and not slow.untried


def test_a_kernels_aten_intermediates_are_counted_while_alive():
    """relu -> mul -> sum -> add: relu's and mul's values are alive together, then mul's with the sum's."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: (torch.relu(x) * 2).sum(-1, keepdim=True) + x)(torch.randn(16, 32))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [floor.value_bytes(n) for n in nodes] == [2048, 2048, 64, 2048]
    assert floor._held_at_once(nodes, set(nodes[:3])) == 4096
    assert floor._held_at_once(nodes[1:], set(nodes[1:3])) == 2048 + 64
    assert floor._held_at_once(nodes, {nodes[1]}) == 2048
