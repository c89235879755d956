"""One benchmark step: an inference call, or forward + backward with fixed random cotangents.

A training step here is what the backend must get right and fast: the forward, and the gradients of every
parameter (and of inputs that require grad). Gradients are set to None before each step, so each step
allocates them afresh, as `optimizer.zero_grad(set_to_none=True)` does. The model's train/eval mode is left
as given (eval disables dropout, which keeps results comparable across backends).
"""

import copy

import torch

from brrr.bench.compare import flatten_tensors


def grad_leaves(model, inputs):
    """The tensors whose .grad a training step produces: parameters, then inputs that require grad."""
    params = [p for p in model.parameters() if p.requires_grad] if isinstance(model, torch.nn.Module) else []
    return params + [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]


def differentiable_outputs(out):
    return [t for t in flatten_tensors(out) if t.requires_grad]


def make_cotangents(out, seed=0):
    """Random cotangents, one per differentiable output, the same for every backend (never all ones)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=generator, dtype=torch.float32).to(device=t.device, dtype=t.dtype)
            for t in differentiable_outputs(out)]  # drawn on the CPU: the same numbers on every device


class Step:
    """Callable running `fn` on the next input set; `.grads()` reads the gradients of the last step."""

    def __init__(self, fn, model, input_sets, train, cotangents=None):
        self.fn, self.input_sets, self.train, self.cotangents = fn, input_sets, train, cotangents
        self.leaves = grad_leaves(model, input_sets[0]) if train else []
        self.calls = 0

    def __call__(self):
        inputs = self.input_sets[self.calls % len(self.input_sets)]
        self.calls += 1
        if not self.train:
            with torch.no_grad():
                return self.fn(*inputs)
        for leaf in self.leaves:
            leaf.grad = None
        out = self.fn(*inputs)
        outputs = differentiable_outputs(out)
        if not outputs:
            raise ValueError("train=True but no output requires grad")
        torch.autograd.backward(outputs, self.cotangents)
        return out

    def run_on_first_inputs(self):
        """One step on input set 0, returning (outputs, grads) detached and cloned."""
        self.calls = 0
        out = self()
        outputs = [t.detach().clone() for t in flatten_tensors(out)]
        grads = [None if leaf.grad is None else leaf.grad.detach().clone() for leaf in self.leaves]
        return outputs, grads


def to_dtype(model, inputs, cotangents, dtype=torch.float64):
    """A copy of the model, inputs and cotangents in floating dtype `dtype` (integer tensors are left alone)."""
    def cast(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.detach().to(dtype).requires_grad_(x.requires_grad)
        return x

    copied = copy.deepcopy(model).to(dtype) if isinstance(model, torch.nn.Module) else model
    cotangents = [c.to(dtype) for c in cotangents] if cotangents is not None else None
    return copied, tuple(cast(x) for x in inputs), cotangents
