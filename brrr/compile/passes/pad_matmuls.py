"""Matmul operands padded to aligned leading dimensions (capture -> **pad** -> lower -> schedule -> codegen).

cuBLAS picks its fast kernels only when the leading dimension of each operand and of the output is a multiple
of 16 bytes. GPT-2's LM head has vocab 50257: its three matmuls ran cuBLAS's `align1` kernels on the H100 at
4.3-6.6 ms each, ~5x an aligned matmul of the same size. Before lowering, each mm / addmm / bmm / baddbmm whose
operand or output has an unaligned leading dimension is rewritten, when the cost model says it pays:

    mm(A, B)  ->  mm(pad(A), pad(B))[:M, :N]

- A dim is padded with zeros up to the alignment: K in both operands (the zeros add nothing), M in A and N in
  B (the extra rows and columns of the result are sliced off). Which dims need it follows from the operands'
  strides: a row-major [M, K] operand leads with K, a transposed (column-major) one with M.
- The pad is `constant_pad_nd`, a pointwise node: brrr fuses it into the operand's producer or computes it
  from there. An operand that is a transpose of a 2-D tensor is padded before the transpose, so the padded
  copy keeps the memory order the matmul reads (a transposed view with an aligned leading dimension) and two
  matmuls reading one tensor both ways share one pad (GPT-2's backward reads the logits' gradient as it is
  and transposed).
- Slicing off padded rows keeps a contiguous result; slicing off padded columns does not, so a `clone` to
  the original layout follows. Every node after the matmul sees exactly the strides it was traced with, and
  the clone, a pointwise node, is fused into its readers when they are brrr kernels.

The cost model: an unaligned matmul on tensor cores (bf16, fp16, fp32 as TF32) takes UNALIGNED_SLOWDOWN[alignment]
times an aligned one, by the worst leading dimension's alignment in bytes (measured on the H100, bf16, an LM head's
three matmuls at 8192 x 768: 4.5-6.6x at 2 bytes, 2.6-2.8x at 4, 2.4-2.5x at 8; the table is a little under). An
IEEE fp32 matmul (TF32 off) runs cuBLAS's SIMT kernels, which alignment barely slows: fp32 DistilBERT's 30522-wide
LM head ran its matmuls 0.1 ms faster padded, beside 0.29 ms of copy kernels eager does not run (H200,
`results/probes/2026-11-29-h200-3974af1-where-does-brrr-lose-time-to-eager.log`), so it is not padded; the padded one its padded
FLOPs at the device's matmul peak plus each pad's bytes (read and written) at its bandwidth and PAD_LAUNCH_S
per pad kernel. Datasheet figures (brrr.cost)
give the ratio; the decision does not depend on measuring this machine. Each decision, padded or not, is kept
on the graph (`gm.meta[DECISIONS]`) and listed by `brrr explain`. BRRR_PAD_MATMULS=0 turns padding off.
"""

from dataclasses import dataclass

import os

import torch

from brrr.compile.ir.sizes import hint, known_true

aten = torch.ops.aten

DECISIONS = "brrr_matmul_padding"
ALIGN_BYTES = 16
UNALIGNED_SLOWDOWN = {2: 4.0, 4: 2.3, 8: 2.2}   # alignment of the worst leading dimension, bytes -> x
PAD_LAUNCH_S = 5e-6
PAD_DEVICES = ("cuda",)
_MATMULS = {aten.mm.default: 2, aten.addmm.default: 2, aten.bmm.default: 3, aten.baddbmm.default: 3}
_TRANSPOSES = {aten.permute.default, aten.t.default, aten.transpose.int}


@dataclass
class Padding:
    node: str          # the matmul's FX node name
    op: str
    shape: str         # "[M, K] @ [K, N]"
    dims: dict         # dim name -> (size, padded size); empty when not padded
    padded: bool
    reason: str        # the cost model's figures

    def __str__(self):
        pads = ", ".join(f"{d} {a} -> {b}" for d, (a, b) in self.dims.items())
        return f"{self.op} {self.node} {self.shape}: {'padded ' + pads if self.padded else 'not padded'}; " \
               f"{self.reason}"


def _val(n):
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def _tensor(t):
    return isinstance(t, torch.Tensor)


def _round_up(n, m):
    return (n + m - 1) // m * m


def alignment_bytes(elements, item):
    """The largest power of two (at most ALIGN_BYTES) dividing a leading dimension of `elements`, in bytes (of a
    symbolic one, the largest the ShapeEnv proves)."""
    if type(elements) is not int:
        return next((a for a in (16, 8, 4, 2) if a <= ALIGN_BYTES and known_true(elements * item % a == 0)), 1)
    b = elements * item
    return min(b & -b, ALIGN_BYTES) if b else ALIGN_BYTES


def _lead_alignment(t, lead):
    """The alignment in bytes of matrix t's leading dimension (ALIGN_BYTES for a vector)."""
    if any(known_true(s == 1) for s in t.shape[-2:]):
        return ALIGN_BYTES
    return alignment_bytes(t.stride()[-1 if lead == -2 else -2], t.element_size())


