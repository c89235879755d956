"""Matmul template through TMA, persistent -> Triton source (schedule -> **codegen** -> runtime).

The Hopper form of `template.generate`: the same `out = epilogue(A @ B)` for one 2-D product of 16-bit
operands, with the three things a probe found worth 20-30 points of cuBLAS's speed over the pointer-based
template (benchmarks/NOTES.md, "What brings the matmul template to cuBLAS?": 94-105% of cuBLAS on 4096^3 and
the zoo's LM shapes, against at most ~77%):

- operands are read through TMA tensor descriptors (host-side `TensorDescriptor`s made at launch): the copy
  engine moves each [BLOCK, BLOCK_K] tile into shared memory, zero-filling past the edges, so the K loop has no
  masks and no address arithmetic;
- the kernel is persistent: one program per SM walks the output tiles (grouped order, as the pointer template);
- the tile loop is flattened with the K loop (`tl.range(..., flatten=True)`), so the pipeline keeps loading
  across a tile's end instead of draining.

A descriptor covers an operand's contiguous orientation: A as [M, K] (row-major) or, transposed, [K, M]; B as
[K, N] or, as a Linear weight, [N, K]. `A_T` / `B_T` (constexprs) say which, and the loaded tile is transposed in
registers where needed. The epilogue seam is the pointer template's (`Tile`, `Epilogue`): it runs on each tile
before the product's store. The product leaves through a descriptor too where the output allows one
(`store_descriptor`: row-major, 16-byte rows, aligned): the copy engine writes the tile from shared memory and
clips it at the edges, and the program goes on to its next tile meanwhile. A masked store through the output's
strides serves any other layout. The descriptor store measured 93.8% of cuBLAS on GPT-2's LM head against 87.6%,
and 1-3 points more on the other shapes (benchmarks/NOTES.md, "What brings the TMA template to cuBLAS
everywhere?").
"""

import torch

from brrr.compile.codegen.shim import prelude
from brrr.compile.matmul.template import Epilogue, MatmulSource, Tile, grouped_tile, kernel_name, parameters

DTYPES = (torch.float16, torch.bfloat16)   # wgmma reads 16-bit tiles in either orientation from shared memory
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "A_T", "B_T", "NUM_SMS")
OWN = ("M", "N", "K", "stride_om", "stride_on")
LOCALS = ("pid_b", "num_pid_m", "num_pid_n", "k_tiles", "num_tiles",
          "num_pid_in_group", "tile_id", "group_id", "first_pid_m", "group_size_m", "pid_m", "pid_n", "acc", "k",
          "a", "b", "rm", "rn", "mask", "halves", "left", "right")


