"""The step being analyzed: one inference forward, or one forward+backward for `train=True`.

Shared by every stage of the pipeline (capture -> time -> regimes -> advise -> report): capture and timing
each run this same step, so the ops they see line up one to one. Also owns device resolution and the
clear errors for bad input (no inputs, a model that raises, an output with nothing to differentiate).
"""

import weakref
from dataclasses import dataclass

import torch

from brrr.cost.ops import tensors_in
from brrr.errors import BrrrError


def resolve_device(model, inputs, device=None):
    """The device the step runs on: the inputs' device, else the model's, else cpu; `device` must agree."""
    found = next((t.device for t in tensors_in(inputs)), None)
    if found is None and isinstance(model, torch.nn.Module):
        found = next((p.device for p in model.parameters()), None)
    if device is None:
        return found or torch.device("cpu")
    device = torch.device(device)
    if found is not None and found.type != device.type:
        raise BrrrError(f"analyze(device={str(device)!r}) but the inputs are on {found}; move them first")
    return found if found is not None and found.type == device.type else device


def loss_of(output):
    """A scalar to call backward on: HF `loss`, else `last_hidden_state.sum()`, else the sum of float outputs."""
    if isinstance(output, dict):
        for key in ("loss", "last_hidden_state"):
            value = output.get(key)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                return value if value.numel() == 1 else value.sum()
    parts = [t.sum() for t in tensors_in(output) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise BrrrError("train=True needs a floating-point output that requires grad; the model returned none")
    loss = parts[0]
    for part in parts[1:]:
        loss = loss + part
    return loss


def _value_signature(value):
    """A hashable stand-in for a step input: tensors by layout, containers element-wise, the rest as is."""
    if isinstance(value, torch.Tensor):
        return (type(value), tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value), *(_value_signature(v) for v in value))
    if isinstance(value, dict):
        return (dict, *((k, _value_signature(v)) for k, v in value.items()))
    return value


class Step:
    """Calls `model(*inputs)` (and backward when training) the same way every time it is run."""

    def __init__(self, model, inputs, train=False):
        if not callable(model):
            raise BrrrError(f"analyze needs a callable model, got {type(model).__name__}")
        if len(inputs) == 0:
            raise BrrrError("analyze needs at least one example input: analyze(model, x, ...)")
        self.model, self.inputs, self.train = model, tuple(inputs), train
        self.grad_leaves = []  # what backward writes .grad of: parameters and leaf inputs (training only)
        if train:
            params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
            self.grad_leaves = params + [t for t in tensors_in(self.inputs) if t.requires_grad and t.is_leaf]
        self.output = None

    def signature(self):
        """What, besides the model object itself, decides which kernels the step launches, as far as it is
        cheap to read: the model's mode and first parameter's dtype and device, the inputs' shapes, strides,
        dtypes and devices, train, grad mode, autocast, the matmul precision settings, cuDNN autotuning and
        deterministic algorithms. None when some input can't be hashed. The same model with one signature
        runs the same program (KnownSteps)."""
        model = self.model
        params = None
        if isinstance(model, torch.nn.Module):
            first = next(model.parameters(), None)
            params = (model.training, first.dtype, first.device) if first is not None else (model.training,)
        settings = (self.train, torch.is_grad_enabled(), torch.get_float32_matmul_precision(),
                    torch.backends.cuda.matmul.allow_tf32, torch.is_autocast_enabled("cuda"),
                    torch.is_autocast_enabled("cpu"), torch.backends.cudnn.benchmark,
                    torch.are_deterministic_algorithms_enabled())
        key = (params, _value_signature(self.inputs), settings)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def __call__(self):
        try:
            if not self.train:
                with torch.no_grad():
                    self.output = self.model(*self.inputs)
                return self.output
            for leaf in self.grad_leaves:
                leaf.grad = None  # so every step runs the same ops (no gradient accumulation adds)
            self.output = self.model(*self.inputs)
            loss = loss_of(self.output)
        except BrrrError:
            raise
        except Exception as e:
            raise BrrrError(f"the model raised {type(e).__name__}: {e}") from e
        if not loss.requires_grad:
            raise BrrrError("train=True but the model's output does not require grad (no trainable parameters?)")
        try:
            loss.backward()
        except Exception as e:
            raise BrrrError(f"backward raised {type(e).__name__}: {e}") from e
        return self.output


@dataclass
class KnownStep:
    """What an earlier analysis in this process learned about a step (same model, same Step.signature)."""

    wall_s: float | None = None   # its last warm plain run (timing.timed_runs' warm_s)
    trace: object = None          # its last capture.Trace, to time it again without the tracer (replay.py)
    expected: list | None = None  # replay.expected_ops of that trace; None: not replayable
    state: tuple | None = None    # replay.model_state when traced
    kernels: list | None = None   # kernels each op launched in the traced run (CUDA)
    outside: list | None = None   # names of the kernels compiled code launched outside every op, in order
    replayable: bool = True       # False once a replay found another program: traced from then on


class KnownSteps:
    """KnownStep per model (held weakly) and Step.signature, for the steps analyzed in this process.

    The first analysis of a step takes a warm-up run and one more for its wall time, and runs the step under
    the tracer; a later analysis of the same step needs neither when what it measures agrees with what is
    known (timing.timed_runs, replay.py). A model that can't be weakly referenced, or inputs that can't be
    hashed, are never remembered. At most MAX_PER_MODEL signatures are kept per model (the latest)."""

    MAX_PER_MODEL = 8

    def __init__(self):
        self._by_model = weakref.WeakKeyDictionary()

    def _slot(self, step):
        signature = step.signature()
        try:
            steps = self._by_model.setdefault(step.model, {}) if signature is not None else None
        except TypeError:  # no weak reference to this callable
            steps = None
        return steps, signature

    def get(self, step):
        """The KnownStep of `step` (created empty on first use), or None when it can't be remembered."""
        steps, signature = self._slot(step)
        if steps is None:
            return None
        known = steps.pop(signature, None) or KnownStep()
        steps[signature] = known  # most recently used last
        while len(steps) > self.MAX_PER_MODEL:
            del steps[next(iter(steps))]
        return known
