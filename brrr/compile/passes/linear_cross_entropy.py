"""Find linear -> cross_entropy in Dynamo's graph and compute it without logits (capture -> **this pass** ->
AOTAutograd -> lower -> ...; the op it inserts is matmul/linear_cross_entropy.py).

A language model's head makes logits [rows, vocab], the largest tensor of a training step (GPT-2 at 8x1024:
823 MB in bf16, twice that once upcast for the loss, and as much again for their gradient), only for
cross_entropy to reduce each row to one number. When Dynamo's graph computes

    linear(x, W, b) -> [float() / to(dtype) / view / reshape / contiguous / flatten / [..., a:b, :]]*
        -> cross_entropy(., target)

(a slice of leading dims, as when the logits are shifted for next-token loss, is taken of x instead) with
class-index targets, no class weights, reduction 'mean' or 'sum', and nothing else reading the logits, the
chain becomes one call of `brrr::fused_linear_cross_entropy_with_grads` (chunks of rows; the gradients are
computed in the forward, while each chunk's logits are at hand), or of `brrr::fused_linear_cross_entropy` where
the loss needs no gradient. This runs before AOTAutograd, on Dynamo's graph, because only
there are the forward and its backward still one computation: after the partition the logits are already a
tensor saved for the backward.

Applied where the logits are large (MIN_LOGITS_BYTES, upcast included): below that a one-kernel softmax over
the stored logits costs less than a loop of chunks. Each rewrite is listed by `explain`.

Under the caller's autocast (an amp training loop: `with torch.autocast(...)` around the compiled call) the
linear runs in autocast's dtype and cross_entropy in float32, whatever the graph's values are. The rewrite then
casts x, the weight and the bias to autocast's dtype itself and asks the op for a float32 loss, which is what
autocast computes: a DistilBERT amp step held its bf16 logits, their float32 upcast and its gradient, 700 MiB
over the step's saved tensors (benchmarks/NOTES.md). A graph that enters autocast itself is left alone.
"""

import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MIN_LOGITS_BYTES = 64 << 20
REWRITES = []   # every Rewrite made in this process, newest last (benchmarks record theirs)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_LINEAR = {torch._C._nn.linear, F.linear}
_CROSS_ENTROPY = {F.cross_entropy, torch._C._nn.cross_entropy_loss}
_SAME_ROWS_METHODS = {"float", "to", "view", "reshape", "contiguous", "flatten"}
_SAME_ROWS_FUNCTIONS = {torch.reshape, torch.flatten}


@dataclass(frozen=True)
class Rewrite:
    """One linear -> cross_entropy computed without its logits."""

    linear: str        # the FX node of the linear, as Dynamo named it
    rows: int
    hidden: int
    vocab: int
    chunk_rows: int
    logits_bytes: int  # what the unfused chain held at once: logits, plus their upcast copy
    transposed: bool = False   # each chunk's logits made [vocab, rows]: a row of them is not 16-byte aligned
    autocast: torch.dtype | None = None   # the caller's autocast dtype the operands were cast to

    def __str__(self):
        layout = (f"; logits made [{self.vocab}, rows], a row of {self.vocab} not being 16-byte aligned"
                  if self.transposed else "")
        if self.autocast is not None:
            layout += f"; operands cast to {str(self.autocast).replace('torch.', '')} as the caller's autocast does"
        return (f"{self.linear}: linear [{self.rows} x {self.hidden}] -> cross_entropy over {self.vocab} classes "
                f"in chunks of {self.chunk_rows} rows; {self.logits_bytes / 2**20:.1f} MiB of logits never stored"
                + layout)


def _val(node):
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else node


def _static_tensor(v):
    return isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in list(v.shape) + list(v.stride()))


