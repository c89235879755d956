"""The repeat sweep: `x = x * 2` r times, compiled, for r = 1, 2, 4, ... max_repeat.

Each call reads x once and writes the result once (2 * numel * itemsize bytes) and does numel * r
multiplies, so raising r raises compute intensity without moving more bytes. Runtime stays flat while the
kernel is bandwidth-bound and starts to grow once the multiplies catch up: the knee. Achieved FLOP/s
(numel * r / t) and bandwidth (2 * numel * itemsize / t) are drawn against the measured ceilings. One
multiply is one FLOP and one instruction, so its roof is half the FMA-counted vector rate. (Past r ~ 128
fp32 values overflow to inf; GPUs multiply inf at full speed, as in the seed's original experiment.)

`run()` is `brrr experiment repeat`; `sweep()` only measures, `plot()` only draws.
"""

import torch

from brrr.bench.backends import fresh_compile, strict_dynamo
from brrr.bench.timing import time_kernel
from brrr.experiments import common
from brrr.experiments.knee import approach_knee, runtime_knee


def make_repeat_fn(repeat):
    """A fresh function doing `x = x * 2` `repeat` times."""
    def times_two_repeated(x):
        for _ in range(repeat):
            x = x * 2
        return x

    times_two_repeated.__name__ = f"times_two_x{repeat}"
    return times_two_repeated


def repeat_counts(max_repeat):
    counts, r = [], 1
    while r <= max_repeat:
        counts.append(r)
        r *= 2
    return counts


def sweep(backend, device, dtype, numel, max_repeat, progress=False, warmup=25, rep=100):
    """One row per r: time (median, p20, p80), FLOP/s and bandwidth, or the error that stopped it."""
    from rich.progress import Progress

    x = torch.rand(numel, device=device, dtype=dtype) + 0.5
    itemsize = x.element_size()
    counts = repeat_counts(max_repeat)
    rows = []
    with strict_dynamo(recompile_limit=4 * len(counts) + 8), \
            Progress(disable=not progress, transient=True) as bar:
        torch._dynamo.reset()
        task = bar.add_task(f"x*2 repeated ({backend})", total=len(counts))
        for r in counts:
            row = {"repeat": r, "flops": numel * r, "bytes": 2 * numel * itemsize}
            try:
                fn = fresh_compile(make_repeat_fn(r), backend)  # eager: the plain function
                timing = time_kernel(lambda: fn(x), device, warmup=warmup, rep=rep)
                row.update(time_s=timing.median_s, p20_s=timing.p20_s, p80_s=timing.p80_s,
                           flops_per_s=row["flops"] / timing.median_s, bytes_per_s=row["bytes"] / timing.median_s)
            except Exception as e:
                row.update(time_s=None, flops_per_s=None, bytes_per_s=None, error=f"{type(e).__name__}: {e}"[:300])
            rows.append(row)
            bar.advance(task)
        torch._dynamo.reset()
    return rows


def find_knees(rows, ceilings):
    """The runtime knee (first r > 1.3x the flat time) and the r where FLOP/s reaches half the mul roof."""
    counts = [r["repeat"] for r in rows]
    knee_runtime = runtime_knee(counts, [r["time_s"] for r in rows])
    mul_roof = ceilings.vector_fp32 / 2 if ceilings is not None else None
    knee_flops = approach_knee(counts, [r["flops_per_s"] for r in rows], mul_roof, fraction=0.5)
    return knee_runtime, knee_flops


