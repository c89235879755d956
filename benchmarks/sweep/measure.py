"""One sweep configuration under every backend, in one process, on the same weights and inputs.

For each backend, in order (eager first: the reference and the base of every ratio):
- the first call (a pass over every shape), compile included: the cold compile time for a compiled backend;
- correctness: each shape's outputs and gradients from the saved weights, against eager's and against a copy
  of the model in a higher precision (fp32 for bf16 and amp, float64 for fp32). A backend is wrong when its
  error against that copy is over 3x eager's own, floored at the judged precision's epsilon (the zoo's rule);
- the `do_bench` median of a call and the back-to-back time per call (`brrr.bench.timing`);
- peak memory as the user sees it: `torch.cuda.max_memory_allocated` from before the first call to the end
  of timing, nothing subtracted (the harness keeps its references on the host, and judging is left out), and
  the peak of one steady-state call; beside each, the allocator's reserved peak (`max_memory_reserved`), which
  also counts memory a backend hands out without the allocator counting it as allocated (Inductor's
  cudagraph trees build their replayed outputs over pool memory: their steady peak reads below the memory
  allocated before they ran, benchmarks/NOTES.md).

A call is one step: inference under `no_grad`, or a training step (forward, backward with fixed random
cotangents; under amp the forward runs in `torch.autocast(bfloat16)` and a fused AdamW step follows the
backward, outside the compiled model). Gradients are set to None before each step. Dynamo runs with its
defaults, as a user has them: no logging call skipped, no limit raised, errors not suppressed.
"""

import contextlib
import gc
import time

import torch

from brrr.bench import compare
from brrr.bench.backends import fresh_compile, stop_inductor_workers
from brrr.bench.runner import _reason
from brrr.bench.step import Step, differentiable_outputs, make_cotangents, to_dtype
from brrr.bench.timing import time_kernel, time_steady
from brrr.compile.runtime import trial_turns
from brrr.compile.runtime.replay_choice import TRIAL_CALLS
from brrr.cost.device import synchronize, time_once
from step_kernels import top_kernels

BACKENDS = ("eager", "brrr", "inductor", "inductor-reduce-overhead")
PEERS = ("inductor", "inductor-reduce-overhead")


class SweepStep(Step):
    """brrr.bench's Step in a precision: the forward under autocast for amp, then an optimizer step."""

    def __init__(self, fn, model, input_sets, train, cotangents, autocast=False, optimizer=None):
        super().__init__(fn, model, input_sets, train, cotangents[0] if cotangents else None)
        self.all_cotangents, self.autocast, self.optimizer = cotangents, autocast, optimizer

    def _context(self, inputs):
        if not self.autocast:
            return contextlib.nullcontext()
        device = next((x.device.type for x in inputs if isinstance(x, torch.Tensor)), "cpu")
        return torch.autocast(device, dtype=torch.bfloat16)

    def __call__(self):
        index = self.calls % len(self.input_sets)
        inputs = self.input_sets[index]
        self.calls += 1
        if not self.train:
            with torch.no_grad(), self._context(inputs):
                return self.fn(*inputs)
        for leaf in self.leaves:
            leaf.grad = None
        with self._context(inputs):
            out = self.fn(*inputs)
        torch.autograd.backward(differentiable_outputs(out), self.all_cotangents[index])
        if self.optimizer is not None:
            self.optimizer.step()
        return out

    def cycle(self):
        """One pass over every input set (one call when the shape never changes)."""
        for _ in range(len(self.input_sets)):
            self()

    def run_at(self, index):
        """One step on input set `index`: (outputs, grads), detached."""
        self.calls = index
        out = self()
        outputs = [t.detach() for t in compare.flatten_tensors(out)]
        return outputs, [None if leaf.grad is None else leaf.grad.detach() for leaf in self.leaves]


