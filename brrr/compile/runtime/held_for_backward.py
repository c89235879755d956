"""What a training graph's call leaves held for its backward, and what its step peaks at (codegen -> **runtime**),
counted on fake tensors: the bytes of the storages autograd saves during the call and of its outputs, beyond the
storages of its inputs (parameters, the batch: held anyway); and the most bytes alive at once through the call
and its backward (`held_and_peak`).

Why. The floor times a training graph as Dynamo captured it (captured_choice.py), and eager's ops save what
eager saves: a DistilBERT amp step's captured calls peaked at eager's 3198 MiB where brrr's own step needs far
less, and that trial set the whole run's peak at 1.31x Inductor's (benchmarks/NOTES.md). Counting both ways'
saved storages on fake tensors, before either runs for real, tells whether eager's way would raise the peak.

How. The call runs once under a FakeTensorMode of its own, with `saved_tensors_hooks` recording each tensor
autograd packs (eager's autograd nodes, or the ctx.save_for_backward of brrr's lean runtime, which runs its
forward graph on fake tensors). Storages are told apart by identity, so views and repeated saves count once.
The random state is left as it was. A call that cannot run on fake tensors (a data-dependent op, an op with no
fake kernel) counts as unknown: None.
"""

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from brrr.compile.fallbacks import debugging


def held_bytes(fn, args, constants=()):
    """Bytes `fn(*args)` leaves held for its backward (its saved tensors and outputs, less `args`' and
    `constants`' storages), or None where it cannot run on fake tensors. `constants`: real tensors the call
    reads besides `args` (a Dynamo graph's attributes)."""
    counted = _count(fn, args, constants, backward=False)
    return None if counted is None else counted[0]


def held_and_peak(fn, args, constants=()):
    """(held_bytes, the most bytes of storages beyond `args`' and `constants`' alive at once while `fn(*args)`
    runs and then its backward), from one run on fake tensors, or None. The backward takes ones as the
    cotangents of the differentiable outputs and computes gradients for `args` alone. Eager's ops free what
    autograd does not save as they go, and their backward materializes gradients a compiled backward fuses away:
    GAT's eager training step peaks at 1212 MiB, far over what it saves."""
    return _count(fn, args, constants, backward=True)


def _count(fn, args, constants, backward):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from brrr.compile.runtime.floor import KeptRandom

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    try:
        fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        # autograd runs above the fake mode: it saves a real attribute as it is, and the ops see its fake
        held_anyway = [f for f in fakes if isinstance(f, torch.Tensor)] + list(constants) + \
            [mode.from_tensor(c) for c in constants]
        inputs = {StorageWeakRef(t.untyped_storage()) for t in held_anyway}
        live = _LiveBytes(inputs)
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
        with KeptRandom(device), mode, live:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                outs = fn(*fakes)
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            held = _bytes_beyond(saved + [o for o in outs if isinstance(o, torch.Tensor)], inputs)
            if backward:
                diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
                wanted = [f for f in fakes if isinstance(f, torch.Tensor) and f.requires_grad]
                del saved[:], outs
                if diff and wanted:
                    torch.autograd.grad(diff, wanted, [torch.ones_like(o) for o in diff], allow_unused=True)
                del diff
    except Exception:
        if debugging():
            raise
        return None
    return held, live.peak


def _bytes_beyond(tensors, inputs):
    storages = {}
    for t in tensors:
        s = t.untyped_storage()
        key = StorageWeakRef(s)
        if key not in inputs:
            storages[key] = int(s.nbytes())
    return sum(storages.values())


class _LiveBytes(TorchDispatchMode):
    """The bytes of the storages ops make, alive now and at most, leaving out `held` (a storage goes when its
    last tensor does)."""

    def __init__(self, held):
        super().__init__()
        self.held, self.alive, self.now, self.peak = held, {}, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key in [k for k in self.alive if k.expired()]:
            self.now -= self.alive.pop(key)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = StorageWeakRef(t.untyped_storage())
                if key not in self.alive and key not in self.held:
                    self.alive[key] = int(t.untyped_storage().nbytes())
                    self.now += self.alive[key]
        self.peak = max(self.peak, self.now)
        return out


def graph_constants(fn):
    """The tensors a Dynamo graph's bound `forward` reads as attributes (get_attr), for held_bytes."""
    gm = getattr(fn, "__self__", None)
    if not isinstance(gm, torch.fx.GraphModule):
        return ()
    out = []
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value = gm
        try:
            for part in node.target.split("."):
                value = getattr(value, part)
        except AttributeError:
            continue
        if isinstance(value, torch.Tensor):
            out.append(value)
    return tuple(out)
