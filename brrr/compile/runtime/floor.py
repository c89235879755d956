"""The floor under brrr's kernels (codegen -> **runtime**): every generated kernel is timed on its graph's first
call and compared with its roofline; one far below it is replaced by whatever measured faster.

Why. Every loss found outside the zoo traced to a decision brrr made from its cost model and never checked: a
batch-norm backward fused with ReLU's backward ran at 2% of its roofline (110.7 ms, where cuDNN's took 2.4 ms),
an average pool fused into a group norm's statistics took 11 ms where the whole network takes 1.7 ms under
Inductor. brrr owns the roofline and a timer, so it checks each kernel instead of trusting the model.

How, on the first call of a graph on a GPU (CompiledGraph._first_call runs `settle` after the checking call):
- KERNEL_SAMPLES calls with CUDA events around every kernel launch give each kernel's device time (their outputs
  are dropped at once and the RNG state is restored: the user's random stream is eager's). Its roofline time is
  bytes at the measured copy bandwidth and FLOPs at the measured FP32 rate (brrr.cost.device's ceilings).
- A kernel is slow below THRESHOLD of its roofline, where at least AT_STAKE seconds a call could be won.
- For the slow kernels, the most at stake first (MAX_SLOW sources; the kernels of one source, a repeated layer's,
  are one decision), the alternatives: the kernel launched with half and with twice its warps, then three forms
  compiled through the backend's `alternative` (backend.compile_graph): its reductions split across WIDE_FACTOR
  times the programs (lowering.core.split_reduction; split where the plan kept them whole), the plan split at
  the kernel's fusions (its later roots start kernels of their own, and the values its reductions read are
  stored), and the kernel's ops as ATen calls. The graph as it stands and each alternative are timed as
  whole calls (CUDA events, the median of CALL_SAMPLES, after a checking call); an alternative is kept when it
  saves MARGIN. Choices accumulate, kernel by kernel.
- Memory binds as time does: the split and ATen forms store values the fused kernel keeps in registers (the
  split's stored values; the ATen ops' intermediates, alive from their op to their last use). At the kernel,
  such a form's call holds what was allocated when the call began, the kernel's operands and those values; one
  where that passes the process's peak so far by over MEMORY_SLACK is not tried, as its timing call would set the
  run's peak. OPT-125m's loss backward as ATen materialized [8192, 50272] logits-sized tensors: its first call
  peaked at 8634 MiB against a steady step of 3614. A bound on the extra bytes alone, against the peak, kept small
  inference graphs from the split that saved them 27% (benchmarks/NOTES.md). Kept forms' extras are transient,
  each within its kernel's span, so they do not add up.
- Every timed call is queued behind a GPU spin that outlasts the host's queueing (`behind_head_start`), so
  kernels and whole calls read the device's time. A host-bound graph replays, and a replay leaves the device's
  time alone: timed as the host queued them, DenseNet121's amp backward read 23.7 ms a call fused, 29.0 split
  and 49.8 as ATen, where its whole training step's kernels take 13.9 ms, and a kernel read at 2% of its
  roofline stayed fused (benchmarks/NOTES.md).
- The verdicts are cached on disk (cache.folder("floor")), one file per graph, keyed by the sources of its
  kernels (which hold their sizes), the device and the versions: a second compile, in any process, applies
  them and times nothing.
- Every verdict is logged (`DECISIONS`); `brrr explain` lists them. BRRR_FLOOR=0 turns the floor off.

`TIMER`, where set (tests), replaces the device timer: kernel times, call times and rooflines come from it, and
the floor then runs on any device.
"""

import hashlib
import json
import os
import re
import statistics
from dataclasses import dataclass, field

import torch

from brrr.compile.cache import folder, write_atomic
from brrr.compile.fallbacks import debugging, is_out_of_memory, recover
from brrr.compile.ir import sizes
from brrr.compile.runtime import handed_over
from brrr.compile.runtime.launch import warm_all