class Weights:
    """The model's parameters and buffers saved on the host, put back before every backend and every judged
    step (a training step moves batch-norm statistics; an optimizer moves the weights)."""

    def __init__(self, model):
        self.saved = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict(keep_vars=True).items()}
        self.model = model

    def restore(self):
        with torch.no_grad():
            for k, v in self.model.state_dict(keep_vars=True).items():
                v.copy_(self.saved[k])


def _host(tensors):
    return [None if t is None else t.detach().to("cpu", copy=True) for t in tensors]


def _flat(outputs, grads):
    return [t for t in list(outputs) + list(grads) if t is not None]


def judged_dtype(precision):
    return torch.float32 if precision == "fp32" else torch.bfloat16


def precise_dtype(precision):
    return torch.float64 if precision == "fp32" else torch.float32


def verdict(error, eager_error, precision):
    """None, or why the error against the precise copy is too large: over 3x eager's, floored at epsilon."""
    limit = compare.half_limit(eager_error, judged_dtype(precision))
    if not error <= limit:
        return f"WRONG: error vs {compare_name(precision)} {error:.2e} > {limit:.2e} (3x eager's {eager_error:.2e})"
    return None


def compare_name(precision):
    return "fp64" if precision == "fp32" else "fp32"


def fingerprint(work):
    """What the configuration computes, for the peer cache: model class, parameter count, inputs' shapes."""
    params = sum(p.numel() for p in work.model.parameters())
    sets = [inputs for _, inputs in work.shapes] if work.shapes else [work.inputs]
    shapes = [[(tuple(x.shape), str(x.dtype)) for x in inputs if isinstance(x, torch.Tensor)] for inputs in sets]
    return f"{type(work.model).__name__}:{params}:{shapes}"


def release(device):
    gc.collect()
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.empty_cache()


def _reset_peak(device):
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device):
    if device.type != "cuda":
        return None
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def _peak_reserved(device):
    return int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else None


class Reference:
    """Eager's outputs and gradients per input set, and the precise copy's, on the host."""

    def __init__(self, work, config, input_sets, cotangents, weights, device):
        self.eager, self.precise, self.eager_error = [], [], []
        autocast = config.precision == "amp"
        eager = SweepStep(work.model, work.model, input_sets, work.train, cotangents, autocast=autocast)
        for i in range(len(input_sets)):
            weights.restore()
            self.eager.append(_host(_flat(*eager.run_at(i))))
        weights.restore()
        dtype = precise_dtype(config.precision)
        for i, inputs in enumerate(input_sets):
            if work.reference is not None:
                model, inputs = work.reference(dtype)
            else:
                model, inputs, _ = to_dtype(work.model, inputs, None, dtype)
            tangents = [[c.to(dtype) for c in cs] for cs in cotangents] if cotangents else None
            step = SweepStep(model, model, [inputs], work.train, tangents[i:i + 1] if tangents else None)
            self.precise.append(_host(_flat(*step.run_at(0))))
            del model, step
            release(device)
            self.eager_error.append(compare.error(self.eager[i], self.precise[i]).norm_rel)

    def judge(self, step, weights, precision):
        """(worst error vs eager, worst error vs the precise copy, None or 'WRONG: ...') over the input sets."""
        vs_eager = vs_precise = 0.0
        wrong = None
        for i in range(len(self.eager)):
            weights.restore()
            got = _flat(*step.run_at(i))
            e_eager = compare.error(got, self.eager[i]).norm_rel
            e_precise = compare.error(got, self.precise[i]).norm_rel
            del got
            vs_eager, vs_precise = max(vs_eager, e_eager), max(vs_precise, e_precise)
            wrong = wrong or verdict(e_precise, self.eager_error[i], precision)
        weights.restore()
        return vs_eager, vs_precise, wrong


def _optimizer(work, precision):
    if precision != "amp" or not work.train:
        return None
    params = [p for p in work.model.parameters() if p.requires_grad]
    fused = all(p.is_cuda for p in params)
    return torch.optim.AdamW(params, lr=1e-4, fused=fused or None)


