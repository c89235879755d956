"""The matmul template (matmul/template.py, matmul/configs.py, template_mm.py) in the Triton interpreter:
values against float64 references, every layout the kernel takes strides for, the epilogues, the configs."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from brrr.compile.matmul import configs as matmul_configs, template_mm
from brrr.compile.matmul.configs import (CONFIGS, DEFAULT_MAX_AREA, SHARED_MEMORY, TileConfig, WAVE_FILL, candidates,
                                         default_config, wave_area, wave_fill)
from brrr.compile.matmul.template import Activation, Bias, Chain, Scale, chain, generate
from brrr.compile.matmul.template_mm import template_addmm, template_baddbmm, template_bmm, template_mm as mm
from tests.compile.helpers import rel_err

ODD = [(1, 1, 1), (1, 17, 64), (17, 1, 130), (17, 17, 17), (64, 64, 64), (130, 17, 1), (64, 130, 17),
       (130, 130, 130), (17, 1007, 64), (1, 1007, 130), (130, 1007, 17)]


def assert_fp32_close(out, ref):
    """fp32 against a float64 reference: within a few fp32 roundings of the result's scale."""
    assert out.dtype == torch.float32
    scale = max(1.0, ref.abs().max().item())
    err = (out.double() - ref).abs().max().item()
    assert err <= 2e-6 * scale, (err, scale)


def assert_half_close(out, eager, ref):
    """A half type against a float64 reference: no worse than twice eager's error in that dtype (and small)."""
    assert out.dtype == eager.dtype
    ours, theirs = rel_err(out, ref), rel_err(eager, ref)
    assert ours <= 2 * theirs + 1e-6, (ours, theirs)
    assert ours < 1e-2


@pytest.mark.parametrize("m,n,k", ODD)
def test_mm_and_addmm_match_float64_at_odd_sizes(m, n, k):
    a, b, bias = torch.randn(m, k), torch.randn(k, n), torch.randn(n)
    assert_fp32_close(mm(a, b), a.double() @ b.double())
    assert_fp32_close(template_addmm(bias, a, b), torch.addmm(bias.double(), a.double(), b.double()))


@pytest.mark.parametrize("batch,m,n,k", [(3, 17, 130, 64), (2, 1, 1007, 17), (4, 130, 1, 130)])
def test_bmm_and_baddbmm_match_float64(batch, m, n, k):
    a, b, bias = torch.randn(batch, m, k), torch.randn(batch, k, n), torch.randn(batch, m, n)
    assert_fp32_close(template_bmm(a, b), torch.bmm(a.double(), b.double()))
    out = template_baddbmm(bias, a, b, alpha=0.5, beta=-2)
    assert_fp32_close(out, torch.baddbmm(bias.double(), a.double(), b.double(), alpha=0.5, beta=-2))


def test_every_config_computes_the_same_product():
    # K = 64 makes K a multiple of every BLOCK_K (EVEN_K: no mask), K = 65 leaves a partial last step
    for k in (64, 65):
        a, b = torch.randn(130, k), torch.randn(k, 131)
        for config in CONFIGS:
            assert_fp32_close(mm(a, b, config=config), a.double() @ b.double())


def test_transposed_sliced_and_offset_operands():
    big = torch.randn(80, 300)
    cases = [
        (torch.randn(64, 17).t(), torch.randn(64, 33)),           # A column-major
        (torch.randn(17, 64), torch.randn(33, 64).t()),           # B column-major
        (torch.randn(17, 64).t().t(), torch.randn(64, 66)[:, ::2]),   # B every other column
        (big[3:20, 5:69], big[10:74, 100:230:3]),                 # slices with storage offsets, strided B
        (big[3:20, 7:71], big[:, 150:].t()[3:67]),                # B a transposed slice
        (big[::2, :64], torch.randn(64, 130)),                    # A every other row
    ]
    for a, b in cases:
        assert_fp32_close(mm(a, b), a.double() @ b.double())


