"""Layouts for the whole graph (backend -> **layouts** -> partition -> lowering): a convolution graph runs
channels_last when its measured convolutions say so, whatever layout the user passed.

PyTorch models are NCHW unless their user converts them, and cuDNN's NCHW kernels are often several times slower
than its NHWC ones (depthwise convolutions, 1x1 convolutions as `align1` GEMMs). brrr's own kernels are fast in
either layout, so the layout is the convolutions' choice, paid for by the copies that convert:

- Every 2-D convolution of the graph (forward `aten.convolution` and backward `aten.convolution_backward`; a
  training graph is AOTAutograd's joint graph, so the backward follows the forward's layouts) whose tensors are
  not already channels_last is timed as the graph has it and channels_last (conv_timing.py, cached on disk).
- The candidate graph converts each such convolution's 4-D tensors with `clone(memory_format=channels_last)`,
  one clone per source tensor (a graph input, a weight: once per call), placed before its first convolution.
  Every other op then follows eager's rules on the new strides (fake tensors propagated through the graph), so
  activations stay channels_last from one convolution to the next and no copy sits between them.
- Outputs keep the layout the user's graph gives them: an output that changed is cloned back (a gradient of an
  NCHW weight, a feature map returned to the caller), and so is a value a view reads by its strides (a flatten
  before a classifier).
- Convolutions joined by chains of 4-D values form a group (`conv_groups`; a training layer's forward and
  backward share its weight), and each group converts when its convolutions' channels_last time plus the copies'
  (bytes at the measured copy bandwidth, plus a launch each) is below MARGIN of their time as they are: every
  convolution of a group moves, or none.

`DECISIONS` lists each group's decision with the times behind it (explain shows them); `TIMER` replaces the
GPU timer in tests; BRRR_LAYOUTS=0 turns the pass off. A group the pass cannot rewrite (a non-contiguous output it
cannot restore, an op fake tensors cannot follow) stays as it is, and its decision says why.
"""

import os
from dataclasses import dataclass, field

import torch
from torch.fx.node import map_arg

from brrr.compile.fallbacks import debugging, recover
from brrr.compile.passes.conv_timing import DeviceConvTimer, conv_call

aten = torch.ops.aten

MARGIN = 0.97            # channels_last must save 3%: less is within the timer's noise
LAUNCH_S = 4e-6          # a conversion's kernel launch, on top of its bytes
CONVERTED_ARGS = {aten.convolution.default: (0, 1), aten.convolution_backward.default: (0, 1, 2)}
# ops whose result depends on their input's strides: they keep reading the tensor as the graph passed it
STRIDE_BOUND = {aten.view.default, aten._unsafe_view.default, aten.as_strided.default, aten.reshape.default,
                aten._reshape_alias.default, aten.as_strided_scatter.default}

TIMER = None             # a stand-in for DeviceConvTimer (tests): .conv(ConvCall, layout) and .copy(nbytes) seconds
DECISIONS = []           # Decision records, process-wide, in the order they were made


@dataclass
class Decision:
    graph: str                   # "training" (AOTAutograd's joint graph) or "inference"
    as_is_s: float               # the convolutions' time in the graph's own layouts
    channels_last_s: float       # their time channels_last
    copy_bytes: int = 0          # what the conversions read (each also writes as much)
    copies: int = 0              # conversion kernels: sources converted and outputs restored
    copy_s: float = 0.0
    converted: bool = False
    why: str = ""                # why the graph was left as it is, where it was not converted for its times
    convs: list = field(default_factory=list)   # (description, as_is_s, channels_last_s) per convolution

    def __str__(self):
        head = f"{self.graph} graph: {len(self.convs)} convolution(s) {_ms(self.as_is_s)} as passed, " \
               f"{_ms(self.channels_last_s)} channels_last + {self.copies} conversion(s) " \
               f"{_ms(self.copy_s)} ({self.copy_bytes / 2**20:.1f} MiB)"
        kept = f"kept as passed: {self.why}" if self.why else "kept as passed"
        verdict = "converted to channels_last" if self.converted else kept
        slowest = sorted(self.convs, key=lambda c: -max(c[1], c[2]))[:3]
        detail = "; ".join(f"{d} {_ms(a)} -> {_ms(c)}" for d, a, c in slowest)
        return f"{head}: {verdict}" + (f" (largest: {detail})" if detail else "")


def _ms(seconds):
    return f"{seconds * 1e3:.3f} ms"