def generate_tma(dtype, epilogue=None, *, wide=False, interpreted=False, baked=None, pointers=None,
                 store_product=True, name=None, order=None, helpers=(), store_descriptor=False):
    """Triton source of the TMA persistent matmul for `dtype` operands (float16 or bfloat16). `wide`: the output
    offsets in int64. `interpreted`: for the Triton interpreter, whose `tl.dot` multiplies bf16 bit patterns as
    integers: bf16 tiles are widened to fp32 exactly before the dot and the result rounded by hand.
    The compiler's fused kernels (epilogue.py) also pass, as for `template.generate`:
    baked: {name in OWN: int}, sizes and strides written into the source as constants;
    pointers: (a, b, out) parameter names: the two descriptors and the product's pointer;
    store_product: False when only the epilogue's own stores leave the kernel;
    name, order (the pointer and descriptor parameters in the caller's order), helpers (shim helpers).
    store_descriptor: the product's parameter is a descriptor of the output in [BLOCK_M, BLOCK_N / 2] blocks, not
    a pointer (the caller checked the output's layout: `descriptor_layout`)."""
    if dtype not in DTYPES:
        raise NotImplementedError(f"TMA matmul template: dtype {dtype} (supported: {DTYPES})")
    epilogue = epilogue or Epilogue()
    tile = Tile(dtype, interpreted)
    tile.helpers.update(helpers)
    baked = dict(baked or {})
    a_name, b_name, out_name = pointers or ("a_desc", "b_desc", "out_ptr")
    own = tuple(p for p in OWN if p not in baked)
    params = parameters(own, CONSTEXPRS + LOCALS, (a_name, b_name, out_name), store_product, epilogue, order,
                        "TMA template")
    widen = dtype == torch.bfloat16 and interpreted
    if widen:
        dot = "acc = tl.dot(a, b, acc, input_precision=\"ieee\")"
    else:
        dot = "acc = tl.dot(a, b, acc)"

    def tile_load(desc, offsets, transposed):
        x = f"{desc}.load([{offsets}])" + (".T" if transposed else "")
        return tile.widen(x, dtype) if widen else x

    i64 = ".to(tl.int64)" if wide else ""
    loop = [
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "for k in range(k_tiles):",
        "    if A_T:",
        f"        a = {tile_load(a_name, 'k * BLOCK_K, pid_m * BLOCK_M', True)}",
        "    else:",
        f"        a = {tile_load(a_name, 'pid_m * BLOCK_M, k * BLOCK_K', False)}",
        "    if B_T:",
        f"        b = {tile_load(b_name, 'pid_n * BLOCK_N, k * BLOCK_K', True)}",
        "    else:",
        f"        b = {tile_load(b_name, 'k * BLOCK_K, pid_n * BLOCK_N', False)}",
        f"    {dot}",
        f"rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){i64}[:, None]",
        f"rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){i64}[None, :]",
        "mask = (rm < M) & (rn < N)",
    ] + list(epilogue.code(tile))
    if store_product:
        stored = tile.narrow(epilogue.value(tile), dtype)
        if store_descriptor:
            # in two [BLOCK_M, BLOCK_N / 2] halves: the copy engine's staging buffer in shared memory halves too,
            # which keeps the rule's tile with an epilogue within the SM's 227 KiB
            loop += [f"halves = tl.permute(tl.reshape({stored}, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))",
                     "left, right = tl.split(halves)",
                     f"{out_name}.store([pid_m * BLOCK_M, pid_n * BLOCK_N], left)",
                     f"{out_name}.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], right)"]
        else:
            loop.append(f"tl.store({out_name} + rm * stride_om + rn * stride_on, {stored}, mask=mask)")
    body = [f"{k} = {int(v)}" for k, v in baked.items()] + [
        "pid_b = 0",
        "num_pid_m = tl.cdiv(M, BLOCK_M)",
        "num_pid_n = tl.cdiv(N, BLOCK_N)",
        "k_tiles = tl.cdiv(K, BLOCK_K)",
        "num_tiles = num_pid_m * num_pid_n",
        "num_pid_in_group = GROUP_M * num_pid_n",
        "# one program per SM walks the tiles; flattened, the K loop's pipeline runs on across a tile's end",
        "for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):",
    ] + ["    " + line for line in grouped_tile("tile_id") + loop]
    kind = "brrr_mm_tma_store" if store_descriptor and store_product else "brrr_mm_tma"
    name = name or kernel_name(epilogue).replace("brrr_mm", kind, 1)
    signature = ", ".join(params + tuple(f"{c}: tl.constexpr" for c in CONSTEXPRS))
    comment = (f"# matmul template, TMA persistent: {str(dtype).replace('torch.', '')} operands"
               f"{', int64 offsets' if wide else ''}, epilogue {epilogue.name or 'none'}"
               f"{', stored through a descriptor' if store_descriptor and store_product else ''}")
    source = "\n".join(["import triton", "import triton.language as tl", "", comment, prelude(tile.helpers), "",
                        "@triton.jit", f"def {name}({signature}):"] + ["    " + line for line in body]) + "\n"
    return MatmulSource(name, source, params + CONSTEXPRS)


def descriptor_layout(shape, strides, offset, itemsize):
    """Whether a 2-D output of `shape`, `strides` (elements) and storage `offset` can take the product through a
    TMA descriptor: unit last stride, rows a multiple of 16 bytes, the start 16-byte aligned (a fresh buffer's
    base is; `offset` counts from it)."""
    return len(shape) == 2 and strides[1] == 1 and (strides[0] * itemsize) % 16 == 0 \
        and (offset * itemsize) % 16 == 0 and min(shape) > 0