THRESHOLD = 0.3        # of its roofline below which a kernel is slow
AT_STAKE = 50e-6       # seconds a call must stand to win before a slow kernel is worth alternatives
MARGIN = 0.97          # an alternative must save 3%: less is within the timer's noise
MAX_SLOW = 3           # slow kernels given alternatives per graph (each alternative is a compile)
KERNEL_SAMPLES = 2     # instrumented calls; each kernel keeps its least time
CALL_SAMPLES = 5       # timed whole calls per candidate, after one checking call
HEAD_START_CYCLES = 20_000_000   # ~10 ms of GPU clock: the first head start, grown while the host outlasts it
MAX_HEAD_START_CYCLES = 16 * HEAD_START_CYCLES   # ~160 ms: a call the host queues slower is timed as it queues
MEMORY_SLACK = 0.1     # how far over the peak allocated so far an alternative's call may be expected to reach
VERSION = 8            # of the verdicts' format and rules: a change makes old verdicts miss

TIMER = None           # a stand-in for DeviceTimer (tests)
DECISIONS = []         # Verdict records, process-wide, in the order they were made


@dataclass
class KernelChoice:
    """One generated kernel as the floor sees it: what it costs and what replaces it."""
    name: str
    digest: str            # of its source with its name taken out: the same kernel in every process
    flops: int
    bytes: int
    fx_nodes: tuple        # the ops it computes: run as ATen, the alternative "aten"
    split_at: tuple        # the FX nodes whose values start kernels of their own, the alternative "split"
    reductions: tuple = ()   # the FX nodes of its reductions: split across more programs, the alternative "wider"
    split_bytes: int = 0     # what "split" stores that the kernel does not: its split points' values
    aten_bytes: int = 0      # the most bytes "aten"'s intermediates (not the kernel's outputs) hold at once


@dataclass
class Verdict:
    graph: str
    kernel: str
    measured_s: float
    roofline_s: float
    tried: dict = field(default_factory=dict)   # way ("fused", "wider", "split", ...) -> seconds of a whole call
    kept: str = "fused"
    untried: dict = field(default_factory=dict)   # way -> (bytes its call would hold at the kernel, the peak so far)

    @property
    def fraction(self):
        return self.roofline_s / self.measured_s if self.measured_s else 1.0

    def __str__(self):
        head = (f"{self.graph} graph: {self.kernel} {self.measured_s * 1e6:.0f} us, roofline "
                f"{self.roofline_s * 1e6:.0f} us ({self.fraction:.0%})")
        if not self.tried:
            return head
        tried = ", ".join(f"{way} {s * 1e6:.0f} us" for way, s in self.tried.items())
        untried = "".join(f"; {way} not tried: its call would hold {held / 2**20:.0f} MiB at the kernel, over "
                          f"{1 + MEMORY_SLACK:.1f}x the {peak / 2**20:.0f} MiB peak so far"
                          for way, (held, peak) in self.untried.items())
        return f"{head}; whole calls: {tried}; kept {self.kept}{untried}"

    def to_json(self):
        return {"kernel": self.kernel, "measured_s": self.measured_s, "roofline_s": self.roofline_s,
                "tried": self.tried, "kept": self.kept, "untried": self.untried}


def log(verdict):
    DECISIONS.append(verdict)
    del DECISIONS[:-1000]
    return verdict


def describe(plan, kernels, fx_nodes_of):
    """KernelChoice per generated kernel of `plan` (`kernels`: Kernel step -> KernelSource); `fx_nodes_of(step,
    source)`: the FX nodes a kernel computes."""
    out = []
    for step, src in kernels.items():
        work = getattr(src, "work", None)
        if work is None or not getattr(step, "roots", None):
            continue
        nodes = fx_nodes_of(step, src)
        split_at = _split_points(step, nodes)
        inside = set(nodes)
        outputs = {fx for fx in nodes if set(fx.users) - inside}   # stored by the kernel too
        out.append(KernelChoice(src.name, source_digest(src.source, src.function), work.flops, work.bytes, nodes,
                                split_at, _reductions(step), _held_at_once(nodes, set(split_at) - outputs),
                                _held_at_once(nodes, inside - outputs)))
    return out


