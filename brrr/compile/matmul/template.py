"""Matmul template -> Triton source (schedule -> **codegen** -> runtime), brrr's own matmul kernel.

One kernel computes `out[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n])` for mm (batch 1), addmm, bmm and
baddbmm. Each program owns one [BLOCK_M, BLOCK_N] output tile of one batch (grid axis 1), walks K in BLOCK_K
steps with `tl.dot` into an fp32 accumulator, runs the epilogue on the tile and stores it once, cast to the
operands' dtype. Tiles are numbered in groups of GROUP_M rows (the "grouped" order of Triton's tutorial): the
programs running at once share A's rows and B's columns in L2.

Sizes and strides are kernel arguments, not baked in: one source serves every shape, layout (transposed and
sliced operands, a batch stride of 0 for a broadcast operand) and tile configuration (the block sizes are
constexprs, `brrr.compile.matmul.configs` picks them). What the source does depend on: the operand dtype,
TF32 for fp32, 64-bit offsets, the interpreter (exact bf16 conversions) and the epilogue.

The epilogue seam: an `Epilogue` contributes kernel parameters, Triton statements that rewrite the fp32 tile
`acc` in place given the names of `Tile` (row and column indices, batch index, mask), and the expression
stored. `Bias` (addmm's `beta * bias + alpha * acc`) and `Activation` (an entry of `mathops.OPS`, rendered as
pointwise codegen renders it) are the two here; `chain` runs several in order. A later change renders brrr's
own pointwise IR through the same seam.
"""

from dataclasses import dataclass, field

import torch

from brrr.compile.codegen.shim import prelude
from brrr.compile.ir import mathops

TL = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}
DTYPES = tuple(TL)
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")   # mathops.OPS entries an `Activation` may apply
LOCALS = ("a_ptr", "b_ptr", "out_ptr", "pid", "pid_b", "pid_m", "pid_n", "num_pid_m", "num_pid_n",
          "num_pid_in_group", "group_id", "first_pid_m", "group_size_m", "rm", "rn", "rk", "ram", "rbn", "a_ptrs",
          "b_ptrs", "acc", "k", "k_left", "a", "b", "mask")   # names the template's own code binds
# the element an operand prologue computes: its row and its K index for A ([BLOCK_M, 1], [1, BLOCK_K]), its K
# index and its column for B ([BLOCK_K, 1], [1, BLOCK_N])
PROLOGUE_INDEX = {"a": ("xindex_am", "xindex_ak"), "b": ("xindex_bk", "xindex_bn")}


@dataclass(frozen=True)
class Tile:
    """What an epilogue's code may read in the generated kernel: the names of the fp32 accumulator, the row
    indices ([BLOCK_M, 1], past M in the last tile row), the column indices ([1, BLOCK_N]), the batch index
    (a scalar), the tile's mask (rows < M and columns < N), and how to load a tensor of the operands' dtype as
    fp32 (exact under the interpreter, whose own bf16 conversion loses subnormals)."""

    dtype: torch.dtype
    interpreted: bool = False
    acc: str = "acc"
    rm: str = "rm"
    rn: str = "rn"
    batch: str = "pid_b"
    mask: str = "mask"
    helpers: set = field(default_factory=set, compare=False)   # shim helpers the rendered code calls

    def load_fp32(self, pointers, dtype=None):
        """A masked load of `pointers` (a [BLOCK_M, BLOCK_N] block of pointers) as fp32."""
        return self.widen(f"tl.load({pointers}, mask={self.mask}, other=0.0)", dtype or self.dtype)

    def widen(self, x, dtype):
        if dtype == torch.bfloat16 and self.interpreted:
            self.helpers.add("bf16_to_fp32")
            return f"bf16_to_fp32({x})"
        return f"{x}.to(tl.float32)"

    def narrow(self, x, dtype):
        """fp32 `x` as `dtype`, rounded to nearest even (the interpreter's own bf16 cast truncates)."""
        if dtype == torch.float32:
            return x
        if dtype == torch.bfloat16 and self.interpreted:
            self.helpers.add("bf16_rne")
            return f"bf16_rne({x})"
        return f"{x}.to({TL[dtype]})"


