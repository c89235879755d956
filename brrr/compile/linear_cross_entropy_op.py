"""Linear + cross-entropy in chunks of rows, never holding the logits (capture -> linear_cross_entropy_pass puts
this op in the graph -> AOTAutograd -> lower, where it is an Extern -> runtime calls it).

    loss, grad_x, grad_weight, grad_bias = torch.ops.brrr.fused_linear_cross_entropy(
        x, weight, bias, target, ignore_index, reduction, label_smoothing, grad_x, grad_weight, grad_bias, dtype)

is `cross_entropy(x @ weight.T + bias, target, ...)` for 2-D `x` [rows, hidden] (a target outside the
vocabulary, which eager refuses with an error, gives a nan loss and nan gradients here), with the gradients of the loss
(scaled for a gradient of 1) asked for by the three flags; those not asked for come back empty. Its autograd
formula only scales them by the loss's gradient: the loss is a scalar ('mean' or 'sum'), so each gradient is
linear in it. So a training step keeps no logits for the backward and recomputes none.

Per chunk of rows (chunk_rows): one matmul makes the chunk's logits (cuBLAS, in x's dtype, as the unfused linear does); one
Triton kernel reads each row twice (online max and sum-exp with the target logit, then the gradient
softmax - one-hot, written over the logits in place); then the chunk's input-gradient rows (one matmul) and the
weight's gradient (one matmul accumulated into it, beta=1). Peak memory holds one chunk of logits, not all rows.
Where Triton cannot run (a CPU tensor without TRITON_INTERPRET=1, as when explain runs a graph) the per-row math
runs as torch ops, chunk by chunk alike.
"""

import os
from typing import Optional, Tuple

import torch
import torch.utils.flop_counter

CHUNK_BYTES = 256 << 20   # logits of one chunk, in x's dtype
ROWS_PER_HIDDEN = 2       # a chunk has at least this many rows per hidden unit (see chunk_rows)
ROW_BLOCK = 2048          # vocabulary entries one kernel step reads