def value_bytes(fx):
    """Bytes an FX node's value allocates at the sizes the graph was captured at: none for a view."""
    if getattr(fx.target, "is_view", False):
        return 0
    vals = fx.meta.get("val")
    total = 0
    for v in vals if isinstance(vals, (tuple, list)) else (vals,):
        if isinstance(v, torch.Tensor):
            total += sizes.hint(v.numel()) * v.element_size()
    return total


def _held_at_once(nodes, stored):
    """The most bytes the `stored` values among `nodes` (a kernel's ops, run in graph order) hold at once, each
    alive from its op to its last use among `nodes`: what a form storing them needs beyond the kernel's outputs."""
    nodes = [fx for fx in nodes if fx.graph is not None]
    position = {fx: i for i, fx in enumerate(nodes[0].graph.nodes)} if nodes else {}
    nodes.sort(key=position.get)
    inside = set(nodes)
    last = {fx: max((position[u] for u in fx.users if u in inside), default=position[fx]) for fx in nodes}
    alive, held, peak = {}, 0, 0
    for fx in nodes:
        if fx in stored:
            alive[fx] = value_bytes(fx)
            held += alive[fx]
        peak = max(peak, held)
        for done in [a for a in alive if last[a] <= position[fx]]:
            held -= alive.pop(done)
    return peak


def _reductions(step):
    """The FX nodes of a kernel's reductions that a wider split would change (lowering marks them `widenable`;
    a split one's partial sums and its final sum alike)."""
    return tuple(dict.fromkeys(r.fx for r in step.roots
                               if r.kind == "reduction" and r.fx is not None and r.meta.get("widenable")))


def _split_points(step, nodes):
    """Where a kernel's fusions joined: its roots after the first, and the values its reductions read (through
    views) computed inside it."""
    nodes = set(nodes)
    inside = {m.fx: m for m in getattr(step, "members", ()) if m.fx is not None and m.fx in nodes}
    points = [r.fx for r in step.roots[1:] if r.fx is not None]
    for root in step.roots:
        if root.kind != "reduction" or root.fx is None:
            continue
        todo, seen = list(root.fx.all_input_nodes), set()
        while todo:
            fx = todo.pop()
            if fx in seen or fx not in inside:
                continue
            seen.add(fx)
            if inside[fx].view_of is not None:
                todo.extend(fx.all_input_nodes)
            else:
                points.append(fx)
    return tuple(dict.fromkeys(points))


def source_digest(source, name):
    return hashlib.sha256(re.sub(rf"\b{re.escape(name)}\b", "KERNEL", source).encode()).hexdigest()[:24]


def enabled(graph):
    if os.environ.get("BRRR_FLOOR") == "0" or not getattr(graph, "kernel_choices", None) or \
            getattr(graph, "alternative", None) is None:
        return False
    if TIMER is not None:
        return True
    # inside the caller's own CUDA-graph capture nothing may synchronize: the kernels stay as planned
    return graph.device is not None and torch.cuda.is_available() and not torch.cuda.is_current_stream_capturing()