class Epilogue:
    """The interface the template calls; subclasses fill it in.

    - `name`: joins the kernel's name (`brrr_mm_<name>`), so differing epilogues never share a cache entry;
    - `params`: extra kernel parameters (pointers, strides, scalars), placed after the output's pointer;
    - `code(tile)`: Triton statements (without indentation) run after the K loop; they read `tile.acc` and may
      reassign it, and read `tile.rm`, `tile.rn`, `tile.batch`, `tile.mask` and the epilogue's own params;
    - `value(tile)`: the fp32 expression stored (the template casts it to the output's dtype);
    - `bind(**values)`: the arguments for `params`, in order, for one launch (the runner's side of the seam);
      `values` are shared by every epilogue of a chain, so each takes the keywords it knows and ignores the rest.
    """

    name = ""
    params = ()

    def code(self, tile):
        return []

    def value(self, tile):
        return tile.acc

    def bind(self, **values):
        return ()


@dataclass(frozen=True)
class Scale(Epilogue):
    """`alpha * acc`: addmm's alpha where beta is 0 (the bias is not read at all then, nor its NaNs)."""

    name = "scaled"
    params = ("alpha",)

    def code(self, tile):
        return [f"{tile.acc} = alpha * {tile.acc}"]

    def bind(self, *, alpha=1, **_):
        return (float(alpha),)


@dataclass(frozen=True)
class Bias(Epilogue):
    """addmm's `beta * bias + alpha * acc`. One source serves every broadcast of the bias (a row vector [N], a
    column [M, 1], a full [M, N] matrix, a batched [B, M, N] one): it is read through three strides, 0 along
    the dims it is broadcast over. `scaled=False` (alpha = beta = 1, the common case) leaves the multiplies
    out."""

    scaled: bool = False

    @property
    def name(self):
        return "bias_scaled" if self.scaled else "bias"

    @property
    def params(self):
        return ("bias_ptr", "stride_biasb", "stride_biasm", "stride_biasn") + (("alpha", "beta") if self.scaled
                                                                               else ())

    def code(self, tile):
        ptrs = (f"bias_ptr + {tile.batch} * stride_biasb + {tile.rm} * stride_biasm + {tile.rn} * stride_biasn")
        bias = tile.load_fp32(ptrs)
        if self.scaled:
            return [f"{tile.acc} = beta * {bias} + alpha * {tile.acc}"]
        return [f"{tile.acc} = {bias} + {tile.acc}"]

    def bind(self, *, bias, alpha=1, beta=1, **_):
        """`bias`: expanded to the output's [B, M, N] (a view; broadcast dims have stride 0)."""
        args = (bias, bias.stride(0), bias.stride(1), bias.stride(2))
        return args + ((float(alpha), float(beta)) if self.scaled else ())


@dataclass(frozen=True)
class Activation(Epilogue):
    """An elementwise function of the tile, rendered from `mathops.OPS` as pointwise kernels render it."""

    op: str = "relu"

    def __post_init__(self):
        if self.op not in ACTIVATIONS:
            raise ValueError(f"activation {self.op!r}: one of {ACTIVATIONS}")

    @property
    def name(self):
        return self.op

    def code(self, tile):
        template, helpers = mathops.OPS[self.op][mathops.FLOAT]
        tile.helpers.update(helpers)
        return [f"{tile.acc} = {template.format(tile.acc)}"]


@dataclass(frozen=True)
class Chain(Epilogue):
    """Epilogues run in order, each on what the one before left in `acc`; parameters concatenated."""

    parts: tuple = ()

    def __post_init__(self):
        names = [p for e in self.parts for p in e.params]
        if len(set(names)) != len(names):
            raise ValueError(f"epilogue parameters collide: {names}")

    @property
    def name(self):
        return "_".join(e.name for e in self.parts)

    @property
    def params(self):
        return tuple(p for e in self.parts for p in e.params)

    def code(self, tile):
        return [line for e in self.parts for line in e.code(tile)]

    def value(self, tile):
        return self.parts[-1].value(tile) if self.parts else tile.acc

    def bind(self, **values):
        return tuple(a for e in self.parts for a in e.bind(**values))


def chain(*epilogues):
    """One epilogue running `epilogues` (None entries dropped) in order; None when there are none."""
    parts = tuple(e for e in epilogues if e is not None)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else Chain(parts)


@dataclass(frozen=True)
class MatmulSource:
    """A generated module: the kernel's name, its source and its parameters in order (constexprs last)."""

    name: str
    source: str
    params: tuple


def kernel_name(epilogue=None):
    suffix = f"_{epilogue.name}" if epilogue is not None and epilogue.name else ""
    return f"brrr_mm{suffix}"


