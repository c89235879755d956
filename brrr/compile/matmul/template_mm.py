"""Runs the matmul template (codegen -> **runtime**): mm, addmm, bmm and baddbmm as brrr's own Triton kernel.

Not wired into the compiler yet (its matmuls are still ATen Externs, `lowering.core.EXTERN_OPS`): these entry points
call the template directly, for tests and for the later integration (epilogue fusion, autotuning against
cuBLAS). Each call picks the kernel source (dtype, epilogue, TF32 setting, 64-bit offsets, interpreter),
loads it through the runtime's kernel cache (`cache.load_kernel`: on disk by source, one module per source
in the process), allocates the output (or writes into `out`), computes the grid and launches through the JIT.
Sizes, strides and alpha/beta are kernel arguments, so a new shape or layout reuses the compiled kernel.

On a Hopper GPU (compute capability 9 or more) a 2-D product of 16-bit operands that TMA can read (one unit
stride each, the other a multiple of 16 bytes, 16-byte aligned) and at least one tile each way runs the TMA
persistent template (template_tma.py) instead; `tma=` forces the choice (tests run it in the
interpreter).

Semantics follow ATen's: `beta * bias + alpha * (a @ b)`, with the bias ignored (its NaNs too) when beta is 0;
an activation, if any, applies last. `out` must not overlap the operands.
"""

import contextlib
import os

import torch

from brrr.compile.cache import load_kernel
from brrr.compile.matmul.configs import default_config, tma_config
from brrr.compile.matmul.template import Activation, Bias, Scale, TL, chain, generate
from brrr.compile.matmul.template_tma import generate_tma

INT32_LIMIT = 2 ** 31
MAX_BLOCK = 256        # no config's tile side is longer: rows and columns past M, N stay within this of them
MAX_BATCH = 65535      # the CUDA grid's second axis
_KERNELS = {}          # (dtype, epilogue, tf32, wide, tma, interpreted, device, store) -> JITFunction
INTERPRETED_SMS = 3    # programs of the persistent kernel under the interpreter: each walks several tiles


def _device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _wide(tensors):
    """Whether some offset the kernel computes can reach 2**31 elements (then offsets are int64)."""
    for t in tensors:
        strides = [abs(s) for s in t.stride()]
        span = sum((n - 1) * s for n, s in zip(t.shape, strides) if n > 0)
        if span + MAX_BLOCK * max(strides, default=0) >= INT32_LIMIT:
            return True
    return False


def kernel(dtype, epilogue, tf32, wide, device, tma=False, store_descriptor=False):
    """The template's JITFunction for these choices, generated and loaded once per process."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    device_name = _device_name(device)
    key = (dtype, epilogue, tf32, wide, tma, interpreted, device_name, store_descriptor)
    if key not in _KERNELS:
        if tma:
            src = generate_tma(dtype, epilogue, wide=wide, interpreted=interpreted, store_descriptor=store_descriptor)
        else:
            src = generate(dtype, epilogue, tf32=tf32, wide=wide, interpreted=interpreted)
        _KERNELS[key] = load_kernel(src.source, src.name, device_name)
    return _KERNELS[key]


def _descriptor_view(x):
    """`x` (2-D) as TMA reads it: (view whose last stride is 1, transposed?), or None. TMA wants a 16-byte
    aligned base and the other stride a multiple of 16 bytes."""
    if x.data_ptr() % 16:
        return None
    if x.stride(1) == 1:
        view, transposed = x, False
    elif x.stride(0) == 1:
        view, transposed = x.t(), True
    else:
        return None
    if (view.stride(0) * view.element_size()) % 16:
        return None
    return view, transposed


def _tensor_descriptor():
    """Triton's host-side TMA descriptor class (Triton 3.4 and later), or None."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def _on_device(fn, grid, args, meta, device):
    """fn[grid](*args, **meta) with `device` current (a CUDA launch goes to the operands' GPU)."""
    context = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with context:
        fn[grid](*args, **meta)