def measure_backend(backend, work, config, input_sets, cotangents, weights, reference, device, warmup, rep,
                    profile=False, smoke=False):
    """A row for one backend: compile, correctness, timing and memory (see the module docstring)."""
    row = {"backend": backend, "status": "ok"}
    weights.restore()
    release(device)
    _reset_peak(device)
    row["memory_before_bytes"] = int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else None
    step = None
    try:
        fn = fresh_compile(work.model, backend)
        step = SweepStep(fn, work.model, input_sets, work.train, cotangents, autocast=config.precision == "amp",
                         optimizer=_optimizer(work, config.precision))
        start = time.perf_counter()
        step.cycle()
        synchronize(device)
        row["first_call_s"] = time.perf_counter() - start
        first_peak, first_reserved = _peak(device), _peak_reserved(device)
        if backend != "eager":
            row["error_vs_eager"], row["error_vs_reference"], wrong = reference.judge(step, weights, config.precision)
            if wrong:
                row["status"], row["reason"] = "wrong", wrong
        _reset_peak(device)
        row.update(_timed(step, device, warmup, rep, smoke))
        peaks, reserved = [first_peak, _peak(device)], [first_reserved, _peak_reserved(device)]
        row["peak_memory_bytes"] = max(peaks) if None not in peaks else None
        row["peak_reserved_bytes"] = max(reserved) if None not in reserved else None
        row["first_call_peak_memory_bytes"] = first_peak   # compile, checks and the floor's timing
        row["steady_peak_memory_bytes"] = row["steady_peak_reserved_bytes"] = None
        if device.type == "cuda":
            _reset_peak(device)
            step.cycle()
            row["steady_peak_memory_bytes"] = _peak(device)
            row["steady_peak_reserved_bytes"] = _peak_reserved(device)
        if profile:
            row["kernels"] = top_kernels(step.cycle, device)
    except Exception as exc:   # one backend's failure is its row's, never the configuration's
        row.update(status="failed", reason=_reason(exc, limit=300))
    finally:
        del step
        torch._dynamo.reset()
        trial_turns.reset()   # the next backend's graphs never wait on this one's
        _reset_cudagraph_trees()
        stop_inductor_workers()
        weights.restore()
        release(device)
    return row


def _timed(step, device, warmup, rep, smoke):
    """median_s, p20_s, p80_s and steady_s of a step; `smoke`: one call timed once (a CPU smoke run's times
    mean nothing, and each of its calls runs Triton's interpreter)."""
    if smoke:
        once = time_once(step.cycle, device)
        return {"median_s": once, "p20_s": once, "p80_s": once, "steady_s": once}
    trial_turns.settle(step.cycle, TRIAL_CALLS)   # brrr's graphs decide how to run, in turn, before timing
    timing = time_kernel(step.cycle, device, warmup=warmup, rep=rep)
    return {"median_s": timing.median_s, "p20_s": timing.p20_s, "p80_s": timing.p80_s,
            "steady_s": time_steady(step.cycle, device).median_s}


def _reset_cudagraph_trees():
    try:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
    except ImportError:
        return
    reset_cudagraph_trees()


def measure(config, work, backends, device, warmup=25, rep=200, profile=False, smoke=False):
    """{backend: row} for `work` (a built configuration), with `backends` in order after eager; `profile`:
    each compiled backend's top kernels too; `smoke`: each backend timed by one call only."""
    device = torch.device(device)
    input_sets = [tuple(inputs) for _, inputs in work.shapes] if work.shapes else [tuple(work.inputs)]
    cotangents = None
    if work.train:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.precision == "amp"):
            cotangents = [make_cotangents(work.model(*inputs)) for inputs in input_sets]
    weights = Weights(work.model)
    reference = Reference(work, config, input_sets, cotangents, weights, device)
    rows = {}
    for backend in ["eager"] + [b for b in backends if b != "eager"]:
        rows[backend] = measure_backend(backend, work, config, input_sets, cotangents, weights, reference, device,
                                        warmup, rep, profile=profile and backend != "eager", smoke=smoke)
    return rows
