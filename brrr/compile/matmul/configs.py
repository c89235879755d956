"""Tile configurations of the matmul template (schedule -> **codegen** -> runtime): which block sizes a matmul runs.

`CONFIGS` is the short list of candidates, chosen for the H100 (132 SMs, 227 KiB of shared memory per block).
`candidates(...)` keeps those that fit a problem and a dtype; `default_config(...)` picks one by rule, without
timing. The rule's tiles are measured ones: on an H200, bf16, 128x128x64 with 8 warps and 3 stages was the
fastest tile of the template or within a point of it on 4096^3 and on five of the zoo's LM matmuls (70-83% of
cuBLAS), where 128x256 ran at 60-72% (benchmarks/NOTES.md, "What brings the matmul template to cuBLAS?").
The seam for autotuning: a later step times `candidates(...)` (and cuBLAS) once per problem and caches the
winner; `default_config` stays as what runs before (or without) that measurement.
"""

from dataclasses import dataclass

SMS = 132                        # H100 SXM streaming multiprocessors: tiles enough to fill them come first
WAVE_FILL = 0.75                 # a rule of thumb, not measured: a tile whose waves leave more SMs idle is passed
# bytes of shared memory a block may use on the H100; compiled for sm_90, the template's kernels used at most
# `TileConfig.shared_bytes` (exactly, on wgmma; the epilogue's layout conversion reuses the pipeline's buffers)
SHARED_MEMORY = 227 * 1024
# no tile the rule picks covers more output than this: 128x256 tiles (8 warps, a 128-register fp32 accumulator
# per thread) ran 4-15 points of cuBLAS behind 128x128 on every shape measured
DEFAULT_MAX_AREA = 128 * 128


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int

    def shared_bytes(self, itemsize):
        """Shared memory of the pipelined operand tiles, num_stages copies of an A and a B tile: what a wgmma
        kernel takes (the mma.sync pipeline of 16-row tiles keeps one copy fewer)."""
        return (self.block_m + self.block_n) * self.block_k * itemsize * self.num_stages

    def meta(self, k):
        """Launch keywords: the template's constexprs and the compile options."""
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k, GROUP_M=self.group_m,
                    EVEN_K=k % self.block_k == 0, num_warps=self.num_warps, num_stages=self.num_stages)

    def tiles(self, m, n, batch=1):
        return -(-m // self.block_m) * -(-n // self.block_n) * batch


CONFIGS = (
    TileConfig(128, 256, 64, 8, 8, 3),   # half precision, for autotuning only: larger than DEFAULT_MAX_AREA
    TileConfig(128, 128, 64, 8, 8, 3),   # the default of large half-precision problems (the measured best)
    TileConfig(128, 128, 64, 8, 8, 4),
    TileConfig(128, 128, 32, 8, 8, 3),   # fp32's large tile (64-deep K steps overflow shared memory at 4 bytes)
    TileConfig(64, 128, 32, 8, 4, 4),
    TileConfig(64, 64, 32, 8, 4, 2),
    TileConfig(32, 64, 64, 8, 4, 3),     # M <= 32
    TileConfig(16, 128, 64, 8, 4, 3),    # M <= 16: decode-like rows
)


# the TMA persistent template's tile (template_tma.py): the fastest or within 4 points of it on
# 4096^3 and five LM shapes; 4 stages of it overflow the H200's shared memory
TMA_CONFIG = TileConfig(128, 256, 64, 8, 8, 3)
# the TMA template's candidates for timing: the rule's tile, 128x128 (within 2% of the best on the LM shapes in
# the probe), and 128x64, whose twice as many tiles fill more SMs where N is small (BERT's FFN down: 96 tiles of
# 128x256 for 132 SMs)
TMA_CONFIGS = (TMA_CONFIG, TileConfig(128, 128, 64, 8, 4, 4), TileConfig(128, 128, 64, 8, 8, 3),
               TileConfig(128, 64, 64, 8, 4, 4))
TMA_MIN_SIDE = 128   # a smaller M or N leaves most of a TMA tile empty: the pointer template's small tiles serve it


def tma_config(m, n, k, dtype, batch=1):
    """The TMA template's tile for this problem, or None where it should not run: a batched product, an
    operand type wgmma cannot read transposed (fp32), or an output smaller than one tile each way (the pointer
    template's small tiles serve those)."""
    if batch != 1 or dtype.itemsize != 2 or min(m, n) < TMA_MIN_SIDE:
        return None
    return TMA_CONFIG if fits(TMA_CONFIG, dtype) else None


def fits(config, dtype):
    return config.shared_bytes(dtype.itemsize) <= SHARED_MEMORY


def candidates(m, n, k, dtype, batch=1):
    """The configs worth trying for this problem: within shared memory, and no tile taller than M needs
    (a small M only takes the small-M tiles, a large M only the others)."""
    usable = [c for c in CONFIGS if fits(c, dtype)]
    if m <= 32:
        return [c for c in usable if c.block_m <= 32] or usable
    return [c for c in usable if c.block_m >= 64] or usable


def default_config(m, n, k, dtype, batch=1, sms=SMS):
    """A config by rule. M <= 32: the smallest small-M tile that covers M. Else, among tiles of at most
    DEFAULT_MAX_AREA, the largest whose waves of one tile per SM are at least WAVE_FILL busy (larger tiles read
    each operand fewer times); where none is, the tile that leaves each SM the least output area (padding and
    the idle part of the last wave included)."""
    usable = candidates(m, n, k, dtype, batch)
    if m <= 32:
        small = [c for c in usable if c.block_m >= m] or usable
        return min(small, key=lambda c: (c.block_m, -c.block_n))
    usable = [c for c in usable if c.block_m * c.block_n <= DEFAULT_MAX_AREA] or usable
    busy = [c for c in usable if wave_fill(c, m, n, batch, sms) >= WAVE_FILL]
    if busy:
        return max(busy, key=lambda c: c.block_m * c.block_n)   # the first of the largest: CONFIGS order
    return min(usable, key=lambda c: (wave_area(c, m, n, batch, sms), -c.block_m * c.block_n))


def waves(config, m, n, batch=1, sms=SMS):
    return -(-config.tiles(m, n, batch) // sms)


def wave_fill(config, m, n, batch=1, sms=SMS):
    """The busy share of the SMs over the kernel's waves of tiles (the last wave may run part empty)."""
    return config.tiles(m, n, batch) / (waves(config, m, n, batch, sms) * sms)


def wave_area(config, m, n, batch=1, sms=SMS):
    """Output elements one SM computes, padding included, when tiles run in waves of one per SM."""
    return waves(config, m, n, batch, sms) * config.block_m * config.block_n