def grouped_tile(tile):
    """Triton lines setting pid_m, pid_n of output tile number `tile` (a name) in grouped order: GROUP_M tile
    rows are walked column by column, so programs in flight share operands in L2. Reads num_pid_m and
    num_pid_in_group (GROUP_M * num_pid_n)."""
    return [
        f"group_id = {tile} // num_pid_in_group",
        "first_pid_m = group_id * GROUP_M",
        "group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)",
        f"pid_m = first_pid_m + ({tile} % num_pid_in_group) % group_size_m",
        f"pid_n = ({tile} % num_pid_in_group) // group_size_m",
    ]


def parameters(own, reserved, pointers, store_product, epilogue, order, what):
    """A template kernel's parameters in order: the pointers (`pointers` = (a, b, out) names, out only when
    `store_product`; an operand computed by a prologue has None, and its prologue's pointers come among the
    epilogue's) and the epilogue's, in `order` when the caller gives one, then the sizes and strides not baked in
    (`own`). `reserved`: the template's constexprs and locals, which no epilogue parameter may take."""
    a_name, b_name, out_name = pointers
    operands = tuple(p for p in (a_name, b_name) if p is not None)
    taken = set(own + reserved + operands + ((out_name,) if store_product else ())) & set(epilogue.params)
    if taken:
        raise ValueError(f"epilogue {epilogue.name!r}: parameters {sorted(taken)} are the template's names")
    pointer_params = operands + ((out_name,) if store_product else ()) + tuple(epilogue.params)
    if order is not None:
        if sorted(order) != sorted(pointer_params):
            raise ValueError(f"{what}: order {list(order)} is not a permutation of {list(pointer_params)}")
        pointer_params = tuple(order)
    return pointer_params + own


OWN = ("M", "N", "K", "stride_ab", "stride_am", "stride_ak", "stride_bb", "stride_bk", "stride_bn",
       "stride_ob", "stride_om", "stride_on")   # the sizes and strides the template reads


@dataclass(frozen=True)
class Prologue:
    """An operand computed in the K loop from what its producer read, instead of loaded (prologue.py
    renders it): Triton statements assigning the operand's [BLOCK_M, BLOCK_K] (A) or [BLOCK_K, BLOCK_N] (B)
    block, in the template's operand form, given the element's indices (PROLOGUE_INDEX) and, in `masked`, an
    `xmask` of the K indices in range. `even`: the same for a K that BLOCK_K divides (no mask)."""

    even: tuple
    masked: tuple