def test_out_with_any_strides_is_written_in_place():
    a, b = torch.randn(17, 64), torch.randn(64, 33)
    out = torch.full((33, 17), float("nan")).t()                 # column-major output
    assert mm(a, b, out) is out
    assert_fp32_close(out, a.double() @ b.double())
    wide = torch.full((17, 70), float("nan"))
    mm(a, b, wide[:, 2:68:2])
    assert_fp32_close(wide[:, 2:68:2], a.double() @ b.double())
    assert torch.isnan(wide[:, 3:68:2]).all() and torch.isnan(wide[:, :2]).all()   # nothing else touched
    with pytest.raises(ValueError):
        mm(a, b, torch.empty(17, 34))
    with pytest.raises(ValueError):
        mm(a, b.double())


def test_batch_broadcast_operand_has_stride_0():
    a, b = torch.randn(1, 17, 64).expand(3, 17, 64), torch.randn(3, 64, 130)
    assert a.stride(0) == 0
    assert_fp32_close(template_bmm(a, b), torch.bmm(a.double(), b.double()))
    w = torch.randn(64, 130)[None].expand(3, 64, 130)            # a weight shared by every batch
    x = torch.randn(3, 17, 64)
    bias = torch.randn(130)
    assert_fp32_close(template_baddbmm(bias, x, w), torch.baddbmm(bias.double(), x.double(), w.double()))


@pytest.mark.parametrize("alpha,beta", [(1, 1), (0.5, 2.0), (-1.5, 1), (1, 0.25)])
def test_addmm_bias_as_row_column_and_matrix(alpha, beta):
    m, n, k = 17, 130, 64
    a, b = torch.randn(m, k), torch.randn(k, n)
    for bias in (torch.randn(n), torch.randn(m, 1), torch.randn(m, n), torch.randn(1, n), torch.randn(n * 2)[::2]):
        out = template_addmm(bias, a, b, alpha=alpha, beta=beta)
        assert_fp32_close(out, torch.addmm(bias.double(), a.double(), b.double(), alpha=alpha, beta=beta))


def test_beta_0_ignores_the_bias_and_its_nans():
    a, b = torch.randn(17, 64), torch.randn(64, 33)
    bias = torch.full((33,), float("nan"))
    out = template_addmm(bias, a, b, beta=0, alpha=3)
    assert_fp32_close(out, torch.addmm(bias.double(), a.double(), b.double(), beta=0, alpha=3))
    assert torch.isfinite(out).all()