def _leading_dim(t):
    """Which of the last two dims sets the matrix's leading dimension (-2: column-major, -1: row-major), and
    whether that leading dimension is aligned. None when cuBLAS reads neither way (it copies such operands)."""
    size, stride = t.shape[-2:], t.stride()[-2:]
    align = ALIGN_BYTES // t.element_size()
    if known_true(size[0] == 1) or known_true(size[1] == 1):
        return -1, True   # a vector: no leading dimension to align
    if known_true(stride[1] == 1):
        return -1, known_true(stride[0] % align == 0)
    if known_true(stride[0] == 1):
        return -2, known_true(stride[1] % align == 0)
    return None


def _device_figures(device):
    """(matmul peak FLOP/s for the dtype, bandwidth B/s) from the datasheet of the device (H100's elsewhere)."""
    from brrr.cost.device import DATASHEETS, datasheet_for
    sheet = None
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            sheet = datasheet_for(torch.cuda.get_device_name(device))
        except Exception:
            sheet = None
    sheet = sheet or dict(DATASHEETS)["H100"]
    return sheet["matmul"], sheet["bandwidth"]


def _peak(matmul, dtype):
    from brrr.cost.device import _dtype_key
    return matmul.get(_dtype_key(dtype) or "bf16", matmul["bf16"])


def pad_matmuls(gm):
    """Rewrite gm's unaligned matmuls where padding pays (in place; idempotent). Returns the new decisions,
    which are also appended to gm.meta[DECISIONS]."""
    decisions, pads = [], {}
    if os.environ.get("BRRR_PAD_MATMULS") == "0":
        return decisions
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _MATMULS or node.meta.get(DECISIONS):
            continue
        node.meta[DECISIONS] = True   # a re-plan (a kernel forced to ATen) decides each matmul once
        decision = _consider(gm, node, pads)
        if decision is not None:
            decisions.append(decision)
    if any(d.padded for d in decisions):
        gm.graph.lint()
        gm.recompile()
    gm.meta.setdefault(DECISIONS, []).extend(decisions)
    return decisions


def _operands(node):
    """(bias or None, A, B) FX nodes of a matmul."""
    if node.target in (aten.addmm.default, aten.baddbmm.default):
        return node.args[0], node.args[1], node.args[2]
    return None, node.args[0], node.args[1]


def on_tensor_cores(dtype):
    """Whether cuBLAS runs a matmul of `dtype` on tensor cores under the current settings (fp32 only as TF32)."""
    return dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 or \
        torch.get_float32_matmul_precision() != "highest"


def _consider(gm, node, pads):
    bias, a, b = _operands(node)
    va, vb, out = _val(a), _val(b), _val(node)
    if not all(_tensor(v) for v in (va, vb, out)) or va.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    if out.device.type not in PAD_DEVICES:
        return None
    lead_a, lead_b = _leading_dim(va), _leading_dim(vb)
    if lead_a is None or lead_b is None:
        return None
    align = ALIGN_BYTES // va.element_size()
    m, k = va.shape[-2:]
    n = vb.shape[-1]
    need = set()
    if not lead_a[1]:
        need.add("M" if lead_a[0] == -2 else "K")
    if not lead_b[1]:
        need.add("K" if lead_b[0] == -2 else "N")
    if not known_true(n % align == 0) and not known_true(n == 1):
        need.add("N")   # ATen writes the result row-major: its leading dimension is N
    if not need:
        return None
    worst = min(_lead_alignment(va, lead_a[0]), _lead_alignment(vb, lead_b[0]),
                ALIGN_BYTES if known_true(n == 1) else alignment_bytes(n, out.element_size()))
    name = getattr(node.target, "__name__", str(node.target))
    shape = f"{list(va.shape)} @ {list(vb.shape)}"
    sizes = {"M": m, "K": k, "N": n}
    if any(type(sizes[d]) is not int for d in need):   # a pad of symbolic width is not built
        return Padding(node.name, name, shape, {}, False, f"{', '.join(sorted(need))} unaligned at symbolic sizes")
    # the price at the hint sizes (a symbolic M of tokens): a choice of speed, never a guard
    sizes = {d: hint(v) for d, v in sizes.items()}
    m, k, n = sizes["M"], sizes["K"], sizes["N"]
    dims = {d: (sizes[d], _round_up(sizes[d], align)) for d in sorted(need)}
    padded_size = {d: dims.get(d, (s, s))[1] for d, s in sizes.items()}
    batch = 1
    for s in out.shape[:-2]:
        batch *= hint(s)
    matmul, bandwidth = _device_figures(out.device)
    peak = _peak(matmul, va.dtype)
    flops = 2 * batch * m * n * k
    padded_flops = 2 * batch * padded_size["M"] * padded_size["N"] * padded_size["K"]
    item = va.element_size()
    pad_bytes, n_pads = 0, 0
    if "M" in dims or "K" in dims:
        pad_bytes += batch * (m * k + padded_size["M"] * padded_size["K"]) * item
        n_pads += 1
    if "K" in dims or "N" in dims:
        pad_bytes += batch * (k * n + padded_size["K"] * padded_size["N"]) * item
        n_pads += 1
    if "N" in dims:   # the clone back to the traced layout, when something stores it
        pad_bytes += 2 * batch * m * n * out.element_size()
        n_pads += 1
    tensor_cores = on_tensor_cores(va.dtype)
    unaligned_s = flops / peak * (UNALIGNED_SLOWDOWN.get(worst, 1.0) if tensor_cores else 1.0)
    padded_s = padded_flops / peak + pad_bytes / bandwidth + n_pads * PAD_LAUNCH_S
    why = f"predicted {unaligned_s * 1e3:.3f} ms unaligned, {padded_s * 1e3:.3f} ms padded"
    if not tensor_cores:
        why += " (IEEE fp32: SIMT kernels, alignment costs nothing)"
    if padded_s >= unaligned_s:
        return Padding(node.name, name, shape, dims, False, why)
    before, trial = set(gm.graph.nodes), dict(pads)
    try:
        _rewrite(gm, node, bias, a, b, dims, trial)
    except Exception as e:   # an optimization only: the matmul stays as it was
        for new in reversed([n for n in gm.graph.nodes if n not in before]):
            gm.graph.erase_node(new)
        return Padding(node.name, name, shape, dims, False, f"{why}; the rewrite failed: {type(e).__name__}")
    pads.update(trial)
    return Padding(node.name, name, shape, dims, True, why)


