"""A backward's inputs, handed over, for the first call that runs its graph several times (codegen -> **runtime**).

A backward frees each saved tensor at its last use (the caller hands the list over: `call(args, owned=True)`), so
a launched training step peaks at what it holds at its busiest point, not at every saved tensor plus that. The
first call cannot do so as it stands: it runs the graph to check its kernels (a kernel failing half-way has the
graph re-planned and run again), and the floor runs it again to time them, all on the same inputs. Held for
those runs, the saved tensors made the first step the whole run's peak (ResNet-18 fp32 training: 1121 MiB
against 866 once launched, benchmarks/NOTES.md). `HandedOver` keeps a copy of them on the host instead, and puts
a fresh copy on the device before each run, which frees it at its last use. The host copy is made once, and
only up to MAX_BYTES: past that, the inputs stay held as before.

Inputs that are views of one buffer (an attention's q, k and v taken from one projection, a tensor saved beside
a reshape of it) share one copy, as they share their memory: the span of the buffer they cover together, with each
view rebuilt over it. Copied one by one, each interleaved view of a [rows, 3 * width] projection spans nearly all
of it, and a transformer's first backward held its q, k and v three times over: BEiT training's first step peaked
at 3300 MiB against 2380 for its later ones, and at 2488-2600 MiB with one copy per buffer (benchmarks/NOTES.md).
"""

import torch

from brrr.compile.runtime.cuda_graphs import copy_keeping_layout, extent

MAX_BYTES = 4 << 30   # device bytes of inputs kept on the host at most: a copy there, one back per run (each
                      # run of a 4 GiB backward then pays ~0.5 s of copies at pageable host bandwidth)


def _device_bytes(args):
    storages = {(t.device, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes()
                for t in args if isinstance(t, torch.Tensor) and t.device.type != "cpu"}
    return sum(storages.values())


def _shared_spans(args):
    """{position: (group, offset)} and [flat tensor over each group's memory]: the tensors of `args` that share a
    storage with another of the same dtype, grouped, each with its offset into its group's span."""
    by_storage = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.numel() and a.untyped_storage().nbytes():
            by_storage.setdefault((a.device, a.untyped_storage().data_ptr(), a.dtype), []).append(i)
    where, spans = {}, []
    for members in by_storage.values():
        if len(members) < 2:
            continue
        lo = min(args[i].storage_offset() for i in members)
        hi = max(args[i].storage_offset() + extent(args[i]) for i in members)
        first = args[members[0]]
        spans.append(first.as_strided((hi - lo,), (1,), lo))
        for i in members:
            where[i] = (len(spans) - 1, args[i].storage_offset() - lo)
    return where, spans


def _view(t, base, offset):
    return torch.empty(0, dtype=t.dtype, device=base.device).set_(base.untyped_storage(), offset, t.size(),
                                                                  t.stride())


class HandedOver:
    """The inputs `args` copied to the host; `fresh()` is a new list of them on their devices for one run."""

    def __init__(self, args):
        self.devices = [a.device if isinstance(a, torch.Tensor) else None for a in args]
        self.where, spans = _shared_spans(args)
        # page-locked: the copies each way queue on the stream instead of waiting on it (a ConvNeXt training
        # step's first call spent ~10 s of a 96 s cold compile in 12533 pageable copies, benchmarks/NOTES.md)
        self.spans = [copy_keeping_layout(s, torch.device("cpu"), pinned=True) for s in spans]
        self.span_devices = [s.device for s in spans]
        self.host = [_view(a, self.spans[self.where[i][0]], self.where[i][1]) if i in self.where else
                     copy_keeping_layout(a, torch.device("cpu"), pinned=True) if isinstance(a, torch.Tensor) else a
                     for i, a in enumerate(args)]

    @classmethod
    def of(cls, args):
        """HandedOver of `args`, emptying the list (the caller handed it over), or None where they stay held: a
        list with no tensor on a device, or more than MAX_BYTES of them."""
        size = _device_bytes(args)
        if not size or size > MAX_BYTES:
            return None
        handed = cls(args)
        args.clear()
        return handed

    def fresh(self):
        spans = [copy_keeping_layout(s, d) for s, d in zip(self.spans, self.span_devices)]
        return [_view(h, spans[self.where[i][0]], self.where[i][1]) if i in self.where else
                copy_keeping_layout(h, d) if d is not None else h
                for i, (h, d) in enumerate(zip(self.host, self.devices))]


def prepared(call, args):
    """One run of `call` on `args`, ready to start: a fresh owned copy of HandedOver inputs (made now, before
    any timing starts: a copy to the device waits for the stream), else the list as it is (held)."""
    if isinstance(args, HandedOver):
        fresh = args.fresh()
        return lambda: call(fresh, True)
    return lambda: call(args)


def run(call, args):
    return prepared(call, args)()
