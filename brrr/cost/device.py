"""The machine's own ceilings: copy bandwidth, matmul rate per dtype, plain fp32 rate, launch latency.

Measured once per device and software versions, cached as JSON under ~/.cache/brrr (or $BRRR_CACHE_DIR),
and shown beside datasheet values. Every roofline in brrr divides by these numbers: the analyzer to place
ops, the compiler to decide fusion, the experiments to draw their roofs.

How each number is measured:
- bandwidth: a large device-to-device copy; bytes read + bytes written over the median time.
- matmul[dtype]: a square random matmul (8192 on GPU, smaller on CPU); 2*n^3 over the median time.
  "fp32" has TF32 off, "tf32" on.
- vector_fp32: on CUDA a Triton kernel running a long dependent FMA chain per element (2 FLOPs per FMA);
  on CPU the fp32 matmul rate stands in (both run on the same FMA units).
- launch_latency: many back-to-back ops on a 1-element tensor; elapsed time per op (dispatch + launch).
"""

import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path

import torch

MATMUL_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Dense (no sparsity) datasheet figures. Keys are matched against torch.cuda.get_device_name().
DATASHEETS = [
    ("H200", {"bandwidth": 4.8e12, "matmul": {"fp32": 67e12, "tf32": 494e12, "bf16": 989e12, "fp16": 989e12},
              "vector_fp32": 67e12}),
    ("H100 PCIe", {"bandwidth": 2.0e12, "matmul": {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
                   "vector_fp32": 51e12}),
    ("H100", {"bandwidth": 3.35e12, "matmul": {"fp32": 67e12, "tf32": 494e12, "bf16": 989e12, "fp16": 989e12},
              "vector_fp32": 67e12}),
    ("A100-SXM4-80GB", {"bandwidth": 2.039e12, "matmul": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12,
                                                          "fp16": 312e12}, "vector_fp32": 19.5e12}),
    ("A100", {"bandwidth": 1.555e12, "matmul": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
              "vector_fp32": 19.5e12}),
]


def _dtype_key(dtype):
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype in (None, torch.float32):
        return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"
    return None


@dataclass
class Ceilings:
    device: str
    kind: str
    bandwidth: float
    matmul: dict
    vector_fp32: float
    launch_latency: float
    datasheet: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    measured_at: str = ""

    def peak_flops(self, dtype=None, contraction=False):
        """The FLOP/s roof an op can reach: tensor-core rate for its dtype if it is a contraction."""
        if contraction:
            key = _dtype_key(dtype)
            if key is not None and self.matmul.get(key):
                return self.matmul[key]
        return self.vector_fp32

    def roofline_time(self, flops, bytes, dtype=None, contraction=False):
        """The roofline floor: max(flops / peak, bytes / bandwidth), in seconds."""
        peak = self.peak_flops(dtype, contraction)
        compute = flops / peak if peak else 0.0
        memory = bytes / self.bandwidth if self.bandwidth else 0.0
        return max(compute, memory)

    def ridge_point(self, dtype=None, contraction=False):
        """FLOPs per byte above which an op is compute-bound."""
        return self.peak_flops(dtype, contraction) / self.bandwidth

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        return cls(**d)


def _versions():
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"torch": torch.__version__, "triton": triton_version}


def device_name(device):
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def datasheet_for(name):
    for key, sheet in DATASHEETS:
        if key in name:
            return sheet
    return {}


# --- timing ---------------------------------------------------------------------------------------------------