def generate(dtype, epilogue=None, *, tf32=False, wide=False, interpreted=False, baked=None, pointers=None,
             store_product=True, name=None, order=None, helpers=(), prologues=None):
    """Triton source of the matmul kernel for operands of `dtype`.

    tf32: fp32 operands multiply as TF32 on tensor cores (`torch.backends.cuda.matmul.allow_tf32`), else IEEE.
    wide: offsets in int64 (some tensor spans 2**31 elements or more).
    interpreted: for the Triton interpreter, whose `tl.dot` multiplies bf16 bit patterns as integers and whose
    bf16 casts are inexact: bf16 tiles are widened to fp32 exactly before the dot, the result rounded by hand.
    The compiler's fused kernels (epilogue.py) also pass:
    baked: {name in OWN: int}, sizes and strides written into the source as constants instead of parameters;
    pointers: (a, b, out) parameter names for the operands and the product (the runtime's in_ptr/out_ptr names);
    store_product: False when only the epilogue's own stores leave the kernel (no `out` parameter then);
    name: the kernel's name;
    order: the pointer parameters in the order the caller passes them (the runtime's: inputs, then outputs);
    helpers: shim helpers (codegen/shim.py) the epilogue's code calls;
    prologues: {"a" | "b": Prologue} for operands computed in the loop (their pointer in `pointers` is None).
    """
    if dtype not in TL:
        raise NotImplementedError(f"matmul template: dtype {dtype} (supported: {DTYPES})")
    epilogue = epilogue or Epilogue()
    tile = Tile(dtype, interpreted)
    tile.helpers.update(helpers)
    name = name or kernel_name(epilogue)
    baked = dict(baked or {})
    a_name, b_name, out_name = pointers or ("a_ptr", "b_ptr", "out_ptr")
    own = tuple(p for p in OWN if p not in baked)
    params = parameters(own, CONSTEXPRS + LOCALS, (a_name, b_name, out_name), store_product, epilogue, order,
                        "matmul template")
    i64 = ".to(tl.int64)" if wide else ""
    widen_operands = dtype == torch.bfloat16 and interpreted
    if dtype == torch.float32 or widen_operands:
        precision = "tf32" if tf32 and not widen_operands else "ieee"
        dot = f"acc = tl.dot(a, b, acc, input_precision=\"{precision}\")"
    else:
        dot = "acc = tl.dot(a, b, acc)"
    def load(ptrs, mask=None):
        x = f"tl.load({ptrs}, mask={mask}, other=0.0)" if mask else f"tl.load({ptrs})"
        return tile.widen(x, dtype) if widen_operands else x

    prologues = dict(prologues or {})
    if any((a_name, b_name)[i] is None for i, w in enumerate("ab") if w not in prologues):
        raise ValueError("matmul template: an operand has neither a pointer nor a prologue")

    def operand(which, ptrs, mask):
        if which in prologues:
            return list((prologues[which].masked if mask else prologues[which].even))
        return [f"{which} = {load(ptrs, mask)}"]

    am, ak = PROLOGUE_INDEX["a"]
    bk, bn = PROLOGUE_INDEX["b"]
    body = [f"{k} = {int(v)}" for k, v in baked.items()] + [
        f"{local} = {param}" for local, param in (("a_ptr", a_name), ("b_ptr", b_name), ("out_ptr", out_name))
        if local != param and param is not None and (local != "out_ptr" or store_product)] + [
        "pid = tl.program_id(0)",
        f"pid_b = tl.program_id(1){i64}",
        "num_pid_m = tl.cdiv(M, BLOCK_M)",
        "num_pid_n = tl.cdiv(N, BLOCK_N)",
        "num_pid_in_group = GROUP_M * num_pid_n"] + grouped_tile("pid") + [
        f"rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){i64}",
        f"rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){i64}",
        f"rk = tl.arange(0, BLOCK_K){i64}",
        "# rows and columns past M and N wrap around (their results are never stored): the loop's loads need no"
        " mask but K's",
        "ram = rm % M",
        "rbn = rn % N",
    ] + (["a_ptrs = a_ptr + pid_b * stride_ab + ram[:, None] * stride_am + rk[None, :] * stride_ak"]
         if "a" not in prologues else [f"{am} = ram[:, None]"]) + (
        ["b_ptrs = b_ptr + pid_b * stride_bb + rk[:, None] * stride_bk + rbn[None, :] * stride_bn"]
        if "b" not in prologues else [f"{bn} = rbn[None, :]"]) + [
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "for k in range(0, tl.cdiv(K, BLOCK_K)):"] + (
        [f"    {ak} = (k * BLOCK_K + rk)[None, :]"] if "a" in prologues else []) + (
        [f"    {bk} = (k * BLOCK_K + rk)[:, None]"] if "b" in prologues else []) + [
        "    if EVEN_K:"] + [
        "        " + line for w, p in (("a", "a_ptrs"), ("b", "b_ptrs")) for line in operand(w, p, None)] + [
        "    else:",
        "        k_left = K - k * BLOCK_K"] + [
        "        " + line for w, p, m in (("a", "a_ptrs", "rk[None, :] < k_left"), ("b", "b_ptrs", "rk[:, None] < k_left"))
        for line in operand(w, p, m)] + [
        f"    {dot}"] + (
        ["    a_ptrs += BLOCK_K * stride_ak"] if "a" not in prologues else []) + (
        ["    b_ptrs += BLOCK_K * stride_bk"] if "b" not in prologues else []) + [
        "rm = rm[:, None]",
        "rn = rn[None, :]",
        "mask = (rm < M) & (rn < N)",
    ]
    body += list(epilogue.code(tile))
    if store_product:
        stored = tile.narrow(epilogue.value(tile), dtype)
        body.append(f"tl.store(out_ptr + pid_b * stride_ob + rm * stride_om + rn * stride_on, {stored}, mask=mask)")
    signature = ", ".join(params + tuple(f"{c}: tl.constexpr" for c in CONSTEXPRS))
    comment = (f"# matmul template: {str(dtype).replace('torch.', '')} operands"
               f"{', TF32' if tf32 and dtype == torch.float32 else ''}{', int64 offsets' if wide else ''}, "
               f"epilogue {epilogue.name or 'none'}")
    source = "\n".join(["import triton", "import triton.language as tl", "", comment, prelude(tile.helpers), "",
                        "@triton.jit", f"def {name}({signature}):"] + ["    " + line for line in body]) + "\n"
    return MatmulSource(name, source, params + CONSTEXPRS)