def run(backend="inductor", device=None, dtype=torch.float32, numel=None, max_repeat=256, png=None,
        json_path=None, progress=False, ceilings=None, warmup=25, rep=100, print_table=True):
    """Run the sweep, print a table, optionally write a PNG and JSON; return the result dict."""
    device = common.resolve_device(device)
    dtype = dtype or torch.float32
    numel = numel or (2**28 if device.type == "cuda" else 2**20)
    ceilings, ceilings_note = common.load_ceilings(device, ceilings, progress)
    rows = sweep(backend, device, dtype, numel, max_repeat, progress, warmup, rep)
    knee_runtime, knee_flops = find_knees(rows, ceilings)
    result = {
        "experiment": "repeat", "backend": backend if isinstance(backend, str) else getattr(backend, "__name__", "?"),
        "device": str(device), "device_name": common.device_name(device),
        "dtype": str(dtype).replace("torch.", ""), "numel": numel, "max_repeat": max_repeat, "rows": rows,
        "knee": knee_runtime if knee_runtime is not None else knee_flops,
        "knee_runtime": knee_runtime, "knee_flops": knee_flops,
        "ceilings": common.ceilings_dict(ceilings), "ceilings_note": ceilings_note, "versions": common.versions(),
    }
    return common.report(result, print_result, plot, print_table, png, json_path)


def print_result(result, console):
    from rich.table import Table

    ceilings = result["ceilings"] or {}
    bandwidth, vector = ceilings.get("bandwidth"), ceilings.get("vector_fp32")
    table = Table(title=f"x*2 repeated r times: {result['backend']}, {result['dtype']}, "
                        f"{result['numel']:,} elements on {result['device_name']}")
    for name in ("r", "runtime ms", "TFLOP/s", "GB/s", "% of copy bandwidth", "% of mul roof"):
        table.add_column(name, justify="right")
    for row in result["rows"]:
        if row["time_s"] is None:
            table.add_row(str(row["repeat"]), f"[red]FAILED: {row['error'][:60]}[/red]", "", "", "", "")
            continue
        mark = " ◀ knee" if row["repeat"] == result["knee"] else ""
        table.add_row(f"{row['repeat']}{mark}", f"{row['time_s'] * 1e3:.3f}", f"{row['flops_per_s'] / 1e12:.3f}",
                      f"{row['bytes_per_s'] / 1e9:.1f}",
                      f"{100 * row['bytes_per_s'] / bandwidth:.0f}%" if bandwidth else "—",
                      f"{100 * row['flops_per_s'] / (vector / 2):.0f}%" if vector else "—")
    console.print(table)
    console.print(f"knee: r = {result['knee']} (runtime > 1.3x flat at r = {result['knee_runtime']}; "
                  f"FLOP/s at half the mul roof at r = {result['knee_flops']})")


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["time_s"] is not None]
    counts = [r["repeat"] for r in rows]
    ceilings = result["ceilings"] or {}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (
        ("runtime (ms)", [r["time_s"] * 1e3 for r in rows], []),
        ("achieved FLOP/s", [r["flops_per_s"] for r in rows],
         [(ceilings.get("vector_fp32"), "vector fp32 (FMA = 2 FLOP)"),
          (ceilings.get("vector_fp32", 0) / 2 or None, "mul roof (1 FLOP per instruction)")]),
        ("achieved bandwidth (bytes/s)", [r["bytes_per_s"] for r in rows],
         [(ceilings.get("bandwidth"), "measured copy bandwidth")]),
    )
    for ax, (title, values, roofs) in zip(axes, panels):
        ax.set_title(title)
        if not rows:  # every r failed: say so instead of drawing empty log axes
            ax.text(0.5, 0.5, "no successful runs", ha="center", va="center", transform=ax.transAxes)
            continue
        ax.plot(counts, values, "o-", label=result["backend"])
        for value, label in roofs:
            if value:
                ax.axhline(value, linestyle="--", color="gray", linewidth=1)
                ax.annotate(label, (counts[0] if counts else 1, value), textcoords="offset points", xytext=(2, 3),
                            fontsize=8, color="gray")
        if result["knee"] is not None:
            ax.axvline(result["knee"], color="tab:red", linestyle=":", label=f"knee r = {result['knee']}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("repeat r (multiplies per element)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"x*2 repeated: {result['backend']}, {result['dtype']}, {result['numel']:,} elements, "
                 f"{result['device_name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
