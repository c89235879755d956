"""What bench() returns: one row per backend, a rich table for the terminal and a dict for JSON."""

import math
from dataclasses import dataclass, field

import torch

from brrr.bench.compare import Error


@dataclass
class BenchRow:
    backend: str
    status: str = "ok"                    # "ok" | "wrong" | "failed"
    reason: str | None = None             # "FAILED: ..." or "WRONG: ..." for the table
    median_s: float | None = None         # one call on the device (do_bench median / perf_counter median)
    p20_s: float | None = None
    p80_s: float | None = None
    steady_s: float | None = None         # per call when calls run back to back (host overhead included)
    graph_s: float | None = None          # per call replayed from a CUDA graph: device time only (graph_timing)
    speedup: float | None = None          # eager median / this median
    cold_compile_s: float | None = None   # first call after a Dynamo reset (compile + one run)
    warm_compile_s: float | None = None   # the same, again, with on-disk caches now warm
    peak_memory_bytes: int | None = None  # torch.cuda.max_memory_allocated during one call; None on CPU
    error_vs_eager: Error | None = None
    error_vs_reference: Error | None = None   # half types: vs the higher-precision run (BenchResult.reference)
    timing_method: str | None = None

    def to_dict(self):
        return with_errors_as_dicts(self)


def with_errors_as_dicts(row):
    """A row's fields as a dict, its Error fields as dicts too (JSON-ready)."""
    d = dict(row.__dict__)
    for key in ("error_vs_eager", "error_vs_reference"):
        d[key] = d[key].to_dict() if d[key] is not None else None
    return d


@dataclass
class Measured:
    """What every result holds: one row per backend, and what was measured where."""
    rows: list
    label: str
    device: str
    dtype: str
    train: bool
    versions: dict

    def row(self, backend):
        return next(r for r in self.rows if r.backend == backend)

    def head_dict(self):
        return {"label": self.label, "device": self.device, "dtype": self.dtype, "train": self.train,
                "versions": self.versions}


@dataclass
class BenchResult(Measured):
    notes: list = field(default_factory=list)
    reference: str | None = None          # dtype of the higher-precision run half types are judged against

    def to_dict(self):
        return {**self.head_dict(), "notes": self.notes, "reference": self.reference,
                "rows": [r.to_dict() for r in self.rows]}

    def print(self, console):
        from rich.table import Table

        mode = "train step" if self.train else "inference"
        table = Table(title=f"{self.label}: {mode}, {self.dtype} on {self.device}",
                      caption="median ±half the p20–p80 range; compile = first call after a Dynamo reset, "
                              "cold / warm caches; err = max abs / max rel vs eager")
        headers = ("backend", "result", "median ms", "back-to-back ms", "graph ms", "speedup", "compile s",
                   "peak MiB", "err vs eager", f"err vs {self.reference or 'ref'}")
        cells = [(r.backend, _status(r), _median(r), _ms(r.steady_s), _ms(r.graph_s), _x(r.speedup),
                  _compile(r.cold_compile_s, r.warm_compile_s), _mib(r.peak_memory_bytes),
                  _errors(r.error_vs_eager), _err(r.error_vs_reference, "norm_rel")) for r in self.rows]
        keep = [i for i in range(len(headers)) if i < 2 or any(row[i] != "—" for row in cells)]  # drop empty columns
        for i in keep:
            if i < 2:
                width = min(12, max(len(headers[i]), *(len(r.backend) for r in self.rows))) if i == 0 else 8
                table.add_column(headers[i], overflow="fold", min_width=width)
            else:
                table.add_column(headers[i], justify="right", overflow="fold")
        for row in cells:
            table.add_row(*(row[i] for i in keep))
        console.print(table)
        for note in self.notes:
            console.print(f"[dim]{note}[/dim]")


def _status(row):
    if row.status == "ok":
        return "[green]ok[/green]"
    color = "red" if row.status == "failed" else "yellow"
    return f"[{color}]{row.reason}[/{color}]"


def _ms(seconds):
    return "—" if seconds is None else f"{seconds * 1e3:.3f}"


def _median(row):
    if row.median_s is None:
        return "—"
    return f"{row.median_s * 1e3:.3f} ±{50 * (row.p80_s - row.p20_s) / row.median_s:.0f}%"


def _compile(cold, warm):
    if cold is None:
        return "—"
    return f"{cold:.2f}" if warm is None else f"{cold:.2f} / {warm:.2f}"


def _errors(error):
    return "—" if error is None else f"{_err(error, 'max_abs')} / {_err(error, 'max_rel')}"


def _x(value):
    return "—" if value is None else f"{value:.2f}x"


def _s(seconds):
    return "—" if seconds is None else f"{seconds:.2f}"


def _mib(nbytes):
    return "—" if nbytes is None else f"{nbytes / 2**20:.1f}"


def _err(error, key):
    if error is None:
        return "—"
    value = getattr(error, key)
    return "inf" if math.isinf(value) else f"{value:.1e}"


def dtype_name(dtype):
    return str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else str(dtype)
