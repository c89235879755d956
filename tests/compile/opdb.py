"""The whole-op_db sweep: every OpInfo of torch's op_db through brrr's pipeline, judged against eager.

test_opdb.py runs it as one test per (OpInfo, dtype[, backward]); benchmarks/coverage.py tabulates what it
records. A case takes the first `SAMPLES` sample inputs of its dtype, each as given and as a non-contiguous copy
(a "variant"; the cut, `FULL` below, leaves some out), and runs them through AOTAutograd with brrr's decomposition table, partitioner and
`compile_graph`: the pipeline `backend="brrr"` runs behind Dynamo, without Dynamo's bytecode capture (3x cheaper
per sample; Dynamo adds nothing to one op call). The variants of a case are traced as one function, each under
its own FX annotation, so one compile serves them all and every fallback still names its variant. A variant
that fails in company (brrr raised, a wrong value, AOTAutograd cannot trace the group) is run alone to tell
whose it is. A variant AOTAutograd cannot trace alone (data-dependent shapes, `.item()`) goes through
`torch.compile(backend=brrr)` as a user's would: Dynamo graph-breaks around it.

Each variant's outcome is one of
    kernels     every op of every graph ran in brrr's kernels (or as a designed Extern: matmul, conv, attention)
    partial     the graph ran, some ops as ATen: `fallbacks` lists each with its reason
    graph_aten  a whole graph (or the whole sample) ran as ATen: `detail` says why
    wrong       the result differs from eager's on the same inputs (opdb_judge.py)
    crash       brrr raised (BRRR_DEBUG=1: every brrr-internal error raises instead of falling back)
"""

import contextlib
import functools
import json
import logging
import os
import time
import traceback
from dataclasses import asdict, dataclass, field

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo

from brrr.compile import backend
from tests.compile import opdb_judge as judge

SAMPLES = 2
LAYOUTS = ("contiguous", "noncontiguous")
FORWARD_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool)
BACKWARD_DTYPES = (torch.float32,)
# The test suite (CI) runs a cut; coverage.py and BRRR_OPDB_CUT=0 run the whole matrix. The cut: the
# non-contiguous copy only in float32, where strides are what is tested (the index math does not depend on the
# dtype); float16 only for ops without bfloat16 (both half types load as fp32, compute in fp32 and differ only
# in the rounding on store; bfloat16's rounding is the one spelled out under the interpreter). On two cores the
# whole matrix took 30 of the suite's 70 worker-minutes (38 minutes wall); with the cut the suite took 33.
FULL = os.environ.get("BRRR_OPDB_CUT", "1") == "0"
OUTCOMES = ("kernels", "partial", "graph_aten", "wrong", "crash")
# output values undefined by contract: judged by shape, dtype and strides (torch's own tests call them
# "not comparable")
UNDEFINED = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"})
VARIANT = "opdb_variant"   # the FX annotation that names a node's variant


