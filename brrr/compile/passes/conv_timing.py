"""Convolutions timed in both layouts, for the layout pass (passes/layouts.py): what it chooses from.

A `ConvCall` describes one ATen convolution (forward or backward) of a graph by its tensors' sizes, strides and
dtype and its parameters; `DeviceConvTimer` runs it on the GPU on random tensors, once with the strides the graph
gives it ("as_is") and once with every 4-D tensor channels_last, and keeps the median of CUDA-event timings. The
times are cached on disk (`cache.folder("layouts")`) by the call, the GPU and the versions of torch and cuDNN and
cuDNN's settings, so a second compile, in this process or another, runs nothing. Nothing here runs inside a
CUDA-graph capture or under AOTAutograd's fake mode, and the random generators are left as they were.
"""

import hashlib
import json
import os
import statistics
from dataclasses import dataclass

import torch

from brrr.compile.cache import folder, write_atomic

aten = torch.ops.aten

SAMPLES = 5                  # timed groups per layout; the median is kept
CALLS_PER_SAMPLE = 3         # calls between one pair of events
HEAD_START_CYCLES = 2_000_000   # ~1 ms of GPU sleep, so an event pair holds the calls and not their launch
VERSION = 1                  # of the cached entries' format: a change makes old entries miss
TENSOR_ARGS = (0, 1, 2)      # a convolution's and its backward's tensor arguments: the first three of both


@dataclass(frozen=True)
class ConvCall:
    """One convolution of a graph, at concrete sizes: `op` "convolution" or "convolution_backward"; `tensors`
    (sizes, strides) per tensor argument in ATen's order (None where the argument is None); `params` its other
    arguments."""
    op: str
    tensors: tuple
    dtype: str
    device: str
    params: tuple

    def describe(self):
        sizes = ", ".join("x".join(map(str, t[0])) for t in self.tensors if t is not None)
        return f"{self.op}({sizes}) {self.dtype.replace('torch.', '')}"

    def key(self, layout):
        return json.dumps([VERSION, self.op, self.tensors, self.dtype, self.params, layout])


def conv_call(node, hint):
    """The ConvCall of FX node `node` (aten.convolution or aten.convolution_backward), sizes through `hint`."""
    op = node.target.__name__.split(".")[0]
    tensors, params = [], []
    for i, arg in enumerate(node.args):
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if i in TENSOR_ARGS and isinstance(val, torch.Tensor):
            tensors.append((tuple(hint(s) for s in val.shape), tuple(hint(s) for s in val.stride())))
        elif i in TENSOR_ARGS:
            tensors.append(None)
        else:
            params.append(_plain(arg, hint))
    first = node.args[0].meta["val"]
    return ConvCall(op, tuple(tensors), str(first.dtype), first.device.type, tuple(params))


def _plain(value, hint):
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v, hint) for v in value)
    return hint(value) if isinstance(value, (torch.SymInt, int)) else value


def _make(spec, dtype, device, layout):
    sizes, strides = spec
    if layout == "channels_last" and len(sizes) == 4:
        return torch.randn(sizes, dtype=dtype, device=device).contiguous(memory_format=torch.channels_last)
    out = torch.empty_strided(sizes, strides, dtype=dtype, device=device)
    return out.normal_()


def runner(call, layout, device):
    """A no-argument function running `call` with its tensors made in `layout` on `device`."""
    dtype = getattr(torch, call.dtype.replace("torch.", ""))
    made = [None if t is None else _make(t, dtype, device, layout) for t in call.tensors]
    if call.op == "convolution":
        return lambda: aten.convolution(*made, *call.params)
    bias_sizes, *rest = call.params
    return lambda: aten.convolution_backward(*made, list(bias_sizes) if bias_sizes is not None else None, *rest)


def _settings(device):
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return [torch.__version__, torch.backends.cudnn.version(), name,
            torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
            torch.backends.cudnn.allow_tf32]


def _cache_path(call, layout, device):
    digest = hashlib.sha256(json.dumps([call.key(layout)] + _settings(device), default=str).encode()).hexdigest()
    return os.path.join(folder("layouts"), f"{digest[:40]}.json")


class DeviceConvTimer:
    """Times ConvCalls on the current CUDA device (cached on disk); copies at the measured copy bandwidth."""

    def __init__(self, device=None):
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else device) \
            if not isinstance(device, torch.device) else device

    def conv(self, call, layout):
        path = _cache_path(call, layout, self.device)
        try:
            with open(path) as f:
                return float(json.load(f)["seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            pass   # missing, truncated or corrupt: measured again
        seconds = self._measure(call, layout)
        write_atomic(path, json.dumps({"call": call.key(layout), "seconds": seconds}).encode())
        return seconds

    def _measure(self, call, layout):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        # the random operands draw from the generators the user's own ops draw from next: their state is restored
        with unset_fake_temporarily(), torch.no_grad(), torch.cuda.device(self.device), \
                torch.random.fork_rng(devices=[self.device.index]):
            fn = runner(call, layout, self.device)
            fn()   # cuDNN picks and loads its kernel here
            times = []
            for _ in range(SAMPLES):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                torch.cuda._sleep(HEAD_START_CYCLES)
                start.record()
                for _ in range(CALLS_PER_SAMPLE):
                    fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e-3 / CALLS_PER_SAMPLE)
            del fn
        return statistics.median(times)

    def copy(self, nbytes):
        """Seconds to read and write `nbytes` once each at the device's measured copy bandwidth (measured here,
        outside AOTAutograd's fake mode, where no earlier run left it on disk)."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        from brrr.cost.device import get_ceilings

        with unset_fake_temporarily():
            return 2 * nbytes / get_ceilings(self.device).bandwidth