def synchronize(device):
    """Wait for the device's queued work (a no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn, device):
    """Seconds of one call of fn(), synchronized on both sides."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def median_time(fn, device, reps, rep_ms=100, warmup_ms=25):
    """Median seconds of fn(): CUDA events via triton's do_bench on GPU, perf_counter on CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") / 1e3
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Buffers several times the largest L2 (50-60 MB on an H100 or H200) but no larger: the compiler measures the
# ceilings on a machine's first compile, inside the user's process, where 2 GiB of copy buffers set the whole
# run's peak memory (ResNet-18 training: 2433 MiB against 1119 once the ceilings were on disk).
COPY_NUMEL = 2**26            # fp32 elements copied: 256 MiB read, 256 MiB written
MATMUL_N = {torch.float32: 6144}   # fp32 and tf32 operands 144 MiB each; 16-bit ones 8192 (128 MiB)


def measure_bandwidth(device):
    numel = COPY_NUMEL if device.type == "cuda" else 2**24
    x = torch.randn(numel, device=device)
    y = torch.empty_like(x)
    seconds = median_time(lambda: y.copy_(x), device, reps=10)
    return 2 * x.numel() * x.element_size() / seconds


def measure_matmul(device, key):
    dtype = MATMUL_DTYPES[key]
    if device.type == "cuda":
        n = MATMUL_N.get(dtype, 8192)
    else:
        n = 1024 if dtype == torch.float32 else 256
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = key == "tf32"
    try:
        # Short bursts: 100 ms of back-to-back bf16 matmuls measured 680 TFLOP/s on the H100, short bursts
        # about 790 (KINDS.md); sustained load likely lowers the clocks, and models run matmuls in bursts.
        seconds = median_time(lambda: torch.mm(a, b), device, reps=3, rep_ms=30)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return 2 * n**3 / seconds


def _fma_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def fma_chain(x_ptr, out_ptr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(x_ptr + offsets)
        b = a * 0.5 + 0.25
        for _ in range(ITERS):
            a = a * 0.999 + b  # one dependent FMA per iteration: 2 FLOPs
        tl.store(out_ptr + offsets, a)

    return fma_chain


def measure_vector_fp32(device, matmul_fp32):
    if device.type != "cuda":
        return matmul_fp32
    kernel = _fma_kernel()
    numel, iters, block = 2**24, 512, 1024
    x = torch.randn(numel, device=device)
    out = torch.empty_like(x)
    seconds = median_time(lambda: kernel[(numel // block,)](x, out, ITERS=iters, BLOCK=block), device, reps=10)
    return 2 * iters * numel / seconds


def measure_launch_latency(device, ops=2000):
    x = torch.zeros(1, device=device)
    for _ in range(50):
        x.add_(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(ops):
            x.add_(1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append((time.perf_counter() - start) / ops)
    return min(samples)


def measure_ceilings(device, progress=False):
    device = torch.device(device)
    name = device_name(device)
    steps = [("copy bandwidth", None)] + [(f"{k} matmul", k) for k in MATMUL_DTYPES] + [("fp32 FMA rate", None),
                                                                                         ("launch latency", None)]
    results = {}
    with _progress(progress, len(steps), f"measuring ceilings of {name}") as advance:
        results["bandwidth"] = measure_bandwidth(device)
        advance()
        matmul = {}
        for key in MATMUL_DTYPES:
            matmul[key] = measure_matmul(device, key)
            advance()
        results["vector_fp32"] = measure_vector_fp32(device, matmul["fp32"])
        advance()
        results["launch_latency"] = measure_launch_latency(device)
        advance()
    return Ceilings(device=name, kind=device.type, bandwidth=results["bandwidth"], matmul=matmul,
                    vector_fp32=results["vector_fp32"], launch_latency=results["launch_latency"],
                    datasheet=datasheet_for(name), versions=_versions(), measured_at=date.today().isoformat())


class _progress:
    """A rich progress bar over measurement steps, or nothing."""

    def __init__(self, enabled, total, description):
        self.enabled, self.total, self.description = enabled, total, description

    def __enter__(self):
        if not self.enabled:
            return lambda: None
        from rich.progress import Progress

        self.bar = Progress(transient=True)
        self.bar.start()
        task = self.bar.add_task(self.description, total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.stop()


# --- cache ------------------------------------------------------------------------------------------------------

def cache_dir():
    return Path(os.environ.get("BRRR_CACHE_DIR") or Path.home() / ".cache" / "brrr")


def cache_path(device):
    versions = _versions()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_name(device)).strip("-").lower()
    return cache_dir() / f"ceilings-{slug}-torch{versions['torch']}-triton{versions['triton']}.json"


def _load_cached(path):
    try:
        ceilings = Ceilings.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # missing or corrupt: measure again
    if not all(math.isfinite(v) and v > 0 for v in (ceilings.bandwidth, ceilings.vector_fp32)):
        return None
    return ceilings


def _store(path, ceilings):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(ceilings.to_dict(), indent=2))
    os.replace(tmp, path)


def get_ceilings(device=None, refresh=False, progress=False, apart=None):
    """Ceilings of `device` (default: cuda if present, else cpu), measured once and cached. `apart` (default: on
    a GPU) measures them in a child process: the compiler and the analyzer measure on a machine's first use, inside
    the user's process, where the copy and matmul buffers (up to 512 MiB) would count in its peak memory and stay
    in its allocator's cache. Where the child cannot measure (no interpreter to start, an exclusive-process GPU),
    they are measured here."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    path = cache_path(device)
    if not refresh:
        cached = _load_cached(path)
        if cached is not None:
            return cached
    if device.type == "cuda" if apart is None else apart:
        with _progress(progress, 1, f"measuring ceilings of {device_name(device)}") as advance:
            measured = _measured_in_child(device)
            advance()
        cached = _load_cached(path) if measured else None
        if cached is not None:
            return cached
    ceilings = measure_ceilings(device, progress=progress)
    _store(path, ceilings)
    return ceilings