class DeviceTimer:
    """CUDA events on the current stream, every call queued behind a head start (`behind_head_start`): the
    device's time, not the host's; rooflines from the measured ceilings of the graph's device."""

    def __init__(self):
        self.cycles = HEAD_START_CYCLES   # the head start the graph's calls last needed
        self.grow = True   # False once no head start covered a call: one that synchronizes inside never is

    def _queue(self, queue):
        self.cycles, covered = behind_head_start(queue, self.cycles, grow=self.grow)
        if not covered:
            self.cycles, self.grow = HEAD_START_CYCLES, False

    def kernel_times(self, graph, args, names):
        call = graph.call
        glb, events = call.__globals__, {}
        originals = {n: glb[n] for n in names if glb.get(n) is not None}
        for name, launcher in originals.items():
            glb[name] = _Timed(launcher, events.setdefault(name, []))

        def queue():
            for pairs in events.values():
                pairs.clear()   # a call the host outlasted the head start for is timed again
            handed_over.prepared(call, args)()

        try:
            self._queue(queue)
        finally:
            glb.update(originals)
        return {name: sum(s.elapsed_time(e) for s, e in pairs) * 1e-3 for name, pairs in events.items()}

    def call_time(self, graph, args):
        call = graph.call
        handed_over.run(call, args)   # the checking call: a new kernel compiles and loads here
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def queue():
            timed = handed_over.prepared(call, args)
            start.record()
            timed()
            end.record()

        times = []
        for _ in range(CALL_SAMPLES):
            self._queue(queue)   # synchronized at its end: the events are read before the next sample records
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)

    def memory(self, graph):
        """(the peak allocated so far, allocated now) on the graph's device."""
        return torch.cuda.max_memory_allocated(graph.device), torch.cuda.memory_allocated(graph.device)

    def roofline(self, choice, device):
        from brrr.cost.device import get_ceilings

        return get_ceilings(torch.device("cuda", device)).roofline_time(choice.flops, choice.bytes)


def behind_head_start(queue, cycles, ahead=None, grow=True):
    """Run `queue` (which queues a call's GPU work) behind a GPU spin of `cycles`, the spin grown fourfold and
    the call run again (`grow`) until the host has queued all of it before the spin ends (at most
    MAX_HEAD_START_CYCLES); returns (the last cycles, whether they covered it). Covered, each kernel starts as
    its predecessor ends, so events time the device alone: an idle GPU counts the host's launch time into every
    event pair (tiny kernels read 20-70 us), and a whole call that the host queues slower than the GPU runs it
    reads the host's time, which a replay takes away. `ahead(queue, cycles)` runs it once and says whether the
    spin outlasted the queueing (`_queued_ahead`; a stand-in in tests)."""
    ahead = ahead or _queued_ahead
    while True:
        if ahead(queue, cycles):
            return cycles, True
        if not grow or cycles >= MAX_HEAD_START_CYCLES:
            return cycles, False
        cycles = min(4 * cycles, MAX_HEAD_START_CYCLES)


def _queued_ahead(queue, cycles):
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    spun = torch.cuda.Event()
    spun.record()
    queue()
    covered = not spun.query()   # the spin still running: the GPU has not waited on the host
    torch.cuda.synchronize()
    return covered