def op_key(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


OPS = {}
for _op in op_db:
    OPS.setdefault(op_key(_op), _op)


def cases():
    """(op key, dtype name, backward) for every OpInfo and every dtype of the sweep it supports on CPU."""
    out = []
    for key, op in OPS.items():
        supported = op.supported_dtypes("cpu")
        forward = [d for d in FORWARD_DTYPES if d in supported]
        if not FULL and torch.bfloat16 in forward and torch.float16 in forward:
            forward.remove(torch.float16)
        out += [(key, judge.dtype_name(d), False) for d in forward]
        if op.supports_autograd:
            grad = op.supported_backward_dtypes("cpu")
            out += [(key, judge.dtype_name(d), True) for d in BACKWARD_DTYPES if d in grad and d in supported]
    return out


@dataclass
class Outcome:
    op: str
    dtype: str
    backward: bool
    sample: int
    layout: str                   # contiguous | noncontiguous
    family: str = ""
    outcome: str = ""
    detail: str = ""
    check: str = "values"         # values | statistics | metadata
    fallbacks: list = field(default_factory=list)   # [aten op, reason]
    seconds: float = 0.0          # CPU time of its share of the case (compile, kernels in the interpreter, judging)


# ------------------------------------------------------------------------------------- observing brrr


@dataclass
class GraphRecord:
    kind: str
    gm: object
    plan: object = None


class Observed:
    """What brrr's backend did with the graphs of one call: the graphs, their plans, a crash."""

    def __init__(self):
        self.graphs, self.crash = [], None


@contextlib.contextmanager
def observing():
    """Record every graph `compile_graph` sees and the plan it builds (plans are what explain reads)."""
    rec = Observed()
    compile_graph, plan_graph = backend.compile_graph, backend.plan_graph

    def observed_plan(gm, *args, **kwargs):
        plan = plan_graph(gm, *args, **kwargs)
        if rec.graphs and rec.graphs[-1].gm is gm:
            rec.graphs[-1].plan = plan
        return plan

    def observed_compile(gm, example_inputs, *args, graph_kind="forward", **kwargs):
        rec.graphs.append(GraphRecord(graph_kind, gm))
        try:
            return compile_graph(gm, example_inputs, *args, graph_kind=graph_kind, **kwargs)
        except Exception as e:
            rec.crash = rec.crash or f"compiling the {graph_kind} graph: {_exc(e)}"
            raise

    backend.compile_graph, backend.plan_graph = observed_compile, observed_plan
    try:
        yield rec
    finally:
        backend.compile_graph, backend.plan_graph = compile_graph, plan_graph


def _exc(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _raised_in_brrr(e):
    """Whether brrr's compiler (not torch's tracing) raised `e`: a frame of brrr/compile or of generated code."""
    for frame, _ in traceback.walk_tb(e.__traceback__):
        path = frame.f_code.co_filename
        if "brrr/compile/" in path or path.startswith("<brrr call"):
            return True
    return False


def _aot_compile(fn):
    from torch._functorch.aot_autograd import aot_function

    from brrr.compile.passes.partition import partition_fn

    def compiler(kind):
        return lambda gm, inputs: backend.compile_graph(gm, inputs, graph_kind=kind)
    return aot_function(fn, fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                        inference_compiler=compiler("inference"), decompositions=backend.decomposition_table(),
                        partition_fn=partition_fn())


def _dynamo_compile(fn):
    torch._dynamo.reset()
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)   # graph breaks are expected here: no warnings
    return torch.compile(fn, backend=backend.brrr_backend, dynamic=False)


# ------------------------------------------------------------------------------------- calls


class Call:
    """One sample as a function of its tensors: fn(*tensors) = op(*args, **kwargs)."""

    def __init__(self, op, sample, backward):
        self.op, self.backward = op, backward
        args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
        flat, self.spec = pytree.tree_flatten((args, kwargs))
        self.flat = flat
        self.where = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
        self.tensors = [flat[i].detach() for i in self.where]
        self.process = sample.output_process_fn_grad if backward else (lambda out: out)

    def fn(self, *tensors):
        flat = list(self.flat)
        for i, t in zip(self.where, tensors):
            flat[i] = t
        args, kwargs = pytree.tree_unflatten(flat, self.spec)
        return self.op(*args, **kwargs)

    def inputs(self, dtype=None):
        """Fresh copies of the sample's tensors (same strides; leaves that require grad where the sample's do)."""
        out = []
        for i, t in zip(self.where, self.tensors):
            c = _copy_strided(t)
            if dtype is not None and c.is_floating_point():
                c = c.to(dtype)
            if self.backward and self.flat[i].requires_grad:
                c.requires_grad_(True)
            out.append(c)
        return out

    def run(self, fn, inputs, grad_outputs=None):
        """The result of fn(*inputs): outputs, gradients of the inputs that require grad, the inputs after it."""
        return Group([self]).finish([fn(*inputs)], [inputs], [grad_outputs])[0]


class Group:
    """The variants of a case as one function of all their tensors, each call under its own FX annotation."""

    def __init__(self, calls):
        self.calls = calls
        self.sizes = [len(c.where) for c in calls]

    def fn(self, *tensors):
        out, i = [], 0
        for k, (call, n) in enumerate(zip(self.calls, self.sizes)):
            with fx_traceback.annotate({VARIANT: k}):
                out.append(call.fn(*tensors[i:i + n]))
            i += n
        return tuple(out)

    def inputs(self):
        return [c.inputs() for c in self.calls]

    def run(self, fn, grad_outputs=None):
        """Per call, the result of running `fn` (eager: Group.fn, or its compiled form) on fresh inputs."""
        inputs = self.inputs()
        outs = fn(*[t for ts in inputs for t in ts])
        return self.finish(outs, inputs, grad_outputs or [None] * len(self.calls))

    def finish(self, outs, inputs, grad_outputs):
        if not self.calls[0].backward:
            return [{"out": o, "inputs": ts} for o, ts in zip(outs, inputs)]
        outs = [c.process(o) for c, o in zip(self.calls, outs)]
        diffs = [[o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
                 for out in outs]
        grad_outputs = [g if g is not None else [_grad_output(o) for o in d] for g, d in zip(grad_outputs, diffs)]
        all_diff = [o for d in diffs for o in d]
        all_grad = [g.to(o.dtype) for d, gs in zip(diffs, grad_outputs) for o, g in zip(d, gs)]
        leaves = [t for ts in inputs for t in ts if t.requires_grad]
        grads = torch.autograd.grad(all_diff, leaves, all_grad, allow_unused=True) if all_diff and leaves else \
            [None] * len(leaves)
        results, i = [], 0
        for out, ts, gs, diff in zip(outs, inputs, grad_outputs, diffs):
            n = sum(t.requires_grad for t in ts)
            own = list(grads[i:i + n]) if diff else []
            i += n
            results.append({"out": pytree.tree_map(_detach, out), "grads": own, "grad_outputs": gs,
                            "inputs": [t.detach() for t in ts]})
        return results


def _detach(x):
    return x.detach() if isinstance(x, torch.Tensor) else x


def _grad_output(o):
    g = torch.Generator().manual_seed(o.numel())
    dtype = o.dtype if o.is_floating_point() or o.is_complex() else torch.float32
    return torch.randn(o.shape, generator=g, dtype=torch.float64).to(dtype)


def _copy_strided(t):
    """A copy of `t` with the same strides and storage offset (a non-contiguous sample stays one)."""
    t = t.detach()
    if t.layout != torch.strided:
        return t.clone()
    storage = t.untyped_storage()
    base = torch.empty(0, dtype=t.dtype, device=t.device)
    if t.element_size():
        base.set_(storage.clone(), 0, (storage.nbytes() // t.element_size(),), (1,))
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def _seeded(seed, fn, *args):
    # the CPU generator alone: torch.manual_seed also formats a stack trace per lazy device (~1 ms in pytest)
    torch.random.default_generator.manual_seed(seed)
    return fn(*args)


@contextlib.contextmanager
def unpinned_random_ops():
    """op_db runs its random ops under wrapper_set_seed (seed 42 inside every call, so torch's own tests can
    compare them); the sweep calls them as a user does, each call drawing new numbers."""
    import torch.testing._internal.common_methods_invocations as cmi
    pinned = cmi.wrapper_set_seed
    cmi.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)
    try:
        yield
    finally:
        cmi.wrapper_set_seed = pinned


# ------------------------------------------------------------------------------------- variants


@dataclass(eq=False)
class Variant:
    """One sample in one layout, with eager's result and, once run, its outcome."""
    outcome: Outcome
    call: Call
    eager: dict
    random: bool
    undefined: bool

    @property
    def grad_outputs(self):
        return self.eager.get("grad_outputs")

    def reference64(self, dtype):
        """eager in float64 on the same values, or None (not a float case, or the op has no float64)."""
        if not (dtype.is_floating_point and dtype != torch.float64):
            return None
        try:
            with torch.random.fork_rng():
                torch.random.default_generator.manual_seed(1)
                gs = [g.double() for g in self.grad_outputs] if self.grad_outputs else None
                return self.call.run(self.call.fn, self.call.inputs(torch.float64), gs)
        except Exception:
            return None


def prepare(op, key, dtype, backward, samples, family):
    """The case's variants eager can run, each with eager's result: twice with different seeds, so outputs
    that differ are random."""
    out = []
    layouts = LAYOUTS if FULL or dtype == torch.float32 else LAYOUTS[:1]
    for i, sample in enumerate(samples):
        for layout in layouts:
            try:
                s = sample.noncontiguous() if layout == "noncontiguous" else sample
            except Exception:   # no strided variant (sparse inputs): nothing to run
                continue
            call = Call(op, s, backward)
            try:
                eager = _seeded(1, call.run, call.fn, call.inputs())
            except Exception:   # eager rejects it (an input that must be contiguous): no sample
                continue
            again = _seeded(2, call.run, call.fn, call.inputs(), eager.get("grad_outputs"))
            undefined = op.name in UNDEFINED
            random = not undefined and (family == "random" or not judge.same(eager, again))
            out.append(Variant(Outcome(key, judge.dtype_name(dtype), backward, i, layout, family), call, eager,
                               random, undefined))
    return out


def run_variants(variants, dtype, alone=False):
    """Compile and run `variants` as one group, judging each; a variant that fails in company runs alone."""
    group = Group([v.call for v in variants])
    how, trace_error = "aot", ""
    with observing() as rec:
        try:
            with fx_traceback.preserve_node_meta():
                compiled = _aot_compile(group.fn)
                got = _seeded(1, group.run, compiled, [v.grad_outputs for v in variants])
        except Exception as e:
            in_brrr = bool(rec.crash) or _raised_in_brrr(e)
            if len(variants) > 1:
                for v in variants:
                    run_variants([v], dtype, alone=True)
                if in_brrr and not any(v.outcome.outcome == "crash" for v in variants):
                    for v in variants:
                        _set(v, "crash", "only when compiled with the case's other samples: "
                                         f"{rec.crash or _exc(e)}")
                return
            if in_brrr:
                _set(variants[0], "crash", rec.crash or f"running: {_exc(e)}")
                return
            how, trace_error = "dynamo", _exc(e)
            rec.graphs.clear()
            try:
                compiled = _dynamo_compile(group.fn)
                got = _seeded(1, group.run, compiled, [v.grad_outputs for v in variants])
            except Exception as e2:
                where = "brrr" if rec.crash or _raised_in_brrr(e2) else "torch.compile(backend=brrr)"
                _set(variants[0], "crash", rec.crash or f"{where} raised {_exc(e2)} (AOTAutograd alone: {trace_error})")
                return
        verdicts = judge_all(variants, group, compiled, got, dtype)
        if rec.crash:
            verdicts = [rec.crash] * len(variants)
    failed = [v for v, why in zip(variants, verdicts) if why]
    if failed and len(variants) > 1:
        for v in failed:
            run_variants([v], dtype, alone=True)
            if v.outcome.outcome not in ("wrong", "crash"):
                _set(v, "wrong", f"only when compiled with the case's other samples: {verdicts[variants.index(v)]}")
    elif failed:
        _set(variants[0], "crash" if rec.crash else "wrong", verdicts[0], check=_check(variants[0]))
    for k, v in enumerate(variants):
        if not verdicts[k]:
            outcome, detail, fallbacks = classify(rec, how, trace_error, None if alone else k)
            _set(v, outcome, detail, fallbacks, _check(v))


def _set(v, outcome, detail, fallbacks=(), check=None):
    o = v.outcome
    o.outcome, o.detail, o.fallbacks, o.check = outcome, detail, list(fallbacks), check or _check(v)


def _check(v):
    return "metadata" if v.undefined else "statistics" if v.random else "values"


def judge_all(variants, group, compiled, got, dtype):
    """Per variant, None when brrr's result agrees with eager's, else what differs."""
    verdicts = []
    draws = _brrr_draws(group, compiled, variants) if any(v.random for v in variants) else None
    for k, v in enumerate(variants):
        if v.undefined:
            verdicts.append(judge.compare_metadata(got[k], v.eager))
        elif v.random:
            verdicts.append(_judge_random(v, k, draws, dtype))
        else:
            verdicts.append(judge.compare(got[k], v.eager, functools.cache(lambda v=v: v.reference64(dtype))))
    return verdicts


def _brrr_draws(group, compiled, variants):
    """brrr's random results per variant: two with one seed (they must agree), then BRRR_DRAWS - 1 more."""
    gos = [v.grad_outputs for v in variants]
    runs = [_seeded(11, group.run, compiled, gos), _seeded(11, group.run, compiled, gos)]
    runs += [_seeded(200 + i, group.run, compiled, gos) for i in range(judge.BRRR_DRAWS - 1)]
    return [[run[k] for run in runs] for k in range(len(variants))]


def _judge_random(v, k, draws, dtype):
    """The same seed gives the same numbers twice, and the numbers come from eager's distribution."""
    once, twice, *more = draws[k]
    if not judge.same(once, twice):
        return "the same seed gave different numbers"
    why = judge.compare_metadata(once, v.eager, strides=False)
    if why:
        return why
    call = v.call
    eager = [judge.numbers(_seeded(100 + i, call.run, call.fn, call.inputs(), v.grad_outputs))
             for i in range(judge.REFERENCE_DRAWS + judge.HELD_OUT_DRAWS)]
    mine = [judge.numbers(r) for r in [once] + more]
    for j in range(len(eager[0])):
        e = torch.stack([d[j] for d in eager]).double()
        b = torch.stack([d[j] for d in mine]).double()
        why = judge.same_distribution(b, e, judge.real_dtype(dtype))
        if why:
            return f"random value {j}: {why}"
    return None


def classify(rec, how, trace_error, variant):
    """(outcome, detail, fallbacks) of variant number `variant` (None: the only one) from the graphs brrr saw
    and the plans it built."""
    if not rec.graphs:
        why = "Dynamo captured no graph" if how == "dynamo" else "no graph"
        return "graph_aten", f"{why} (AOTAutograd cannot trace it: {trace_error})" if trace_error else why, []
    whole, fallbacks = [], []
    for g in rec.graphs:
        if g.plan is None:
            ok, reason = backend.can_run_kernels(g.gm)
            whole.append(f"{g.kind}: {reason or 'not planned'}")
            continue
        for fx, reason, *_ in g.plan.lowering.fallbacks:
            owner = fx.meta.get("custom", {}).get(VARIANT)
            entry = [f"aten.{getattr(fx.target, '__name__', fx.target)}", reason]
            if (variant is None or owner is None or owner == variant) and entry not in fallbacks:
                fallbacks.append(entry)
    note = f" (Dynamo graph break: {trace_error})" if how == "dynamo" else ""
    if whole:
        return "graph_aten", "; ".join(whole) + note, fallbacks
    if fallbacks:
        return "partial", "; ".join(f"{o}: {r}" for o, r in fallbacks) + note, fallbacks
    if how == "dynamo":   # parts of the op ran eagerly between Dynamo's graphs
        return "partial", f"Dynamo graph break: {trace_error}", [["graph break", trace_error]]
    return "kernels", "", []


# ------------------------------------------------------------------------------------- op families


FACTORY_ATEN = ("empty", "full", "zeros", "ones", "fill", "new_", "scalar_tensor", "arange", "eye", "linspace",
                "logspace", "zero_", "lift_fresh")
LAPACK_ATEN = frozenset({"cholesky", "cholesky_solve", "cholesky_inverse", "geqrf", "ormqr", "triangular_solve",
                         "lu_unpack", "_lu_with_info", "svd", "_svd_helper", "qr", "det", "slogdet", "logdet",
                         "lstsq", "inverse", "matrix_exp", "linalg_householder_product", "orgqr"})


def family_of(op, calls):
    """The op's family, from torch's own metadata: the OpInfo class and the tags of the ATen ops eager runs
    for the case's samples."""
    from brrr.cost.ops import op_class
    ran = [f for call in calls for f in _eager_aten_ops(call)]
    names = [str(f.overloadpacket.__name__) for f in ran]
    if any(torch.Tag.nondeterministic_seeded in f.tags for f in ran):
        return "random"
    if op.is_factory_function or op.name in UNDEFINED or (names and all(n.startswith(FACTORY_ATEN) for n in names)):
        return "factory"
    if isinstance(op, (UnaryUfuncInfo, BinaryUfuncInfo)):
        return "pointwise"
    if isinstance(op, ReductionOpInfo):
        return "reduction"
    if any(n.startswith("_fft") for n in names):
        return "fft"
    if any(n.startswith(("linalg_", "_linalg_")) or n in LAPACK_ATEN for n in names):
        return "linalg"
    classes = {op_class(f) for f in ran}
    if "contraction" in classes:
        return "contraction"
    if "normalization" in classes:
        return "reduction"
    work = [f for f in ran if not f.is_view]
    if not work:   # views only (or nothing: the op returns its input)
        return "view"
    if all(torch.Tag.pointwise in f.tags or f.overloadpacket.__name__ in ("_to_copy", "clone", "copy_")
           for f in work):
        return "pointwise"
    return "other"


def _eager_aten_ops(call):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if isinstance(func, torch._ops.OpOverload):
                self.ops.append(func)
            return func(*args, **(kwargs or {}))
    mode, inputs = Record(), call.inputs()
    try:
        with mode, torch.no_grad():
            call.fn(*inputs)
    except Exception:
        pass
    return mode.ops


# ------------------------------------------------------------------------------------- a case


def samples_of(op, dtype, backward):
    torch.random.default_generator.manual_seed(0)
    out = []
    for s in op.sample_inputs("cpu", dtype, requires_grad=backward):
        out.append(s)
        if len(out) == SAMPLES:
            break
    return out


def run_case(key, dtype_str, backward):
    """Every variant of one (OpInfo, dtype, backward) case: a list of Outcome."""
    op, dtype = OPS[key], getattr(torch, dtype_str)
    start = time.process_time()
    try:
        samples = samples_of(op, dtype, backward)
    except Exception as e:
        return [Outcome(key, dtype_str, backward, 0, "contiguous", outcome="graph_aten",
                        detail=f"no sample inputs: {_exc(e)}")]
    with unpinned_random_ops():
        family = family_of(op, [Call(op, s, backward) for s in samples])
        variants = prepare(op, key, dtype, backward, samples, family)
        if variants:
            try:
                run_variants(variants, dtype)
            except Exception as e:   # the sweep itself failed: no verdict on brrr, so it fails the test
                for v in variants:
                    if not v.outcome.outcome:
                        _set(v, "crash", f"sweep: {_exc(e)}")
    seconds = round((time.process_time() - start) / max(len(variants), 1), 4)
    for v in variants:
        v.outcome.seconds = seconds
    return [v.outcome for v in variants]


def record(outcomes):
    """Append outcomes as JSON lines to $BRRR_OPDB_RECORD.<worker>.jsonl when that variable is set."""
    prefix = os.environ.get("BRRR_OPDB_RECORD")
    if not prefix:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{prefix}.{worker}.jsonl", "a") as f:
        for o in outcomes:
            f.write(json.dumps(asdict(o)) + "\n")