def chunk_rows(rows, vocab, hidden, itemsize):
    """Rows per chunk, a power of two: as many as CHUNK_BYTES of logits hold, but at least ROWS_PER_HIDDEN x hidden.

    Each chunk adds its weight gradient into the whole [vocab, hidden] accumulator: 4 x vocab x hidden bytes read
    and written, against 6 x chunk x vocab bytes the row kernel moves. At 2 rows per hidden unit the
    accumulation costs a third of the kernel's traffic (Qwen2-0.5B's head: 2048-row chunks, 0.6 GB of logits each,
    where the memory budget alone would cut 512-row chunks and pay more for accumulating than for the kernel)."""
    by_memory = max(16, CHUNK_BYTES // max(1, vocab * itemsize))
    by_weight = ROWS_PER_HIDDEN * hidden
    fit = max(1 << (by_memory.bit_length() - 1), 1 << max(0, by_weight - 1).bit_length())
    return max(1, min(rows, fit))


def _triton_runs(t):
    return t.is_cuda or (t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def _row_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def brrr_cross_entropy_rows(logits_ptr, row_stride, target_ptr, loss_ptr, scale_ptr, vocab, ignore_index,
                                smoothing, WRITE_GRAD: tl.constexpr, SMOOTH: tl.constexpr,
                                BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * row_stride
        cols = tl.arange(0, BLOCK)
        big = tl.full([BLOCK], float("-inf"), tl.float32)
        run_max = big
        run_sum = tl.zeros([BLOCK], tl.float32)
        total = tl.zeros([BLOCK], tl.float32)
        for start in range(0, vocab, BLOCK):
            mask = start + cols < vocab
            v = tl.load(base + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(run_max, v)
            # a lane that has seen nothing finite shifts by 0, not by -inf: its sum stays 0, not nan
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - shift) + tl.exp(v - shift)
            run_max = new_max
            if SMOOTH:
                total += tl.where(mask, v, 0.0)
        row_max = tl.max(run_max, 0)
        lse = row_max + tl.log(tl.sum(run_sum * tl.exp(run_max - row_max), 0))
        target = tl.load(target_ptr + row)
        ignored = target == ignore_index
        known = (target >= 0) & (target < vocab)   # eager raises on another class; here it reads as nan
        picked = tl.load(base + tl.where(known, target, 0)).to(tl.float32)
        loss = tl.where(known, lse - picked, float("nan"))
        if SMOOTH:
            loss = (1.0 - smoothing) * loss + smoothing * (lse - tl.sum(total, 0) / vocab)
        tl.store(loss_ptr + row, tl.where(ignored, 0.0, loss))
        if WRITE_GRAD:
            scale = tl.where(ignored, 0.0, tl.where(known, tl.load(scale_ptr), float("nan")))
            for start in range(0, vocab, BLOCK):
                mask = start + cols < vocab
                v = tl.load(base + start + cols, mask=mask, other=0.0).to(tl.float32)
                g = tl.exp(v - lse) - tl.where(start + cols == target, 1.0 - smoothing, 0.0)
                if SMOOTH:
                    g = g - smoothing / vocab
                tl.store(base + start + cols, (g * scale).to(logits_ptr.dtype.element_ty), mask=mask)

    return brrr_cross_entropy_rows


_KERNEL = []


def _rows_triton(logits, target, loss, scale, ignore_index, smoothing, write_grad):
    if not _KERNEL:
        _KERNEL.append(_row_kernel())
    rows, vocab = logits.shape
    if rows == 0:
        return
    block = min(ROW_BLOCK, 1 << max(4, (vocab - 1).bit_length()))
    _KERNEL[0][(rows,)](logits, logits.stride(0), target, loss, scale, vocab, ignore_index, float(smoothing),
                        WRITE_GRAD=write_grad, SMOOTH=smoothing != 0, BLOCK=block,
                        num_warps=8 if block >= 1024 else 4)


def _rows_torch(logits, target, loss, scale, ignore_index, smoothing, write_grad):
    """The same per-row math as torch ops (devices Triton cannot run on)."""
    values = logits if logits.dtype == torch.float64 else logits.float()
    ignored = target == ignore_index
    known = (target >= 0) & (target < values.shape[1])
    picked_at = torch.where(known, target, 0).unsqueeze(1)
    lse = torch.logsumexp(values, 1)
    row_loss = torch.where(known, lse - values.gather(1, picked_at).squeeze(1), float("nan"))
    if smoothing:
        row_loss = (1 - smoothing) * row_loss + smoothing * (lse - values.mean(1))
    loss.copy_(torch.where(ignored, 0.0, row_loss))
    if write_grad:
        grad = torch.exp(values - lse.unsqueeze(1))
        grad.scatter_add_(1, picked_at, torch.full_like(picked_at, -(1.0 - smoothing), dtype=grad.dtype))
        if smoothing:
            grad -= smoothing / values.shape[1]
        row_scale = torch.where(ignored, 0.0, torch.where(known, scale, float("nan")))
        logits.copy_(grad * row_scale.unsqueeze(1))


def _check(x, weight, bias, target, reduction):
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"fused_linear_cross_entropy: x {list(x.shape)} and weight {list(weight.shape)} "
                         "must be [rows, hidden] and [vocab, hidden]")
    if target.shape != (x.shape[0],):
        raise ValueError(f"fused_linear_cross_entropy: target {list(target.shape)} for {x.shape[0]} rows")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"fused_linear_cross_entropy: bias {list(bias.shape)} for vocab {weight.shape[0]}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"fused_linear_cross_entropy: reduction {reduction!r} (only 'mean' and 'sum')")


def _empty(like):
    return like.new_empty(0)


@torch.library.custom_op("brrr::fused_linear_cross_entropy", mutates_args=())
def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                               target: torch.Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                               grad_x: bool, grad_weight: bool, grad_bias: bool, dtype: torch.dtype
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(x, weight, bias, target, reduction)
    rows, vocab = x.shape[0], weight.shape[0]
    # the kernel computes in fp32; float64 (a direct caller's, never the pass's) keeps its precision in torch ops
    run_rows = _rows_triton if _triton_runs(x) and x.dtype != torch.float64 else _rows_torch
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    ignored = target == ignore_index
    if reduction == "mean":
        scale = 1.0 / (~ignored).sum(dtype=acc).reshape(1)   # no host sync: it stays a tensor
    else:
        scale = torch.ones(1, dtype=acc, device=x.device)
    row_loss = torch.empty(rows, dtype=acc, device=x.device)
    gx = torch.empty_like(x, memory_format=torch.contiguous_format) if grad_x else _empty(x)
    gw = torch.zeros_like(weight, memory_format=torch.contiguous_format) if grad_weight else _empty(weight)
    gb = torch.zeros(vocab, dtype=acc, device=x.device) if grad_bias else _empty(x)
    write_grad = grad_x or grad_weight or grad_bias
    step = chunk_rows(rows, vocab, x.shape[1], x.element_size())
    # logits rows of a vocabulary that is not a multiple of 16 bytes would send every matmul here to cuBLAS's
    # slow unaligned kernels: the weight gets zero rows, the logits a padded row stride, and the kernel and the
    # gradient matmuls read the real columns through that stride
    pad = (-vocab) % max(1, 16 // x.element_size())
    weight_t = (torch.nn.functional.pad(weight, (0, 0, 0, pad)) if pad else weight).t()
    bias_row = torch.nn.functional.pad(bias, (0, pad)) if pad and bias is not None else bias
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        xc = x[start:stop]
        logits = xc @ weight_t if bias is None else torch.addmm(bias_row, xc, weight_t)
        logits = logits[:, :vocab]
        run_rows(logits, target[start:stop], row_loss[start:stop], scale, ignore_index, label_smoothing,
                 write_grad)
        if grad_x:
            torch.mm(logits, weight, out=gx[start:stop])
        if grad_weight:
            gw.addmm_(logits.t(), xc)
        if grad_bias:
            gb += logits.sum(0, dtype=acc)
    loss = (row_loss.sum() * scale[0]).to(dtype)
    return loss, gx, gw, gb.to(bias.dtype) if grad_bias else gb


@fused_linear_cross_entropy.register_fake
def _(x, weight, bias, target, ignore_index, reduction, label_smoothing, grad_x, grad_weight, grad_bias, dtype):
    _check(x, weight, bias, target, reduction)
    return (x.new_empty((), dtype=dtype),
            torch.empty_like(x, memory_format=torch.contiguous_format) if grad_x else _empty(x),
            torch.empty_like(weight, memory_format=torch.contiguous_format) if grad_weight else _empty(weight),
            bias.new_empty(bias.shape) if grad_bias else _empty(x))


def _setup_context(ctx, inputs, output):
    _, gx, gw, gb = output
    ctx.asked = inputs[7:10]
    ctx.save_for_backward(gx, gw, gb)


def _backward(ctx, grad_loss, *_unused):
    saved = ctx.saved_tensors
    gx, gw, gb = ((g * grad_loss).to(g.dtype) if asked else None for g, asked in zip(saved, ctx.asked))
    return gx, gw, gb, None, None, None, None, None, None, None, None


fused_linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)


@torch.utils.flop_counter.register_flop_formula(torch.ops.brrr.fused_linear_cross_entropy)
def _flops(x_shape, weight_shape, bias_shape, target_shape, ignore_index, reduction, label_smoothing, grad_x,
           grad_weight, grad_bias, dtype, out_shape=None, **kwargs) -> int:
    """The matmuls' FLOPs (the logits, and each gradient asked for), as torch.utils.flop_counter counts mm."""
    rows, hidden = x_shape
    return 2 * rows * hidden * weight_shape[0] * (1 + bool(grad_x) + bool(grad_weight))