def _aten_style_cross_entropy(input, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    """torch._C._nn.cross_entropy_loss's signature (reduction as an enum), read as F.cross_entropy's."""
    return dict(input=input, target=target, weight=weight, size_average=None, reduce=None,
                reduction={0: "none", 1: "mean", 2: "sum"}.get(reduction), ignore_index=ignore_index,
                label_smoothing=label_smoothing)


def _cross_entropy_args(node):
    """cross_entropy's arguments by name, or None for a call this pass does not take."""
    import inspect
    try:
        if node.target is F.cross_entropy:
            bound = inspect.signature(F.cross_entropy).bind(*node.args, **node.kwargs)
            bound.apply_defaults()
            a = dict(bound.arguments)
        else:
            a = _aten_style_cross_entropy(*node.args, **node.kwargs)
    except TypeError:
        return None
    if a["weight"] is not None or a["size_average"] is not None or a["reduce"] is not None:
        return None
    if a["reduction"] not in ("mean", "sum") or not isinstance(a["ignore_index"], int):
        return None
    if not isinstance(a["label_smoothing"], (int, float)):
        return None
    return a


def _leading_slice(node, vocab):
    """The index of a `logits[..., a:b, :]`-style getitem that slices leading dims only (the linear's input can
    take the same index), or None."""
    if not (node.op == "call_function" and node.target is operator.getitem):
        return None
    src, out, idx = _val(node.args[0]), _val(node), node.args[1]
    entries = list(idx) if isinstance(idx, tuple) else [idx]
    if not (_static_tensor(src) and _static_tensor(out)) or not all(
            e is Ellipsis or isinstance(e, slice) and all(isinstance(v, (int, type(None))) for v in
                                                          (e.start, e.stop, e.step)) for e in entries):
        return None
    if entries.count(Ellipsis) > 1:
        return None
    if Ellipsis in entries:
        at = entries.index(Ellipsis)
        entries[at:at + 1] = [slice(None)] * (src.dim() - len(entries) + 1)
    entries += [slice(None)] * (src.dim() - len(entries))
    if len(entries) != src.dim() or entries[-1] != slice(None) or out.shape[-1] != vocab:
        return None
    return tuple(entries)


def _keeps_rows(node, vocab):
    """A view, reshape, copy or float cast that keeps rows of `vocab` logits in their order."""
    if node.op == "call_method" and node.target in _SAME_ROWS_METHODS:
        pass
    elif not (node.op == "call_function" and node.target in _SAME_ROWS_FUNCTIONS):
        return False
    src, out = _val(node.args[0]), _val(node)
    if not (_static_tensor(src) and _static_tensor(out)) or src.device != out.device:
        return False
    if node.target == "to" and any(isinstance(a, (str, torch.device)) for a in list(node.args[1:]) +
                                   list(node.kwargs.values())):
        return False
    return (src.dim() >= 1 and out.dim() >= 1 and src.shape[-1] == out.shape[-1] == vocab
            and out.dtype in FLOAT_DTYPES and out.numel() == src.numel())


def _match(ce, cast=False):
    """(linear node, chain of nodes between it and `ce`, cross_entropy's arguments) or None. `cast`: the rewrite
    casts the linear's operands (autocast), so they need not share a dtype."""
    args = _cross_entropy_args(ce)
    if args is None:
        return None
    logits, target = args["input"], args["target"]
    lv, tv = _val(logits), _val(target)
    if not (_static_tensor(lv) and _static_tensor(tv) and _static_tensor(_val(ce))) or lv.dim() != 2 \
            or tv.dim() != 1:
        return None
    if tv.dtype not in (torch.int64, torch.int32) or tv.device != lv.device or lv.dtype not in FLOAT_DTYPES:
        return None
    vocab, chain, slices, node = lv.shape[1], [], [], logits
    while isinstance(node, torch.fx.Node) and node.op in ("call_method", "call_function") \
            and node.target not in _LINEAR:
        sliced = _leading_slice(node, vocab)
        if len(node.users) != 1 or (sliced is None and not _keeps_rows(node, vocab)):
            return None
        if sliced is not None:
            slices.insert(0, sliced)   # applied from the linear's output outwards
        chain.append(node)
        node = node.args[0]
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _LINEAR):
        return None
    if len(node.users) != 1 or len(node.args) + len(node.kwargs) > 3:
        return None
    x, weight = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    xv, wv, bv = _val(x), _val(weight), _val(bias)
    if not (_static_tensor(xv) and _static_tensor(wv)) or wv.dim() != 2 or wv.shape[0] != vocab:
        return None
    if bias is not None and not (_static_tensor(bv) and bv.shape == (vocab,)):
        return None
    if xv.dtype not in FLOAT_DTYPES or any((v.dtype != xv.dtype and not cast) or v.dtype not in FLOAT_DTYPES
                                          or v.device != xv.device for v in (wv, bv) if v is not None):
        return None
    rows_of_x = torch.empty(xv.shape, device="meta")
    for index in slices:
        rows_of_x = rows_of_x[index]
    if rows_of_x.numel() != lv.shape[0] * wv.shape[1]:
        return None
    return node, chain, slices, args


