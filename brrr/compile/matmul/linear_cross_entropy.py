"""Linear + cross-entropy in chunks of rows, never holding the logits (capture -> passes/linear_cross_entropy.py puts
these ops in the graph -> AOTAutograd -> lower, where they are Externs -> runtime calls them).

    loss, grad_x, grad_weight, grad_bias = torch.ops.brrr.fused_linear_cross_entropy_with_grads(
        x, weight, bias, target, ignore_index, reduction, label_smoothing, grad_x, grad_weight, grad_bias, dtype)
    loss, lse = torch.ops.brrr.fused_linear_cross_entropy(
        x, weight, bias, target, ignore_index, reduction, label_smoothing, dtype)

Both are `cross_entropy(x @ weight.T + bias, target, ...)` for 2-D `x` [rows, hidden] (a target outside the
vocabulary, which eager refuses with an error, gives a nan loss and nan gradients here).

Training (the pass's choice where the loss requires grad): `_with_grads` computes the gradients in the forward,
for a loss gradient of 1, while each chunk's logits are at hand; its autograd formula scales them by the loss's
gradient (the loss is a scalar, 'mean' or 'sum', so each gradient is linear in it). Three matmuls, as eager's
step, and the same bytes as brrr's unfused softmax and its backward; only a chunk of logits is ever held.
Inference: the plain op computes the loss and one log-sum-exp per row; called with grad, its autograd formula
(`fused_linear_cross_entropy_backward`) recomputes each chunk's logits. The pass uses it where the loss needs
no gradient (a graph compiled under no_grad).

Per chunk of rows (`chunk_rows`): one matmul makes the chunk's logits (cuBLAS, in x's dtype, as the unfused
linear does); one Triton kernel reads each row once (online max and sum-exp, the target logit, the row sum for
label smoothing); for gradients, one more reads each row again and writes softmax - one-hot, times the loss's
gradient over the count for a mean, over it in place; then the input-gradient rows (one matmul) and the weight's
gradient (one matmul; over several chunks summed in an fp32 buffer, the first chunk written over it (beta=0,
no zero fill), the others added (beta=1), rounded once at the end).
A vocabulary whose logits rows are not 16-byte aligned has its logits made transposed, [vocab, rows] (`_Head`):
the row kernels then read [vocabulary x rows] tiles, the statistics split over segments of the vocabulary. Where
Triton cannot run (a CPU tensor without TRITON_INTERPRET=1, as when explain runs a graph) the per-row math runs as
torch ops.
"""

import os
from typing import Optional, Tuple

import torch
import torch.utils.flop_counter

from brrr.compile.ir.sizes import cdiv
from brrr.compile.passes.pad_matmuls import ALIGN_BYTES, alignment_bytes

CHUNK_BYTES = 256 << 20   # logits of one chunk, in x's dtype
ROWS_PER_HIDDEN = 2       # a chunk has at least this many rows per hidden unit (see chunk_rows)
ROW_BLOCK = 2048          # vocabulary entries one kernel step reads