def test_baddbmm_bias_broadcasts():
    batch, m, n, k = 3, 17, 33, 64
    a, b = torch.randn(batch, m, k), torch.randn(batch, k, n)
    for bias in (torch.randn(n), torch.randn(m, 1), torch.randn(m, n), torch.randn(batch, 1, n),
                 torch.randn(batch, m, n)):
        out = template_baddbmm(bias, a, b, alpha=2, beta=0.5)
        assert_fp32_close(out, torch.baddbmm(bias.double(), a.double(), b.double(), alpha=2, beta=0.5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", [(17, 130, 64), (130, 1007, 17), (64, 64, 130)])
def test_half_types_within_twice_eager_error(dtype, m, n, k):
    a, b, bias = (torch.randn(*s).to(dtype) for s in ((m, k), (k, n), (n,)))
    a64, b64, bias64 = a.double(), b.double(), bias.double()
    assert_half_close(mm(a, b), a @ b, a64 @ b64)
    assert_half_close(template_addmm(bias, a, b, alpha=0.5, beta=2), torch.addmm(bias, a, b, alpha=0.5, beta=2),
                      torch.addmm(bias64, a64, b64, alpha=0.5, beta=2))
    batched = a.expand(2, m, k), torch.stack([b, -b])
    assert_half_close(template_bmm(*batched), torch.bmm(*batched), torch.bmm(*(t.double() for t in batched)))


@pytest.mark.parametrize("activation,torch_fn", [
    ("gelu", F.gelu), ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")), ("relu", F.relu)])
def test_activation_epilogue_after_the_bias(activation, torch_fn):
    m, n, k = 17, 130, 64
    a, b, bias = torch.randn(m, k), torch.randn(k, n), torch.randn(n)
    out = mm(a, b, bias=bias, alpha=0.5, beta=2, activation=activation)
    ref = torch_fn(torch.addmm(bias.double(), a.double(), b.double(), alpha=0.5, beta=2))
    assert_fp32_close(out, ref)
    assert (ref < 0).any() or activation == "relu"   # the activation's negative side was exercised
    assert_fp32_close(mm(a, b, activation=activation), torch_fn(a.double() @ b.double()))
    x, w = torch.randn(2, m, k), torch.randn(2, k, n)
    assert_fp32_close(template_baddbmm(bias, x, w, activation=activation),
                      torch_fn(torch.baddbmm(bias.double(), x.double(), w.double())))
    ab, bb, biasb = a.bfloat16(), b.bfloat16(), bias.bfloat16()
    assert_half_close(mm(ab, bb, bias=biasb, activation=activation), torch_fn(torch.addmm(biasb, ab, bb)),
                      torch_fn(torch.addmm(biasb.double(), ab.double(), bb.double())))


def test_empty_and_k0_problems():
    a, b = torch.randn(0, 5), torch.randn(5, 7)
    assert mm(a, b).shape == (0, 7)
    a, b, bias = torch.randn(4, 0), torch.randn(0, 7), torch.randn(7)
    assert torch.equal(mm(a, b), torch.zeros(4, 7))
    assert_fp32_close(template_addmm(bias, a, b, beta=3), 3 * bias.double().expand(4, 7))


# ------------------------------------------------------------------------------- configs


def test_configs_are_valid_tiles():
    for c in CONFIGS:
        for side in (c.block_m, c.block_n, c.block_k):
            assert side >= 16 and side & (side - 1) == 0, c   # tl.dot takes power-of-two sides of 16 or more
        assert c.num_warps in (4, 8) and c.num_stages >= 2 and c.group_m >= 1
        assert max(c.block_m, c.block_n) <= template_mm.MAX_BLOCK
        assert c.shared_bytes(2) <= SHARED_MEMORY, c      # every config serves the half types
    assert c.meta(64)["EVEN_K"] and not c.meta(65)["EVEN_K"]


@pytest.mark.parametrize("m", [1, 5, 16, 17, 32])
def test_default_config_for_small_m(m):
    for dtype in (torch.float32, torch.bfloat16):
        c = default_config(m, 4096, 4096, dtype)
        assert c.block_m <= 32 and c.block_m >= m
        assert c in candidates(m, 4096, 4096, dtype)
    assert default_config(m, 4096, 4096, torch.bfloat16).block_m == (16 if m <= 16 else 32)


@pytest.mark.parametrize("m,n,k,batch", [(4096, 4096, 4096, 1), (8192, 50257, 768, 1), (512, 512, 64, 96),
                                         (1024, 1024, 1024, 1), (130, 1007, 17, 1), (2048, 2048, 512, 1)])
def test_default_config_for_large_shapes(m, n, k, batch):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        c = default_config(m, n, k, dtype, batch)
        assert c.block_m >= 64 and c in CONFIGS
        assert c.shared_bytes(dtype.itemsize) <= SHARED_MEMORY
        assert c.block_m * c.block_n <= DEFAULT_MAX_AREA
        others = [o for o in candidates(m, n, k, dtype, batch) if o.block_m * o.block_n <= DEFAULT_MAX_AREA]
        larger = [o for o in others if o.block_m * o.block_n > c.block_m * c.block_n]
        if wave_fill(c, m, n, batch) >= WAVE_FILL:   # busy enough, and no larger tile is
            assert all(wave_fill(o, m, n, batch) < WAVE_FILL for o in larger), (c, larger)
        else:                                        # none is: the least work per SM
            assert all(wave_fill(o, m, n, batch) < WAVE_FILL for o in others)
            assert all(wave_area(o, m, n, batch) >= wave_area(c, m, n, batch) for o in others)
    # 1024 tiles of 128x128: 8 waves on 132 SMs, 97% busy; three stages measured faster than four
    assert default_config(4096, 4096, 4096, torch.bfloat16) == TileConfig(128, 128, 64, 8, 8, 3)
    assert default_config(8192, 50257, 768, torch.bfloat16) == TileConfig(128, 128, 64, 8, 8, 3)
    # fp32's tiles are 4 bytes a lane: 128x256x64 in 3 stages would need 288 KiB
    assert default_config(4096, 4096, 4096, torch.float32).block_n == 128
    # 1024 x 1024: 64 tiles of 128x128 would leave 68 SMs idle; 128 tiles of 64x128 fill one wave
    assert default_config(1024, 1024, 1024, torch.bfloat16) == TileConfig(64, 128, 32, 8, 4, 4)


# ------------------------------------------------------------------------------- source


def test_source_follows_dtype_precision_and_epilogue():
    fp32 = generate(torch.float32, tf32=True).source
    assert 'input_precision="tf32"' in fp32 and "bf16_to_fp32" not in fp32
    assert 'input_precision="ieee"' in generate(torch.float32).source
    # the interpreter's dot multiplies bf16 bit patterns as integers: its tiles are widened exactly first
    assert generate(torch.bfloat16, interpreted=True).source.count("bf16_to_fp32(tl.load(") == 4
    gpu = generate(torch.bfloat16).source
    assert "bf16_to_fp32" not in gpu and "acc = tl.dot(a, b, acc)" in gpu and ".to(tl.bfloat16)" in gpu
    assert ".to(tl.int64)" in generate(torch.float16, wide=True).source
    assert ".to(tl.int64)" not in generate(torch.float16).source
    src = generate(torch.float32, chain(Bias(scaled=True), Activation("gelu")))
    assert src.name == "brrr_mm_bias_scaled_gelu"
    assert src.params[3:9] == ("bias_ptr", "stride_biasb", "stride_biasm", "stride_biasn", "alpha", "beta")
    with pytest.raises(ValueError):
        Chain((Bias(), Bias()))          # the same parameters twice
    with pytest.raises(ValueError):
        Activation("softmax")
    with pytest.raises(ValueError):
        generate(torch.float32, type("Clash", (Scale,), {"params": ("acc",)})())   # a name the template binds
    # the runner reads torch's TF32 switch for fp32 operands
    allow = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        a, b = torch.randn(17, 64), torch.randn(64, 33)
        assert_fp32_close(mm(a, b), a.double() @ b.double())   # the interpreter multiplies fp32 exactly anyway
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow
    assert any(key[0] == torch.float32 and key[2] for key in template_mm._KERNELS)


def test_int64_offsets_where_a_tensor_spans_2_31_elements():
    small = torch.empty(1024, 1024, device="meta")
    assert not template_mm._wide([small])
    assert template_mm._wide([torch.empty(65536, 32768, device="meta")])
    assert template_mm._wide([torch.empty(4, 2 ** 31 // 4 - 100, device="meta")])   # rows past M reach 2**31


_COMPILE_FOR_SM90 = """
import importlib.util, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path, name, types, consts, options = sys.argv[1], sys.argv[2], *map(json.loads, sys.argv[3:])
spec = importlib.util.spec_from_file_location("kernel_under_test", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, name)
sig = {p: "constexpr" if p in consts else types.get(p, "i32") for p in fn.arg_names}
attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.arg_names)
         if p not in consts and sig[p] != "fp32" and not sig[p].startswith("tensordesc")}
k = triton.compile(ASTSource(fn, sig, constexprs={(fn.arg_names.index(p),): v for p, v in consts.items()},
                             attrs=attrs), target=GPUTarget("cuda", 90, 32), options=options)
ptx = k.asm["ptx"]
print(json.dumps({"mma": sorted(set(re.findall(r"wgmma\\.mma_async[.a-z0-9]*|mma\\.sync[.a-z0-9]*", ptx))),
                  "copies": sorted(set(re.findall(r"cp\\.async\\.c[ag]\\.[.a-z0-9]*", ptx))),
                  "tma": sorted(set(re.findall(r"cp\\.async\\.bulk\\.tensor[.a-z0-9:]*", ptx))),
                  "shared": k.metadata.shared}))
"""


def _compiled_for_sm90(src, path, types, consts, config):
    """Compile `src` (written to `path`) for sm_90 in a process of its own; what its PTX holds."""
    path.write_text(src.source)
    options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90, str(path), src.name, json.dumps(types),
                           json.dumps(consts), json.dumps(options)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype,config,unit_strides", [
    (torch.bfloat16, CONFIGS[0], ("stride_ak", "stride_bn")), (torch.float32, CONFIGS[1], ("stride_ak", "stride_bn")),
    (torch.float16, CONFIGS[-1], ("stride_ak", "stride_bn")), (torch.bfloat16, CONFIGS[1], ("stride_am", "stride_bk"))])
def test_gpu_source_compiles_for_sm90_on_tensor_cores(dtype, config, unit_strides, tmp_path):
    """What the H100 would run (no GPU needed: Triton's NVIDIA backend and ptxas), in a process of its own: the
    interpreter these tests run under replaces parts of triton.language. Operands as at a launch: unit strides
    are constants (Triton specializes them; row-major operands, or both transposed), sizes and the other strides
    divisible by 16. Half-type operand tiles are copied to shared memory 16 bytes at a time, transposed ones too
    (rows past M wrap at a multiple of 16, so `rm % M` keeps runs of 16 contiguous)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    assert matmul_configs.fits(config, dtype)
    src = generate(dtype, chain(Bias(scaled=True), Activation("gelu_tanh")), tf32=True)
    path = tmp_path / f"{src.name}.py"
    ptr = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}[dtype]
    types = dict(a_ptr=ptr, b_ptr=ptr, out_ptr=ptr, bias_ptr=ptr, alpha="fp32", beta="fp32")
    meta = config.meta(4096)
    consts = {name: meta[name] for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K")}
    consts.update(dict.fromkeys(unit_strides, 1), stride_on=1, stride_biasn=1, stride_biasm=0, stride_biasb=0)
    result = _compiled_for_sm90(src, path, types, consts, config)
    kind = {torch.bfloat16: "bf16.bf16", torch.float16: "f16.f16", torch.float32: "tf32.tf32"}[dtype]
    assert result["mma"] and all(kind in op for op in result["mma"]), result
    if config.block_m >= 64:   # Hopper's warpgroup MMA (a 16-row tile runs on mma.sync)
        assert all(op.startswith("wgmma") for op in result["mma"]), result
    assert 0 < result["shared"] <= config.shared_bytes(dtype.itemsize) <= SHARED_MEMORY
    if dtype == torch.float32:   # Hopper's TF32 wgmma takes K-major tiles only: B is copied 4 bytes at a time
        assert result["copies"] == ["cp.async.ca.shared.global", "cp.async.cg.shared.global"], result
    else:                        # .cg: 16-byte copies only
        assert result["copies"] == ["cp.async.cg.shared.global"], result
    assert re.fullmatch(r"brrr_mm_\w+", src.name)


# ------------------------------------------------------------------------------- TMA persistent template

SMALL_TILE = TileConfig(32, 32, 16, 2, 4, 2)   # several tiles per program under the interpreter's 3 programs


def _tma_kernels():
    return {key for key in template_mm._KERNELS if key[4]}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (False, True), (True, False), (True, True)])
def test_tma_template_matches_float64_in_every_orientation(dtype, a_t, b_t):
    """Row-major and transposed operands (a Linear weight is B transposed), sizes that are no multiple of the
    tile (TMA zero-fills past the edges: no masks in the K loop), a bias and GELU on the tile. Every row of
    every operand starts 16 bytes after a multiple of 16 bytes, as TMA needs."""
    m, n, k = 72, 88, 40
    a = torch.randn(k, m).t() if a_t else torch.randn(m, k)
    b = torch.randn(n, k).t() if b_t else torch.randn(k, n)
    bias = torch.randn(n)
    a, b, bias = a.to(dtype), b.to(dtype), bias.to(dtype)
    (_, a_read_t), (_, b_read_t), _ = template_mm._tma_plan(a.unsqueeze(0), b.unsqueeze(0), SMALL_TILE, True)
    assert (a_read_t, b_read_t) == (a_t, b_t)   # each operand read in its contiguous orientation
    out = template_addmm(bias, a, b, activation="gelu", config=SMALL_TILE, tma=True)
    assert any(key[0] == dtype for key in _tma_kernels())   # the TMA kernel ran
    ref = F.gelu(torch.addmm(bias.double(), a.double(), b.double()))
    assert_half_close(out, F.gelu(torch.addmm(bias, a, b).float()).to(dtype), ref)
    assert out.stride() == (n, 1)
    assert any(key[0] == dtype and key[-1] for key in _tma_kernels())   # row-major: stored through a descriptor


@pytest.mark.parametrize("m,n", [(64, 96), (32, 32)])   # 6 tiles for 3 programs; 1 tile, fewer than programs
def test_tma_template_writes_through_the_output_strides(m, n):
    a, b = torch.randn(m, 48, dtype=torch.float16), torch.randn(48, n, dtype=torch.float16)
    out = torch.zeros(n, m, dtype=torch.float16).t()     # column-major output: no descriptor takes it
    template_mm._KERNELS.clear()
    mm(a, b, out, config=SMALL_TILE, tma=True)
    assert_half_close(out, (a.float() @ b.float()).half(), a.double() @ b.double())
    assert _tma_kernels() and not any(key[-1] for key in _tma_kernels())


@pytest.mark.parametrize("m,n", [(72, 88), (40, 24)])   # edges clipped by the copy engine; fewer tiles than programs
def test_tma_template_stores_a_row_major_product_through_a_descriptor(m, n):
    a, b = torch.randn(m, 48, dtype=torch.float16), torch.randn(n, 48, dtype=torch.float16).t()
    canary = torch.full((m + 1, n), 7.0, dtype=torch.float16)
    out = canary[:m]                                     # the row past the product must stay untouched
    template_mm._KERNELS.clear()
    mm(a, b, out, config=SMALL_TILE, tma=True)
    assert [key[-1] for key in _tma_kernels()] == [True]
    assert_half_close(out, (a.float() @ b.float()).half(), a.double() @ b.double())
    assert torch.equal(canary[m], torch.full((n,), 7.0, dtype=torch.float16))


@pytest.mark.parametrize("case", ["unaligned-stride", "unaligned-base", "batched", "fp32", "no-unit-stride"])
def test_operands_tma_cannot_read_take_the_pointer_template(case):
    """TMA wants a unit stride, the other stride a multiple of 16 bytes and a 16-byte aligned base; 2-D
    products of 16-bit types only. Anything else runs the pointer template, just as right."""
    dt = torch.float16
    a, b = torch.randn(40, 24, dtype=dt), torch.randn(24, 36, dtype=dt)
    if case == "unaligned-stride":
        a = torch.randn(40, 13, dtype=dt)[:, :12]        # row stride 26 bytes
        b = b[:12]
    elif case == "unaligned-base":
        a = torch.randn(40, 25, dtype=dt)[:, 1:]         # base 2 bytes past an aligned one
    elif case == "fp32":
        a, b = a.float(), b.float()
    elif case == "no-unit-stride":
        a = torch.randn(40, 48, dtype=dt)[:, ::2]
    assert template_mm._tma_plan(a.unsqueeze(0), b.unsqueeze(0), SMALL_TILE, True) is None
    if case == "batched":
        a3, b3 = torch.randn(2, 40, 24, dtype=dt), torch.randn(2, 24, 36, dtype=dt)
        assert template_mm._tma_plan(a3, b3, SMALL_TILE, True) is None
        out = template_bmm(a3, b3)
        assert_half_close(out, torch.bmm(a3.float(), b3.float()).half(), torch.bmm(a3.double(), b3.double()))
        return
    out = mm(a, b, config=SMALL_TILE, tma=True)
    ref = a.double() @ b.double()
    if dt == a.dtype:
        assert_half_close(out, (a.float() @ b.float()).to(dt), ref)
    else:
        assert_fp32_close(out, ref)


def test_tma_template_runs_on_hopper_only_unless_forced(monkeypatch):
    a, b = torch.randn(256, 64, dtype=torch.float16), torch.randn(64, 256, dtype=torch.float16)
    assert template_mm._tma_plan(a.unsqueeze(0), b.unsqueeze(0), None, None) is None    # a CPU tensor: no
    assert template_mm._tma_plan(a.unsqueeze(0), b.unsqueeze(0), None, False) is None
    plan = template_mm._tma_plan(a.unsqueeze(0), b.unsqueeze(0), None, True)
    assert plan is not None and plan[2] == matmul_configs.TMA_CONFIG
    monkeypatch.setattr(template_mm, "_hopper", lambda device: True)   # as on an H100
    assert template_mm._tma_plan(a.unsqueeze(0), b.unsqueeze(0), None, None)[2] == matmul_configs.TMA_CONFIG
    # smaller than one TMA tile each way: the pointer template's small tiles serve it, even given a tile
    small = torch.randn(64, 64, dtype=torch.float16)
    assert template_mm._tma_plan(small.unsqueeze(0), b.unsqueeze(0), SMALL_TILE, None) is None
    assert template_mm._tma_plan(small.unsqueeze(0), b.unsqueeze(0), SMALL_TILE, True) is not None
    assert matmul_configs.tma_config(64, 4096, 4096, torch.bfloat16) is None
    assert matmul_configs.tma_config(4096, 4096, 4096, torch.float32) is None
    assert matmul_configs.tma_config(4096, 4096, 4096, torch.bfloat16, batch=2) is None
    assert matmul_configs.fits(matmul_configs.TMA_CONFIG, torch.bfloat16)


@pytest.mark.parametrize("dtype,a_t,b_t,store", [(torch.bfloat16, False, True, False),
                                                (torch.float16, True, False, False),
                                                (torch.bfloat16, False, False, False),
                                                (torch.bfloat16, False, True, True)])
def test_tma_source_compiles_for_sm90_to_bulk_tensor_copies_and_warpgroup_mma(dtype, a_t, b_t, store, tmp_path):
    """What a Hopper GPU would run for the TMA template (no GPU needed), in a process of its own: operand tiles
    arrive by TMA bulk tensor copies, the product is a warpgroup MMA, and the tile fits shared memory. With
    `store`, the product leaves by a bulk tensor copy from shared memory to global memory too."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from brrr.compile.matmul.template_tma import generate_tma
    config = matmul_configs.TMA_CONFIG
    src = generate_tma(dtype, chain(Bias(), Activation("gelu_tanh")), store_descriptor=store)
    path = tmp_path / f"{src.name}.py"
    short = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    a_block = [config.block_k, config.block_m] if a_t else [config.block_m, config.block_k]
    b_block = [config.block_n, config.block_k] if b_t else [config.block_k, config.block_n]
    out_type = f"tensordesc<{short}{[config.block_m, config.block_n // 2]}>" if store else f"*{short}"
    types = dict(a_desc=f"tensordesc<{short}{a_block}>", b_desc=f"tensordesc<{short}{b_block}>",
                 out_ptr=out_type, bias_ptr=f"*{short}")
    consts = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
                  A_T=a_t, B_T=b_t, NUM_SMS=132, stride_on=1, stride_biasn=1, stride_biasm=0, stride_biasb=0)
    result = _compiled_for_sm90(src, path, types, consts, config)
    kind = {torch.bfloat16: "bf16.bf16", torch.float16: "f16.f16"}[dtype]
    assert result["mma"] and all(op.startswith("wgmma") and kind in op for op in result["mma"]), result
    assert result["tma"] and not result["copies"], result     # no cp.async: every operand tile comes by TMA
    stores = [op for op in result["tma"] if ".global.shared" in op]
    assert bool(stores) == store, result
    # the pipeline's operand tiles and, beyond `shared_bytes`, the epilogue's layout conversion: within the SM
    assert config.shared_bytes(dtype.itemsize) <= result["shared"] <= SHARED_MEMORY, result
    assert re.fullmatch(r"brrr_mm_tma_store_\w+" if store else r"brrr_mm_tma_(?!store)\w+", src.name)