def _hopper(device):
    """Whether `device` has TMA (compute capability 9 or more)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _tma_plan(a, b, config, tma):
    """(descriptors' views and orientations, tile) when the TMA template runs this product, else None.
    `tma`: None decides by the device (Hopper or later), True wherever the operands allow, False never."""
    if tma is False or _tensor_descriptor() is None:
        return None
    if tma is None and not _hopper(a.device):
        return None
    batch, m, k = a.shape
    n = b.shape[2]
    rule = tma_config(m, n, k, a.dtype, batch)
    if tma is None and rule is None:   # decided by the device: only problems the TMA tile suits
        return None
    tile = config or rule
    if tile is None or batch != 1 or a.dtype.itemsize != 2 or k == 0:
        return None
    a_view, b_view = _descriptor_view(a[0]), _descriptor_view(b[0])
    if a_view is None or b_view is None:
        return None
    return a_view, b_view, tile


def _launch_tma(a, b, out, epilogue, extra, plan, m, n, k):
    TensorDescriptor = _tensor_descriptor()
    (a2, a_t), (b2, b_t), tile = plan
    a_block = [tile.block_k, tile.block_m] if a_t else [tile.block_m, tile.block_k]
    b_block = [tile.block_n, tile.block_k] if b_t else [tile.block_k, tile.block_n]
    a_desc = TensorDescriptor.from_tensor(a2, a_block)
    b_desc = TensorDescriptor.from_tensor(b2, b_block)
    tensors = [a, b, out] + [x for x in extra if isinstance(x, torch.Tensor)]
    # the product leaves through a descriptor where the output takes one (row-major, 16-byte rows, aligned)
    out_view = _descriptor_view(out[0]) if out.dtype == a.dtype else None
    store_descriptor = out_view is not None and not out_view[1]
    fn = kernel(a.dtype, epilogue, False, _wide(tensors), a.device, tma=True, store_descriptor=store_descriptor)
    if a.device.type == "cuda":
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    else:
        sms = INTERPRETED_SMS
    # programs step through the tiles by NUM_SMS, the device's count (one compile per device): with fewer tiles
    # than SMs, program i runs tile i alone
    grid = (max(1, min(sms, tile.tiles(m, n))),)
    meta = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m, A_T=a_t,
                B_T=b_t, NUM_SMS=sms, num_warps=tile.num_warps, num_stages=tile.num_stages)
    out_arg = TensorDescriptor.from_tensor(out[0], [tile.block_m, tile.block_n // 2]) if store_descriptor else out
    args = (a_desc, b_desc, out_arg, *extra, m, n, k, out.stride(1), out.stride(2))
    _on_device(fn, grid, args, meta, a.device)
    return out


def launch(a, b, out, epilogue=None, epilogue_args=None, config=None, tma=None):
    """out[i] = epilogue(a[i] @ b[i]) for 3-D a [B, M, K], b [B, K, N], out [B, M, N] of one dtype, any strides
    (a batch stride of 0 broadcasts an operand). `epilogue_args`: keywords for `epilogue.bind`. `config`: a
    `configs.TileConfig`, else `default_config`'s (`tma_config`'s on the TMA template). `tma`: whether
    the TMA persistent template runs where the operands allow it (None: on Hopper GPUs)."""
    batch, m, k = a.shape
    n = b.shape[2]
    if b.shape[:2] != (batch, k) or tuple(out.shape) != (batch, m, n):
        raise ValueError(f"matmul template: shapes {tuple(a.shape)} @ {tuple(b.shape)} -> {tuple(out.shape)}")
    if not a.dtype == b.dtype == out.dtype:
        raise ValueError(f"matmul template: dtypes {a.dtype}, {b.dtype} -> {out.dtype} differ")
    if a.dtype not in TL:
        raise NotImplementedError(f"matmul template: dtype {a.dtype}")
    if batch > MAX_BATCH:
        raise NotImplementedError(f"matmul template: batch {batch} > {MAX_BATCH}")
    if batch == 0 or m == 0 or n == 0:
        return out
    extra = epilogue.bind(**(epilogue_args or {})) if epilogue is not None else ()
    tensors = [a, b, out] + [x for x in extra if isinstance(x, torch.Tensor)]
    if len({t.device for t in tensors}) > 1:
        raise ValueError(f"matmul template: tensors on several devices {sorted({str(t.device) for t in tensors})}")
    plan = _tma_plan(a, b, config, tma)
    if plan is not None:
        return _launch_tma(a, b, out, epilogue, extra, plan, m, n, k)
    tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    fn = kernel(a.dtype, epilogue, tf32, _wide(tensors), a.device)
    config = config or default_config(m, n, k, a.dtype, batch)
    grid = (config.tiles(m, n), batch)
    args = (a, b, out, *extra, m, n, k, *a.stride(), *b.stride(), *out.stride())
    _on_device(fn, grid, args, config.meta(k), a.device)
    return out


def _epilogue(bias, alpha, beta, activation):
    """The epilogue of `activation(beta * bias + alpha * acc)` and its bind keywords."""
    if bias is not None and beta != 0:
        first = Bias(scaled=alpha != 1 or beta != 1)
    elif alpha != 1:
        first = Scale()
    else:
        first = None
    return chain(first, Activation(activation) if activation else None), dict(bias=bias, alpha=alpha, beta=beta)


def _matmul(a3, b3, out, out_shape, bias, alpha, beta, activation, config, tma=None):
    batch, m, n = a3.shape[0], a3.shape[1], b3.shape[2]
    if out is None:
        out = torch.empty(out_shape, dtype=a3.dtype, device=a3.device)
    elif tuple(out.shape) != tuple(out_shape):
        raise ValueError(f"matmul template: out has shape {tuple(out.shape)}, not {tuple(out_shape)}")
    out3 = out if out.dim() == 3 else out.unsqueeze(0)
    if bias is not None and beta != 0:
        if bias.dtype != a3.dtype:
            raise ValueError(f"matmul template: bias dtype {bias.dtype} is not the operands' {a3.dtype}")
        bias = bias.expand(batch, m, n)
    epilogue, args = _epilogue(bias, alpha, beta, activation)
    launch(a3, b3, out3, epilogue, args, config, tma)
    return out


def template_mm(a, b, out=None, *, bias=None, alpha=1, beta=1, activation=None, config=None, tma=None):
    """`activation(beta * bias + alpha * (a @ b))` for 2-D a [M, K], b [K, N]: mm, addmm (`bias` broadcast to
    [M, N]: a row [N], a column [M, 1] or a full matrix) and either with a fused `activation` ("relu",
    "gelu", "gelu_tanh")."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"template_mm: 2-D operands, got {a.dim()}-D and {b.dim()}-D")
    return _matmul(a.unsqueeze(0), b.unsqueeze(0), out, (a.shape[0], b.shape[1]), bias, alpha, beta,
                   activation, config, tma)


def template_bmm(a, b, out=None, *, bias=None, alpha=1, beta=1, activation=None, config=None):
    """`activation(beta * bias + alpha * (a @ b))` per batch for 3-D a [B, M, K], b [B, K, N]: bmm, baddbmm
    (`bias` broadcast to [B, M, N])."""
    if a.dim() != 3 or b.dim() != 3:
        raise ValueError(f"template_bmm: 3-D operands, got {a.dim()}-D and {b.dim()}-D")
    return _matmul(a, b, out, (a.shape[0], a.shape[1], b.shape[2]), bias, alpha, beta, activation, config)


def template_addmm(bias, a, b, *, beta=1, alpha=1, activation=None, out=None, config=None, tma=None):
    """torch.addmm's argument order."""
    return template_mm(a, b, out, bias=bias, alpha=alpha, beta=beta, activation=activation, config=config,
                       tma=tma)


def template_baddbmm(bias, a, b, *, beta=1, alpha=1, activation=None, out=None, config=None):
    """torch.baddbmm's argument order."""
    return template_bmm(a, b, out, bias=bias, alpha=alpha, beta=beta, activation=activation, config=config)