def chunk_rows(rows, vocab, hidden, itemsize):
    """Rows per chunk, a power of two: as many as CHUNK_BYTES of logits hold, but at least ROWS_PER_HIDDEN x hidden.

    Each chunk adds its weight gradient into the whole [vocab, hidden] accumulator: 4 x vocab x hidden bytes read
    and written, against 4 x chunk x vocab bytes the gradient's row kernel moves. At 2 rows per hidden unit the
    accumulation costs half the kernel's traffic (Qwen2-0.5B's head: 2048-row chunks, 0.6 GB of logits each,
    where the memory budget alone would cut 512-row chunks and pay twice the kernel's traffic accumulating)."""
    by_memory = max(16, CHUNK_BYTES // max(1, vocab * itemsize))
    by_weight = ROWS_PER_HIDDEN * hidden
    fit = max(1 << (by_memory.bit_length() - 1), 1 << max(0, by_weight - 1).bit_length())
    return max(1, min(rows, fit))


def transposed_logits(vocab, itemsize):
    """Whether chunks of logits over `vocab` classes in a dtype of `itemsize` bytes are made [vocab, rows]: a row
    of them would not be a 16-byte multiple (see _Head)."""
    return alignment_bytes(vocab, itemsize) < ALIGN_BYTES


def _triton_runs(t):
    return t.dtype != torch.float64 and (
        t.is_cuda or (t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"))


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def brrr_cross_entropy_rows(logits_ptr, row_stride, target_ptr, loss_ptr, lse_ptr, vocab, ignore_index,
                                smoothing, SMOOTH: tl.constexpr, BLOCK: tl.constexpr, STRIDE_ALIGN: tl.constexpr):
        # each step's block read as [BLOCK / 8, 8]: a thread's 8 contiguous values share one max, so the running
        # sum takes one exp a value and one rescale per 8 (81% of copy on an H200, against 64% with a running
        # max per value: the per-value bookkeeping, not the bytes, bounded it)
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + tl.multiple_of(row * row_stride, STRIDE_ALIGN)
        cols = tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
        run_max = tl.full([BLOCK // 8], float("-inf"), tl.float32)
        run_sum = tl.zeros([BLOCK // 8], tl.float32)
        total = tl.zeros([BLOCK // 8], tl.float32)
        for start in range(0, vocab, BLOCK):
            mask = start + cols < vocab
            v = tl.load(base + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(run_max, tl.max(v, 1))
            # a group that has seen nothing finite shifts by 0, not by -inf: its sum stays 0, not nan
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(v - shift[:, None]), 1)
            run_max = new_max
            if SMOOTH:
                total += tl.sum(tl.where(mask, v, 0.0), 1)
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
        tl.store(lse_ptr + row, lse)

    @triton.jit
    def brrr_cross_entropy_rows_backward(logits_ptr, row_stride, target_ptr, lse_ptr, scale_ptr, vocab,
                                         ignore_index, smoothing, SMOOTH: tl.constexpr, BLOCK: tl.constexpr,
                                         STRIDE_ALIGN: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + tl.multiple_of(row * row_stride, STRIDE_ALIGN)
        cols = tl.arange(0, BLOCK)
        target = tl.load(target_ptr + row)
        ignored = target == ignore_index
        known = (target >= 0) & (target < vocab)
        scale = tl.where(ignored, 0.0, tl.where(known, tl.load(scale_ptr), float("nan")))
        lse = tl.load(lse_ptr + row)
        for start in range(0, vocab, BLOCK):
            mask = start + cols < vocab
            v = tl.load(base + start + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.exp(v - lse) - tl.where(start + cols == target, 1.0 - smoothing, 0.0)
            if SMOOTH:
                g = g - smoothing / vocab
            tl.store(base + start + cols, (g * scale).to(logits_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def brrr_cross_entropy_cols_partial(logits_ptr, vocab_stride, bias_ptr, cols, vocab, seg_len, max_ptr, sum_ptr,
                                        total_ptr, SMOOTH: tl.constexpr, HAS_BIAS: tl.constexpr, BV: tl.constexpr,
                                        BT: tl.constexpr):
        # logits transposed, [vocab, cols] with the columns contiguous (the bias, if any, not yet added): a program
        # takes BT columns over one segment of the vocabulary and leaves their partial max, sum-exp (and sum)
        t = tl.program_id(0) * BT + tl.arange(0, BT)
        seg = tl.program_id(1)
        tmask = t < cols
        rows = tl.arange(0, BV)
        run_max = tl.full([BT], float("-inf"), tl.float32)
        run_sum = tl.zeros([BT], tl.float32)
        total = tl.zeros([BT], tl.float32)
        for start in range(0, seg_len, BV):
            v = seg * seg_len + start + rows
            vmask = v < vocab
            mask = vmask[:, None] & tmask[None, :]
            x = tl.load(logits_ptr + v.to(tl.int64)[:, None] * vocab_stride + t[None, :], mask=mask,
                        other=float("-inf")).to(tl.float32)
            if HAS_BIAS:
                x += tl.load(bias_ptr + v, mask=vmask, other=0.0).to(tl.float32)[:, None]
            new_max = tl.maximum(run_max, tl.max(x, 0))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(x - shift[None, :]), 0)
            run_max = new_max
            if SMOOTH:
                total += tl.sum(tl.where(mask, x, 0.0), 0)
        col_max, col_sum = run_max, run_sum
        out = seg * cols + t
        tl.store(max_ptr + out, col_max, mask=tmask)
        tl.store(sum_ptr + out, col_sum, mask=tmask)
        if SMOOTH:
            tl.store(total_ptr + out, total, mask=tmask)

    @triton.jit
    def brrr_cross_entropy_cols(logits_ptr, vocab_stride, bias_ptr, cols, vocab, segments, max_ptr, sum_ptr,
                                total_ptr, target_ptr, loss_ptr, lse_ptr, ignore_index, smoothing,
                                SMOOTH: tl.constexpr, HAS_BIAS: tl.constexpr, BS: tl.constexpr,
                                BT: tl.constexpr):
        # the segments' partials read BS at a time ([BS, BT] tiles): one at a time, 256 segments took 43 us
        t = tl.program_id(0) * BT + tl.arange(0, BT)
        tmask = t < cols
        segs = tl.arange(0, BS)
        col_max = tl.full([BT], float("-inf"), tl.float32)
        for seg in range(0, segments, BS):
            at = (seg + segs)[:, None] * cols + t[None, :]
            smask = (seg + segs < segments)[:, None] & tmask[None, :]
            col_max = tl.maximum(col_max, tl.max(tl.load(max_ptr + at, mask=smask, other=float("-inf")), 0))
        shift = tl.where(col_max == float("-inf"), 0.0, col_max)
        col_sum = tl.zeros([BT], tl.float32)
        total = tl.zeros([BT], tl.float32)
        for seg in range(0, segments, BS):
            at = (seg + segs)[:, None] * cols + t[None, :]
            smask = (seg + segs < segments)[:, None] & tmask[None, :]
            part_max = tl.load(max_ptr + at, mask=smask, other=float("-inf"))
            part_sum = tl.load(sum_ptr + at, mask=smask, other=0.0)
            col_sum += tl.sum(part_sum * tl.exp(part_max - shift[None, :]), 0)
            if SMOOTH:
                total += tl.sum(tl.load(total_ptr + at, mask=smask, other=0.0), 0)
        lse = col_max + tl.log(col_sum)
        target = tl.load(target_ptr + t, mask=tmask, other=ignore_index)
        ignored = target == ignore_index
        known = (target >= 0) & (target < vocab)
        at = tl.where(known, target, 0)
        picked = tl.load(logits_ptr + at.to(tl.int64) * vocab_stride + t, mask=tmask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            picked += tl.load(bias_ptr + at, mask=tmask, other=0.0).to(tl.float32)
        loss = tl.where(known, lse - picked, float("nan"))
        if SMOOTH:
            loss = (1.0 - smoothing) * loss + smoothing * (lse - total / vocab)
        tl.store(loss_ptr + t, tl.where(ignored, 0.0, loss), mask=tmask)
        tl.store(lse_ptr + t, lse, mask=tmask)

    @triton.jit
    def brrr_cross_entropy_cols_backward(logits_ptr, vocab_stride, bias_ptr, cols, vocab, target_ptr, lse_ptr,
                                         scale_ptr, ignore_index, smoothing, SMOOTH: tl.constexpr,
                                         HAS_BIAS: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr):
        v = tl.program_id(0) * BV + tl.arange(0, BV)
        t = tl.program_id(1) * BT + tl.arange(0, BT)
        tmask = t < cols
        vmask = v < vocab
        mask = vmask[:, None] & tmask[None, :]
        target = tl.load(target_ptr + t, mask=tmask, other=ignore_index)
        ignored = target == ignore_index
        known = (target >= 0) & (target < vocab)
        scale = tl.where(ignored, 0.0, tl.where(known, tl.load(scale_ptr), float("nan")))
        lse = tl.load(lse_ptr + t, mask=tmask, other=0.0)
        ptrs = logits_ptr + v.to(tl.int64)[:, None] * vocab_stride + t[None, :]
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(bias_ptr + v, mask=vmask, other=0.0).to(tl.float32)[:, None]
        g = tl.exp(x - lse[None, :]) - tl.where(v[:, None] == target[None, :], 1.0 - smoothing, 0.0)
        if SMOOTH:
            g = g - smoothing / vocab
        tl.store(ptrs, (g * scale[None, :]).to(logits_ptr.dtype.element_ty), mask=mask)

    return (brrr_cross_entropy_rows, brrr_cross_entropy_rows_backward, brrr_cross_entropy_cols_partial,
            brrr_cross_entropy_cols, brrr_cross_entropy_cols_backward)


_KERNELS = []
# tiles (vocabulary entries x columns, contiguous) and warps, the fastest of a sweep on an H200 at GPT-2's head
# (benchmarks/NOTES.md): the statistics 75% of copy with one warp a program and 8192 programs (a [32, 64] tile
# over 4 warps, with a running max per value: 51%), the gradient 98%
COL_STATS = (64, 64, 1)
COL_GRADIENT = (32, 128, 4)
COL_PROGRAMS = 8192          # programs the column statistics aim for, splitting the vocabulary into segments


def _kernel(which):
    if not _KERNELS:
        _KERNELS.extend(_kernels())
    return _KERNELS[which]


def _stride_align(stride):
    """The largest power of two up to 16 dividing `stride` (in elements): what Triton may assume of each row's
    offset (it specializes only strides divisible by 16 itself; an aligned vocabulary of bf16 is a multiple of 8)."""
    return alignment_bytes(stride, 1)


def _launch(which, logits, *args, smoothing):
    rows, vocab = logits.shape
    if rows == 0:
        return
    block = min(ROW_BLOCK, 1 << max(4, (vocab - 1).bit_length()))
    warps = 4 if which == 0 or block < 1024 else 8   # as measured: statistics 4 (81% of copy), gradient 8 (92%)
    _kernel(which)[(rows,)](logits, logits.stride(0), *args, SMOOTH=smoothing != 0, BLOCK=block,
                            STRIDE_ALIGN=_stride_align(logits.stride(0)), num_warps=warps)


def _transposed(logits):
    """Whether [rows, vocab] logits are a view of transposed memory (each row's entries a row stride apart)."""
    return logits.stride(1) != 1 and logits.stride(0) == 1


def _cols_forward(logits, target, loss, lse, ignore_index, smoothing, bias):
    """_rows_forward's math over transposed logits: partial statistics per segment of the vocabulary, then one
    kernel combining them per column (a row of the logits)."""
    rows, vocab = logits.shape
    if rows == 0:
        return
    bv, bt, warps = COL_STATS
    col_blocks = cdiv(rows, bt)
    segments = max(1, min(cdiv(COL_PROGRAMS, col_blocks), cdiv(vocab, 4 * bv)))
    seg_len = cdiv(cdiv(vocab, segments), bv) * bv
    segments = cdiv(vocab, seg_len)
    parts = torch.empty(3 if smoothing else 2, segments, rows, dtype=torch.float32, device=logits.device)
    total = parts[2] if smoothing else parts[1]
    flags = dict(SMOOTH=smoothing != 0, HAS_BIAS=bias is not None)
    bias = bias if bias is not None else parts[0]
    _kernel(2)[(col_blocks, segments)](logits, logits.stride(1), bias, rows, vocab, seg_len, parts[0], parts[1],
                                       total, **flags, BV=bv, BT=bt, num_warps=warps)
    _kernel(3)[(cdiv(rows, 32),)](logits, logits.stride(1), bias, rows, vocab, segments, parts[0], parts[1], total,
                                  target, loss, lse, ignore_index, float(smoothing), **flags, BS=32, BT=32,
                                  num_warps=4)


def _cols_backward(logits, target, lse, scale, ignore_index, smoothing, bias):
    rows, vocab = logits.shape
    if rows == 0:
        return
    bv, bt, warps = COL_GRADIENT
    _kernel(4)[(cdiv(vocab, bv), cdiv(rows, bt))](
        logits, logits.stride(1), bias if bias is not None else lse, rows, vocab, target, lse, scale, ignore_index,
        float(smoothing), SMOOTH=smoothing != 0, HAS_BIAS=bias is not None, BV=bv, BT=bt, num_warps=warps)


def _torch_rows(logits, target, ignore_index):
    """For the torch-op path: the logits in a float type, and per row whether it is ignored, whether its target
    is a class, and the column to read (0 where it is not)."""
    values = logits if logits.dtype == torch.float64 else logits.float()
    known = (target >= 0) & (target < values.shape[1])
    return values, target == ignore_index, known, torch.where(known, target, 0).unsqueeze(1)


def _rows_forward(logits, target, loss, lse, ignore_index, smoothing, bias=None):
    """Per row: the loss (0 where ignored) into `loss`, the log-sum-exp into `lse`. `bias`: added to each row of
    transposed logits made without it (_Head.kernel_bias)."""
    if _triton_runs(logits) and _transposed(logits):
        _cols_forward(logits, target, loss, lse, ignore_index, smoothing, bias)
        return
    assert bias is None, "a bias is folded into the column kernels only"
    if _triton_runs(logits):
        _launch(0, logits, target, loss, lse, logits.shape[1], ignore_index, float(smoothing), smoothing=smoothing)
        return
    values, ignored, known, picked_at = _torch_rows(logits, target, ignore_index)
    row_lse = torch.logsumexp(values, 1)
    picked = values.gather(1, picked_at).squeeze(1)
    row_loss = torch.where(known, row_lse - picked, float("nan"))
    if smoothing:
        row_loss = (1 - smoothing) * row_loss + smoothing * (row_lse - values.mean(1))
    loss.copy_(torch.where(ignored, 0.0, row_loss))
    lse.copy_(row_lse)


def _rows_backward(logits, target, lse, scale, ignore_index, smoothing, bias=None):
    """Per row, over the logits in place: (softmax - smoothed one-hot) x scale, 0 where ignored. `bias` as for
    _rows_forward."""
    if _triton_runs(logits) and _transposed(logits):
        _cols_backward(logits, target, lse, scale, ignore_index, smoothing, bias)
        return
    assert bias is None, "a bias is folded into the column kernels only"
    if _triton_runs(logits):
        _launch(1, logits, target, lse, scale, logits.shape[1], ignore_index, float(smoothing),
                smoothing=smoothing)
        return
    values, ignored, known, picked_at = _torch_rows(logits, target, ignore_index)
    grad = torch.exp(values - lse.to(values.dtype).unsqueeze(1))
    grad.scatter_add_(1, picked_at, torch.full_like(picked_at, -(1.0 - smoothing), dtype=grad.dtype))
    if smoothing:
        grad -= smoothing / values.shape[1]
    row_scale = torch.where(ignored, 0.0, torch.where(known, scale.to(values.dtype), float("nan")))
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


def _accumulator(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class _Head:
    """The head's weight (and bias), and its chunks of logits.

    A vocabulary whose row of logits is not a 16-byte multiple (GPT-2's 50257) would send the matmuls here to
    cuBLAS's slow unaligned kernels if the logits were [rows, vocab] (the input gradient's, whose K is the
    vocabulary and whose operand's leading dim is then the vocabulary, ran 5.2x slower on an H200). For such a
    vocabulary each chunk's logits are made transposed, [vocab, rows] = weight @ x.T, over the chunk's rows
    padded with zero rows to an aligned count: every matmul's leading dims are then the hidden size or that row
    count, and the weight is read where it is (no padded copy of it, 74 MiB at GPT-2's head). The chunks are
    handed out as [rows, vocab] views of that memory; the row kernels read them through [vocabulary x rows]
    tiles and the gradient matmuls take them transposed. Such logits come without the bias where the column
    kernels add it (`kernel_bias`)."""

    def __init__(self, x, weight, bias):
        self.vocab = weight.shape[0]
        self.align = max(1, ALIGN_BYTES // x.element_size())   # rows a transposed chunk is padded to
        self.transposed = transposed_logits(self.vocab, x.element_size())
        self.weight, self.bias = weight, bias
        # transposed logits on Triton are made without the bias, which the column kernels add as they read: a
        # [vocab, 1] bias in addmm would be expanded into the whole chunk first (203 us at BERT's head)
        self.kernel_bias = bias if self.transposed and bias is not None and _triton_runs(x) else None
        self.step = chunk_rows(x.shape[0], self.vocab, x.shape[1], x.element_size())
        self.several = x.shape[0] > self.step   # chunks, whose weight gradients are summed

    def chunks(self, x):
        """(start, stop, chunk of x, its logits [chunk, vocab]) for each chunk of rows. A caller drops each
        chunk's logits before asking for the next: its loop variable would hold two chunks at once."""
        for start in range(0, x.shape[0], self.step):
            stop = min(x.shape[0], start + self.step)
            xc = x[start:stop]
            yield start, stop, xc, (self._transposed_logits(xc) if self.transposed else
                                    xc @ self.weight.t() if self.bias is None else
                                    torch.addmm(self.bias, xc, self.weight.t()))

    def _transposed_logits(self, xc):
        rows = xc.shape[0]
        pad = (-rows) % self.align
        xp = torch.nn.functional.pad(xc, (0, 0, 0, pad)) if pad else xc
        if self.bias is None or self.kernel_bias is not None:
            logits_t = self.weight @ xp.t()
        else:
            logits_t = torch.addmm(self.bias.unsqueeze(1), self.weight, xp.t())
        return logits_t[:, :rows].t()


def _loss(row_loss, target, ignore_index, reduction, dtype):
    loss = row_loss.sum()
    if reduction == "mean":   # a count of 0 gives nan, as eager's mean over no rows does
        loss = loss / (target != ignore_index).sum(dtype=row_loss.dtype)
    return loss.to(dtype)


def _scale(grad_loss, target, ignore_index, reduction, acc):
    """The loss's gradient per row's logits: grad_loss, over the count of rows for a mean (a tensor: no sync)."""
    scale = grad_loss.to(acc).reshape(1)
    return scale / (target != ignore_index).sum(dtype=acc) if reduction == "mean" else scale


_ADDMM_OUT_DTYPE = "dtype" in torch.ops.aten.addmm.overloads()   # cuBLAS's fp32 output from half inputs


def _gradient_buffers(x, head, grad_x, grad_weight, grad_bias):
    """The input's gradient; the weight's, in fp32 where half-precision chunks are summed
    (each sum rounded to bf16 would add one rounding per chunk to eager's one); the bias's, in fp32."""
    if not grad_weight:
        weight_grad = head.weight.new_empty(0)
    elif head.several:   # the first chunk's product is written over it (beta = 0): no zero fill of the sum
        weight_grad = torch.empty(head.weight.shape, dtype=_accumulator(x), device=x.device)
    else:
        weight_grad = torch.empty_like(head.weight, memory_format=torch.contiguous_format)
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if grad_x else x.new_empty(0),
            weight_grad,
            torch.zeros(head.vocab, dtype=_accumulator(x), device=x.device) if grad_bias else x.new_empty(0))


def _gradients_returned(gradients, head, bias):
    """The gradient buffers as the ops return them: the weight's and the bias's sums in their dtypes."""
    gx, gw, gb = gradients
    if gw.numel():
        gw = gw.to(head.weight.dtype)   # itself where no cast is needed
    return gx, gw, gb.to(bias.dtype) if gb.numel() else gb


def _accumulate(acc, a, b, first):
    """acc += a @ b (acc = a @ b for the `first` chunk: beta = 0 reads nothing of acc, NaN or not) with `acc` in
    fp32 and a, b in a half type: cuBLAS's fp32-output matmul where torch has one for the device, else a matmul of
    fp32 copies (the CPU, where tests run)."""
    beta = 0 if first else 1
    if acc.dtype == a.dtype:
        acc.addmm_(a, b, beta=beta)
    elif acc.is_cuda and _ADDMM_OUT_DTYPE:
        torch.addmm(acc, a, b, beta=beta, out_dtype=acc.dtype, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype), beta=beta)


def _add_gradients(grad_logits, start, stop, xc, head, gx, gw, gb):
    """One chunk's share, from its logits' gradient: its rows of the input's gradient, and its sums into the
    weight's and the bias's."""
    if gx.numel():
        torch.mm(grad_logits, head.weight, out=gx[start:stop])
    if gw.numel():
        if head.several:
            _accumulate(gw, grad_logits.t(), xc, first=start == 0)
        else:   # the only chunk: one product, rounded once
            torch.mm(grad_logits.t(), xc, out=gw)
    if gb.numel():
        gb += grad_logits.sum(0, dtype=gb.dtype)


@torch.library.custom_op("brrr::fused_linear_cross_entropy", mutates_args=())
def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                               target: torch.Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                               dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    _check(x, weight, bias, target, reduction)
    acc = _accumulator(x)
    row_loss = torch.empty(x.shape[0], dtype=acc, device=x.device)
    lse = torch.empty(x.shape[0], dtype=acc, device=x.device)
    head = _Head(x, weight, bias)
    for start, stop, _, logits in head.chunks(x):
        _rows_forward(logits, target[start:stop], row_loss[start:stop], lse[start:stop], ignore_index,
                      label_smoothing, head.kernel_bias)
        del logits
    return _loss(row_loss, target, ignore_index, reduction, dtype), lse


@fused_linear_cross_entropy.register_fake
def _(x, weight, bias, target, ignore_index, reduction, label_smoothing, dtype):
    _check(x, weight, bias, target, reduction)
    return x.new_empty((), dtype=dtype), x.new_empty(x.shape[0], dtype=_accumulator(x))


@torch.library.custom_op("brrr::fused_linear_cross_entropy_backward", mutates_args=())
def fused_linear_cross_entropy_backward(grad_loss: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                        bias: Optional[torch.Tensor], target: torch.Tensor, lse: torch.Tensor,
                                        ignore_index: int, reduction: str, label_smoothing: float, grad_x: bool,
                                        grad_weight: bool, grad_bias: bool
                                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scale = _scale(grad_loss, target, ignore_index, reduction, _accumulator(x))
    head = _Head(x, weight, bias)
    gx, gw, gb = _gradient_buffers(x, head, grad_x, grad_weight, grad_bias)
    if grad_x or grad_weight or grad_bias:
        for start, stop, xc, logits in head.chunks(x):
            _rows_backward(logits, target[start:stop], lse[start:stop], scale, ignore_index, label_smoothing,
                           head.kernel_bias)
            _add_gradients(logits, start, stop, xc, head, gx, gw, gb)
            del logits
    return _gradients_returned((gx, gw, gb), head, bias)


@fused_linear_cross_entropy_backward.register_fake
def _(grad_loss, x, weight, bias, target, lse, ignore_index, reduction, label_smoothing, grad_x, grad_weight,
      grad_bias):
    head = _Head(x, weight, bias)
    return _gradients_returned(_gradient_buffers(x, head, grad_x, grad_weight, grad_bias), head, bias)


def _setup_context(ctx, inputs, output):
    x, weight, bias, target, ignore_index, reduction, label_smoothing, _ = inputs
    ctx.save_for_backward(x, weight, bias, target, output[1])
    ctx.options = (ignore_index, reduction, label_smoothing)


def _backward(ctx, grad_loss, _grad_lse):
    x, weight, bias, target, lse = ctx.saved_tensors
    asked = ctx.needs_input_grad
    gx, gw, gb = torch.ops.brrr.fused_linear_cross_entropy_backward(
        grad_loss, x, weight, bias, target, lse, *ctx.options, asked[0], asked[1], bias is not None and asked[2])
    return (gx if asked[0] else None, gw if asked[1] else None, gb if bias is not None and asked[2] else None,
            None, None, None, None, None)


fused_linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("brrr::fused_linear_cross_entropy_with_grads", mutates_args=())
def fused_linear_cross_entropy_with_grads(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                                          target: torch.Tensor, ignore_index: int, reduction: str,
                                          label_smoothing: float, grad_x: bool, grad_weight: bool, grad_bias: bool,
                                          dtype: torch.dtype
                                          ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(x, weight, bias, target, reduction)
    acc = _accumulator(x)
    row_loss = torch.empty(x.shape[0], dtype=acc, device=x.device)
    lse = torch.empty(x.shape[0], dtype=acc, device=x.device)
    scale = _scale(torch.ones((), dtype=acc, device=x.device), target, ignore_index, reduction, acc)
    head = _Head(x, weight, bias)
    gx, gw, gb = _gradient_buffers(x, head, grad_x, grad_weight, grad_bias)
    for start, stop, xc, logits in head.chunks(x):
        _rows_forward(logits, target[start:stop], row_loss[start:stop], lse[start:stop], ignore_index,
                      label_smoothing, head.kernel_bias)
        _rows_backward(logits, target[start:stop], lse[start:stop], scale, ignore_index, label_smoothing,
                       head.kernel_bias)
        _add_gradients(logits, start, stop, xc, head, gx, gw, gb)
        del logits
    return (_loss(row_loss, target, ignore_index, reduction, dtype),) + \
        _gradients_returned((gx, gw, gb), head, bias)


@fused_linear_cross_entropy_with_grads.register_fake
def _(x, weight, bias, target, ignore_index, reduction, label_smoothing, grad_x, grad_weight, grad_bias, dtype):
    _check(x, weight, bias, target, reduction)
    head = _Head(x, weight, bias)
    return (x.new_empty((), dtype=dtype),) + _gradients_returned(
        _gradient_buffers(x, head, grad_x, grad_weight, grad_bias), head, bias)


def _setup_with_grads(ctx, inputs, output):
    ctx.save_for_backward(*output[1:])
    ctx.asked = inputs[7:10]


def _backward_with_grads(ctx, grad_loss, *_unused):
    """The gradients were computed for a loss gradient of 1: scaled, they are the gradients."""
    grads = [(g * grad_loss).to(g.dtype) if asked else None for g, asked in zip(ctx.saved_tensors, ctx.asked)]
    return (*grads, None, None, None, None, None, None, None, None)


fused_linear_cross_entropy_with_grads.register_autograd(_backward_with_grads, setup_context=_setup_with_grads)


def _matmul_flops(rows, hidden, vocab):
    return 2 * rows * hidden * vocab


@torch.utils.flop_counter.register_flop_formula(torch.ops.brrr.fused_linear_cross_entropy)
def _forward_flops(x_shape, weight_shape, *args, out_shape=None, **kwargs) -> int:
    """The logits' matmul, as torch.utils.flop_counter counts mm."""
    return _matmul_flops(*x_shape, weight_shape[0])


@torch.utils.flop_counter.register_flop_formula(torch.ops.brrr.fused_linear_cross_entropy_backward)
def _backward_flops(grad_shape, x_shape, weight_shape, bias_shape, target_shape, lse_shape, ignore_index,
                    reduction, label_smoothing, grad_x, grad_weight, grad_bias, out_shape=None, **kwargs) -> int:
    """The logits' matmul again, and one per gradient asked for (the bias's is a sum, not counted)."""
    if not (grad_x or grad_weight or grad_bias):
        return 0
    return _matmul_flops(*x_shape, weight_shape[0]) * (1 + bool(grad_x) + bool(grad_weight))


@torch.utils.flop_counter.register_flop_formula(torch.ops.brrr.fused_linear_cross_entropy_with_grads)
def _with_grads_flops(x_shape, weight_shape, bias_shape, target_shape, ignore_index, reduction, label_smoothing,
                      grad_x, grad_weight, grad_bias, dtype, out_shape=None, **kwargs) -> int:
    """The logits' matmul, and one per gradient asked for."""
    return _matmul_flops(*x_shape, weight_shape[0]) * (1 + bool(grad_x) + bool(grad_weight))