def _fake_mode(*vals):
    for v in vals:
        mode = getattr(v, "fake_mode", None)
        if mode is not None:
            return mode
    return None


def _call(gm, before, target, args, kwargs=None):
    """A new FX node `target(*args)` before `before`, with its meta value computed on fake tensors."""
    with gm.graph.inserting_before(before):
        node = gm.graph.call_function(target, tuple(args), kwargs or {})
    vals = torch.fx.node.map_arg(node.args, _val)
    kw = torch.fx.node.map_arg(node.kwargs, _val)
    mode = _fake_mode(*[v for v in vals if isinstance(v, torch.Tensor)])
    if mode is not None:
        with mode:
            node.meta["val"] = target(*vals, **kw)
    else:
        node.meta["val"] = target(*vals, **kw)
    for key in ("stack_trace", "nn_module_stack"):
        if key in before.meta:
            node.meta[key] = before.meta[key]
    return node


def _is_transpose(x):
    """Whether FX node x swaps the two dims of a 2-D tensor."""
    if x.op != "call_function" or x.target not in _TRANSPOSES or _val(x) is None or _val(x).dim() != 2:
        return False
    if x.target == aten.permute.default:
        return list(x.args[1]) == [1, 0]
    if x.target == aten.transpose.int:
        return x.args[1] % 2 != x.args[2] % 2
    return True


def _pad(gm, before, x, pad_last, pad_second, pads):
    """x with `pad_last` zeros after its last dim and `pad_second` after its second-to-last: padded before a
    transpose when x is one (see the module docstring). Shared between matmuls that pad the same tensor."""
    if not pad_last and not pad_second:
        return x
    if isinstance(x, torch.fx.Node) and _is_transpose(x):
        base = x.args[0]
        if _val(base) is not None and _val(base).dim() == 2:
            padded_base = _pad(gm, before, base, pad_second, pad_last, pads)
            key = ("t", padded_base)
            if key not in pads:
                pads[key] = _call(gm, before, aten.permute.default, [padded_base, [1, 0]])
            return pads[key]
    key = (x, pad_last, pad_second)
    if key not in pads:
        widths = [0, pad_last, 0, pad_second] if pad_second else [0, pad_last]
        pads[key] = _call(gm, before, aten.constant_pad_nd.default, [x, widths])
    return pads[key]


def _rewrite(gm, node, bias, a, b, dims, pads):
    grow = {d: padded - size for d, (size, padded) in dims.items()}
    pm, pk, pn = grow.get("M", 0), grow.get("K", 0), grow.get("N", 0)
    a2 = _pad(gm, node, a, pk, pm, pads)
    b2 = _pad(gm, node, b, pn, pk, pads)
    args = list(node.args)
    if bias is not None:
        vb = _val(bias)
        last = pn if vb.dim() >= 1 and not known_true(vb.shape[-1] == 1) else 0
        second = pm if vb.dim() >= 2 and not known_true(vb.shape[-2] == 1) else 0
        args[0] = _pad(gm, node, bias, last, second, pads)
        args[1], args[2] = a2, b2
    else:
        args[0], args[1] = a2, b2
    result = _call(gm, node, node.target, args, dict(node.kwargs))
    if pm:
        result = _call(gm, node, aten.slice.Tensor, [result, -2, 0, dims["M"][0]])
    if pn:
        result = _call(gm, node, aten.slice.Tensor, [result, -1, 0, dims["N"][0]])
        result = _call(gm, node, aten.clone.default, [result], {"memory_format": torch.contiguous_format})
    node.replace_all_uses_with(result)
    gm.graph.erase_node(node)