def _enters_autocast(gm):
    return any("autocast" in str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _autocast_dtype(device):
    """The dtype the caller's autocast runs a linear in on `device`, or None where it is off there."""
    kind = device.type
    return torch.get_autocast_dtype(kind) if torch._C._is_any_autocast_enabled() and \
        torch.is_autocast_enabled(kind) else None


def fuse_linear_cross_entropy(gm):
    """Rewrite every linear -> cross_entropy of `gm` (a Dynamo GraphModule) that qualifies; returns the Rewrites."""
    from brrr.compile.matmul import linear_cross_entropy as op

    if _enters_autocast(gm):   # autocast regions inside the graph choose dtypes op by op: leave it
        return []
    done = []
    for ce in list(gm.graph.nodes):
        if not (ce.op == "call_function" and ce.target in _CROSS_ENTROPY):
            continue
        found = _match(ce, cast=torch._C._is_any_autocast_enabled())
        if found is None:
            continue
        linear, chain, slices, args = found
        x, weight = linear.args[0], linear.args[1]
        bias = linear.args[2] if len(linear.args) > 2 else linear.kwargs.get("bias")
        xv, wv, bv, lv = _val(x), _val(weight), _val(bias), _val(args["input"])
        cast = _autocast_dtype(xv.device)
        if cast is None and any(v.dtype != xv.dtype for v in (wv, bv) if v is not None):
            continue   # autocast is on for another device only: the operands keep their own, unequal dtypes
        dtype = cast or xv.dtype   # what the linear computes in
        size = torch.empty((), dtype=dtype).element_size()
        rows, hidden, vocab = lv.shape[0], wv.shape[1], wv.shape[0]
        # the logits, and the float32 copy cross_entropy makes of them (autocast's, or the chain's upcast)
        upcast = 4 if cast is not None and dtype != torch.float32 else (lv.element_size() if lv.dtype != dtype else 0)
        held = rows * vocab * (size + upcast)
        if held < MIN_LOGITS_BYTES:
            continue
        train = _val(ce).requires_grad   # Dynamo traced under grad mode, with some input requiring grad
        grads = (train and xv.requires_grad, train and wv.requires_grad,
                 train and bv is not None and bv.requires_grad)
        g = gm.graph
        with g.inserting_before(ce):
            for index in slices:   # logits[..., :-1, :] is linear(x[..., :-1, :])
                x = g.call_function(operator.getitem, (x, index))
            flat = g.call_method("reshape", (x, rows, hidden))
            if cast is not None:   # autocast's casts, made explicit: the op is not autocast's to cast
                flat, weight = g.call_method("to", (flat, cast)), g.call_method("to", (weight, cast))
                bias = g.call_method("to", (bias, cast)) if bias is not None else None
            options = (args["ignore_index"], args["reduction"], float(args["label_smoothing"]))
            if train:   # gradients computed in the forward, where each chunk's logits are at hand
                fused = g.call_function(torch.ops.brrr.fused_linear_cross_entropy_with_grads.default,
                                        (flat, weight, bias, args["target"], *options, *grads, _val(ce).dtype))
            else:
                fused = g.call_function(torch.ops.brrr.fused_linear_cross_entropy.default,
                                        (flat, weight, bias, args["target"], *options, _val(ce).dtype))
            loss = g.call_function(operator.getitem, (fused, 0))
        ce.replace_all_uses_with(loss)
        for node in [ce, *chain, linear]:
            g.erase_node(node)
        chunk = op.chunk_rows(rows, vocab, hidden, size)
        done.append(Rewrite(linear.name, rows, hidden, vocab, chunk, held, op.transposed_logits(vocab, size),
                            cast))
        REWRITES.append(done[-1])
        del REWRITES[:-1000]
    if done:
        g.lint()
        gm.recompile()
    return done