def _measured_in_child(device):
    """Whether a child process (`python -m brrr.cost.device DEVICE`) measured `device`'s ceilings into the cache."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))   # brrr, wherever it came from
    if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        torch.cuda.synchronize(device)
    try:
        child = subprocess.run([sys.executable, "-m", "brrr.cost.device", str(device)], env=env, timeout=300,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return child.returncode == 0


# --- display ----------------------------------------------------------------------------------------------------

def _fmt_rate(value, unit):
    if value is None:
        return "-"
    return f"{value / 1e12:,.2f} T{unit}" if value >= 1e11 else f"{value / 1e9:,.1f} G{unit}"


def ceiling_rows(ceilings):
    """(name, measured, datasheet) rows, in display units."""
    sheet = ceilings.datasheet or {}
    rows = [("copy bandwidth", _fmt_rate(ceilings.bandwidth, "B/s"), _fmt_rate(sheet.get("bandwidth"), "B/s"),
             ceilings.bandwidth, sheet.get("bandwidth"))]
    for key, rate in ceilings.matmul.items():
        ref = sheet.get("matmul", {}).get(key)
        rows.append((f"{key} matmul", _fmt_rate(rate, "FLOP/s"), _fmt_rate(ref, "FLOP/s"), rate, ref))
    ref = sheet.get("vector_fp32")
    rows.append(("fp32 FMA (no tensor cores)", _fmt_rate(ceilings.vector_fp32, "FLOP/s"), _fmt_rate(ref, "FLOP/s"),
                 ceilings.vector_fp32, ref))
    rows.append(("launch latency", f"{ceilings.launch_latency * 1e6:.1f} us", "-", None, None))
    return rows


def print_ceilings(ceilings, console):
    from rich.table import Table

    table = Table(title=f"Ceilings of {ceilings.device} (torch {ceilings.versions.get('torch')}, "
                        f"triton {ceilings.versions.get('triton')}, measured {ceilings.measured_at})")
    table.add_column("ceiling")
    table.add_column("measured", justify="right")
    table.add_column("datasheet", justify="right")
    table.add_column("measured / datasheet", justify="right")
    for name, measured, sheet, value, ref in ceiling_rows(ceilings):
        ratio = f"{value / ref:.0%}" if value and ref else "-"
        table.add_row(name, measured, sheet, ratio)
    console.print(table)
    ridge = ceilings.ridge_point(torch.bfloat16, contraction=True)
    console.print(f"ridge point: {ceilings.ridge_point():.1f} FLOP/byte (fp32 FMA), {ridge:.0f} FLOP/byte (bf16 matmul)")


if __name__ == "__main__":   # the child of get_ceilings(apart=True): measure, store, exit
    _measured = torch.device(sys.argv[1])
    _store(cache_path(_measured), measure_ceilings(_measured))