class _Timed:
    """A kernel's launcher with CUDA events around each launch."""

    def __init__(self, launcher, pairs):
        self.launcher, self.pairs = launcher, pairs

    def __call__(self, *args, **kwargs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self.launcher(*args, **kwargs)
        end.record()
        self.pairs.append((start, end))
        return out


class KeptRandom:
    """The RNG states of the CPU and the graph's GPU, restored on exit: measured calls draw nothing the user sees."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        self.cpu = torch.get_rng_state()
        self.gpu = torch.cuda.get_rng_state(self.device) if self.device is not None and torch.cuda.is_available() \
            else None

    def __exit__(self, *exc):
        torch.set_rng_state(self.cpu)
        if self.gpu is not None:
            torch.cuda.set_rng_state(self.gpu, self.device)


def cache_key(graph):
    import triton

    name = torch.cuda.get_device_name(graph.device) if graph.device is not None and torch.cuda.is_available() \
        else "cpu"
    parts = [str(VERSION), torch.__version__, triton.__version__, name, graph.kind,
             str(THRESHOLD), str(AT_STAKE)] + sorted(c.digest for c in graph.kernel_choices)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def _load(key):
    try:
        with open(os.path.join(folder("floor"), f"{key}.json")) as f:
            entry = json.load(f)
        return [Verdict(entry["graph"], v["kernel"], float(v["measured_s"]), float(v["roofline_s"]),
                        dict(v["tried"]), v["kept"], {w: tuple(x) for w, x in v.get("untried", {}).items()})
                for v in entry["verdicts"]], entry["digests"]
    except (OSError, ValueError, KeyError, TypeError):
        return None   # missing, truncated or corrupt: measured again


def _store(key, graph, verdicts, digests):
    entry = {"graph": graph.kind, "verdicts": [v.to_json() for v in verdicts], "digests": digests}
    write_atomic(os.path.join(folder("floor"), f"{key}.json"), json.dumps(entry, indent=1).encode())


def known(graph):
    """Whether `graph`'s verdicts are cached: settling it then runs nothing."""
    try:
        return _load(cache_key(graph)) is not None
    except Exception as e:
        if debugging():
            raise
        return False


def settle(graph, args):
    """Measure `graph` (a verified CompiledGraph) on `args` (a list, or handed_over.HandedOver inputs: a fresh
    copy each run) and keep its fastest form; True when it changed."""
    try:
        with KeptRandom(graph.device):
            return _settle(graph, args)
    except Exception as e:
        if debugging() or is_out_of_memory(e):
            raise
        recover(e, "the floor could not measure this graph's kernels", "keeping them as planned")
        return False


def _settle(graph, args):
    timer = TIMER or DeviceTimer()
    key = cache_key(graph)
    found = _load(key)
    if found is not None:
        verdicts, digests = found
        for v in verdicts:
            log(v)
        return _apply(graph, digests, verdicts)
    choices = {c.name: c for c in graph.kernel_choices}
    times = {}
    for _ in range(KERNEL_SAMPLES):
        for name, s in timer.kernel_times(graph, args, list(choices)).items():
            times[name] = min(s, times.get(name, s))
    verdicts, slow = [], []
    for name, s in times.items():
        c = choices[name]
        v = Verdict(graph.kind, name, s, timer.roofline(c, graph.device))
        verdicts.append(v)
        if v.fraction < THRESHOLD and s - v.roofline_s >= AT_STAKE:
            slow.append((s - v.roofline_s, v, c))
    slow.sort(key=lambda x: -x[0])
    digests = {}
    if slow:
        _try_alternatives(graph, args, timer, slow, digests)
    for v in verdicts:
        log(v)
    _store(key, graph, verdicts, digests)
    return bool(digests)


def _try_alternatives(graph, args, timer, slow, digests):
    """For each slow kernel in turn, on the graph's fastest form so far: its launch with half and twice the warps,
    then its reductions split wider, the plan split at its fusions and its ops as ATen calls (each kept by
    whole-call time, MARGIN). Kernels of
    one source (a repeated layer's) are one decision, taken for all of them: a cached verdict is applied by
    source (`_apply`), so the form timed here is the form a second compile builds.

    A source whose summed stake (its time above its roofline) is under what MARGIN asks an alternative to save
    gets none: no alternative can save more than that gap, so none could be kept, and each costs a compile (a
    re-plan of the whole graph for split and ATen)."""
    base = timer.call_time(graph, args)
    peak, allocated = timer.memory(graph) if hasattr(timer, "memory") else (None, 0)
    force, split, widen, warps, best = set(), set(), set(), {}, None
    for digest, stake, verdicts in _by_source(slow)[:MAX_SLOW]:
        if stake < (1 - MARGIN) * base:
            for v in verdicts:
                v.tried, v.kept = {"fused": base}, "fused"
            continue
        same = [c for c in graph.kernel_choices if c.digest == digest]
        fx_nodes = {fx for c in same for fx in c.fx_nodes}
        split_at = {fx for c in same for fx in c.split_at}
        reductions = {fx for c in same for fx in c.reductions}
        held = {"split": allocated + max(c.bytes + c.split_bytes for c in same),
                "aten": allocated + max(c.bytes + c.aten_bytes for c in same)}
        tried, kept, untried = {"fused": base}, "fused", {}
        current = best or graph
        names = _names_of(current, digest)
        glb = current.call.__globals__
        originals = {n: glb[n] for n in names if glb.get(n) is not None}
        variants = _variants(current, originals, _warp_choices(current, names[0] if names else None))
        for w, launchers in variants.items():
            glb.update(launchers)
            t = tried[f"{w} warps"] = timer.call_time(current, args)
            glb.update(originals)
            if t < MARGIN * base:
                base, kept, warps[digest] = t, f"{w} warps", w
        if digest in warps:
            glb.update(variants[warps[digest]])
        for way in ("wider", "split", "aten"):
            if (way == "split" and not split_at - split) or (way == "wider" and not reductions - widen):
                continue   # nothing to split, or no reduction to split wider: the same plan
            if way in held and peak is not None and held[way] > (1 + MEMORY_SLACK) * peak:
                untried[way] = (held[way], peak)
                continue
            f = force | fx_nodes if way == "aten" else force
            p = split | split_at if way == "split" else split
            w = widen | reductions if way == "wider" else widen
            alt = graph.alternative(tuple(f), tuple(p), tuple(w))
            if alt is None or alt.source == current.source:
                continue   # not built, or the same kernels (a split already at its widest)
            _apply_warps(alt, {d: n for d, n in warps.items() if d != digest})
            t = tried[way] = timer.call_time(alt, args)
            if t < MARGIN * base:
                base, best, kept = t, alt, way
                kept_choices = f, p, w
        if kept in ("wider", "split", "aten"):
            warps.pop(digest, None)
            force, split, widen = kept_choices
        if kept != "fused":
            digests[digest] = kept
        for v in verdicts:
            v.tried, v.kept, v.untried = dict(tried), kept, dict(untried)
    if best is not None:
        graph.adopt(tuple(force), tuple(split), tuple(widen))
        _adopt_form(graph, best)


def _by_source(slow):
    """[(digest, summed stake, verdicts)] of the slow kernels (stake, verdict, choice), one entry per source, the
    most summed stake first."""
    stakes, verdicts = {}, {}
    for stake, v, c in slow:
        stakes[c.digest] = stakes.get(c.digest, 0.0) + stake
        verdicts.setdefault(c.digest, []).append(v)
    return [(d, stakes[d], verdicts[d]) for d in sorted(stakes, key=lambda d: -stakes[d])]


def _names_of(form, digest):
    return [c.name for c in form.kernel_choices if c.digest == digest]


def _warp_choices(form, name):
    launcher = form.call.__globals__.get(name) if name is not None else None
    meta = getattr(launcher, "meta", None)
    if meta is None:
        return ()
    w = meta.get("num_warps", 4)
    return tuple(n for n in (w // 2, w * 2) if 1 <= n <= 16 and n != w)


def _variants(form, launchers, choices):
    """{warps: {name: Launcher}}: `launchers` (one function's) launched with each warp count of `choices`, each
    count's kernel compiled now, all at once, where the first launches would compile them one after another."""
    out = {w: {n: k.retuned(w) for n, k in launchers.items()} for w in choices}
    every = [k for v in out.values() for k in v.values()]
    warm_all(every, form.device, threads=len(out))
    return out


def _apply_warps(form, warps):
    """Launch the kernels of each source `warps` names (digest -> count) with that many warps from now on."""
    glb = form.call.__globals__
    for digest, n in warps.items():
        for name in _names_of(form, digest):
            if glb.get(name) is not None:
                glb[name] = glb[name].retuned(n)


def _apply(graph, digests, verdicts):
    """A cached verdict: build the kept form at once, timing nothing."""
    if not digests:
        return False
    force, split, widen, warps = set(), set(), set(), {}
    for c in graph.kernel_choices:
        way = digests.get(c.digest)
        if way == "aten":
            force |= set(c.fx_nodes)
        elif way == "split":
            split |= set(c.split_at)
        elif way == "wider":
            widen |= set(c.reductions)
        elif way is not None and way.endswith(" warps"):
            warps[c.digest] = int(way.split()[0])
    form = graph
    if force or split or widen:
        form = graph.alternative(tuple(force), tuple(split), tuple(widen))
        if form is None:
            return False
        graph.adopt(tuple(force), tuple(split), tuple(widen))
        _adopt_form(graph, form)
    _apply_warps(graph, warps)
    return True


def _adopt_form(graph, alt):
    graph.call, graph.source, graph.kernel_choices = alt.call, alt.source, alt.kernel_choices