def enabled():
    if os.environ.get("BRRR_LAYOUTS", "1") == "0":
        return False
    # compiled inside the caller's own CUDA-graph capture, nothing may run or synchronize: layouts stay as passed
    return TIMER is not None or not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _channels_last(val):
    return isinstance(val, torch.Tensor) and val.dim() == 4 and val.is_contiguous(memory_format=torch.channels_last)


def candidates(gm):
    """The 2-D convolutions of gm whose 4-D tensors are not all channels_last already."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in CONVERTED_ARGS:
            continue
        vals = [_val(node.args[i]) for i in CONVERTED_ARGS[node.target]]
        if not all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in vals):
            continue   # 1-D and 3-D convolutions: channels_last is a 4-D layout
        if vals[0].device.type != "cuda" and TIMER is None:
            continue   # the layout is cuDNN's choice; elsewhere nothing measures it
        if not all(_channels_last(v) for v in vals):
            out.append(node)
    return out


def choose(gm, graph):
    """gm, or a channels_last copy of it where its measured convolutions say so (see the module docstring);
    `graph` names it in the decisions. Never raises: a failure leaves gm as it is."""
    if not enabled():
        return gm
    decisions = []
    try:
        convs = candidates(gm)
        if not convs:
            return gm
        groups = conv_groups(gm, convs)
        for i, group in enumerate(groups):
            name = graph if len(groups) == 1 else f"{graph} (convolution group {i + 1} of {len(groups)})"
            decisions.append(Decision(name, 0.0, 0.0))
        DECISIONS.extend(decisions)
        return _choose(gm, groups, decisions)
    except Exception as e:
        if debugging():
            raise
        recover(e, "the layout pass failed", "the graph keeps its layouts")
        for decision in decisions:
            decision.converted, decision.why = False, f"the pass failed ({type(e).__name__}: {str(e)[:120]})"
        return gm


def conv_groups(gm, convs):
    """`convs` in groups that share tensors: two convolutions are in one group when a chain of 4-D values (through
    any ops but STRIDE_BOUND ones) joins them, so their layouts meet; a training layer's forward and backward
    share its weight. Groups decide their layouts apart, in graph order."""
    parent = {}

    def root(n):
        r = n
        while r in parent:
            r = parent[r]
        while n in parent and parent[n] is not r:   # path compression: a long chain is walked once
            parent[n], n = r, parent[n]
        return r

    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target in STRIDE_BOUND or not _four_d(node):
            continue
        for arg in node.all_input_nodes:
            a, b = root(arg), root(node)
            if _four_d(arg) and a is not b:
                parent[a] = b
    groups = {}
    for conv in convs:
        groups.setdefault(root(conv), []).append(conv)
    return list(groups.values())


def _four_d(node):
    vals = _val(node)
    vals = vals if isinstance(vals, (tuple, list)) else [vals]
    return any(isinstance(v, torch.Tensor) and v.dim() == 4 for v in vals)


def _choose(gm, groups, decisions):
    from brrr.compile.ir.sizes import hint
    from brrr.compile.passes.specialize import copy_graph_module

    timer = TIMER or DeviceConvTimer(_val(groups[0][0].args[0]).device.index)
    chosen = {}   # group's conv names -> its candidate graph, converted alone
    for convs, decision in zip(groups, decisions):
        for node in convs:
            call = conv_call(node, hint)
            as_is, cl = timer.conv(call, "as_is"), timer.conv(call, "channels_last")
            decision.convs.append((call.describe(), as_is, cl))
            decision.as_is_s += as_is
            decision.channels_last_s += cl
        if decision.channels_last_s >= MARGIN * decision.as_is_s:
            decision.why = "its convolutions are not faster channels_last"   # no candidate graph to build
            continue
        names = frozenset(n.name for n in convs)
        candidate = copy_graph_module(gm)
        try:
            copies = convert(candidate, names)
        except CannotConvert as e:
            decision.why = str(e)
            continue
        decision.copies = len(copies)
        decision.copy_bytes = sum(hint(_bytes(_val(c))) for c in copies)
        decision.copy_s = timer.copy(decision.copy_bytes) + LAUNCH_S * len(copies)
        decision.converted = decision.channels_last_s + decision.copy_s < MARGIN * decision.as_is_s
        if decision.converted:
            chosen[names] = candidate
    if len(chosen) <= 1:   # none, or one group's candidate as it was timed
        return next(iter(chosen.values()), gm)
    try:   # the chosen groups together: each was timed and converted alone
        candidate = copy_graph_module(gm)
        convert(candidate, set().union(*chosen))
    except CannotConvert as e:
        for decision in decisions:
            if decision.converted:
                decision.converted, decision.why = False, f"converted with the other groups: {e}"
        return gm
    return candidate


def _bytes(val):
    return val.numel() * val.element_size()


class CannotConvert(Exception):
    """The graph cannot be rewritten channels_last without changing what it returns."""


def convert(gm, conv_names):
    """Rewrite gm in place: the 4-D tensors of the convolutions named in `conv_names` converted channels_last,
    values re-propagated, outputs restored to their strides. Returns the conversion nodes added."""
    from torch._guards import detect_fake_mode

    graph = gm.graph
    mode = detect_fake_mode([_val(n) for n in graph.nodes if n.op == "placeholder"])
    if mode is None:
        raise CannotConvert("no fake tensors to follow the new strides with")
    original = {n: _val(n) for n in graph.nodes}
    clones, added = {}, []
    restore = _Restorer(graph, original, mode, added)
    for node in list(graph.nodes):
        if node.op == "output":
            output = node
            output.args = map_arg(output.args, lambda n: restore(n, output))
            continue
        if node.op != "call_function":
            continue
        if node.target in STRIDE_BOUND and isinstance(node.args[0], torch.fx.Node):
            # a view of a tensor now channels_last (a flatten before a classifier) reads the layout it was traced at
            node.args = (restore(node.args[0], node),) + tuple(node.args[1:])
        if node.name in conv_names:
            args = list(node.args)
            for i in CONVERTED_ARGS[node.target]:
                src = args[i]
                if _channels_last(_val(src)):
                    continue
                if src not in clones:
                    with graph.inserting_before(node):
                        clones[src] = graph.call_function(aten.clone.default, (src,),
                                                          {"memory_format": torch.channels_last})
                    _propagate(clones[src], mode)
                    added.append(clones[src])
                    _redirect_later_uses(src, clones[src], node)
                args[i] = clones[src]
            node.args = tuple(args)
        _propagate(node, mode)
    graph.lint()
    gm.recompile()
    return added




def _redirect_later_uses(src, clone, conv):
    """Let the ops after `conv` that read `src` read its channels_last clone instead: a residual add of a
    converted input (x + block(x)) then stays channels_last, where reading `src` would make it NCHW again (eager's
    rule follows the first input) and the next convolution convert once more."""
    order = {n: i for i, n in enumerate(conv.graph.nodes)}
    for user in list(src.users):
        if user is not clone and user.op == "call_function" and user.target not in STRIDE_BOUND \
                and order[user] > order[conv]:
            user.replace_input_with(src, clone)


def _propagate(node, mode):
    args, kwargs = map_arg((node.args, node.kwargs), _val)
    try:
        with mode:
            val = node.target(*args, **kwargs)
    except Exception as e:
        raise CannotConvert(f"{node.target} does not follow channels_last inputs "
                            f"({type(e).__name__}: {str(e)[:120]})") from e
    node.meta["val"] = val
    node.meta.pop("tensor_meta", None)   # stale strides; the partitioner reads "val"


class _Restorer:
    """Gives back a value whose strides the conversion moved in the layout it was traced at: a clone to its
    contiguous layout, one per value, placed before its first reader that needs it (a graph output, a view)."""

    def __init__(self, graph, original, mode, added):
        self.graph, self.original, self.mode, self.added = graph, original, mode, added
        self.restored = {}

    def __call__(self, node, reader):
        before, now = self.original.get(node), _val(node)
        if not isinstance(now, torch.Tensor) or not isinstance(before, torch.Tensor):
            return node
        if before.stride() == now.stride() or before.dim() < 2:
            return node
        if reader.op != "output" and all(a == b for a, b, n in zip(before.stride(), now.stride(), now.shape)
                                         if n != 1):
            return node   # a view reads it the same ([N, C, 1, 1] channels_last: only size-1 dims' strides moved)
        if not before.is_contiguous():
            raise CannotConvert(f"{node.name} had strides {tuple(before.stride())}, which a conversion back "
                                "cannot promise")
        if node not in self.restored:   # even where only a size-1 dim's stride moved: eager's strides exactly
            with self.graph.inserting_before(reader):
                self.restored[node] = self.graph.call_function(aten.clone.default, (node,),
                                                               {"memory_format": torch.contiguous_format})
            _propagate(self.restored[node], self.mode)
            self.added.append(self.restored[node])
        return self.restored[node]
