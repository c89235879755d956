"""The batch-scaling overhead test: double the batch until runtime grows in proportion.

Overhead (Python, dispatch, kernel launches) does not grow with the batch; compute and memory traffic do.
So while doubling the batch leaves the step time roughly flat, the model is overhead-bound; once each
doubling nearly doubles the time (t(2B)/t(B) >= 1.8 twice in a row) the sweep stops. Steps are timed back
to back (synchronizing only around a loop), the way a training loop runs, so host overhead is visible —
per-call device timers would hide it behind the device's queue.

`run()` is `brrr experiment overhead`; `sweep()` only measures, `plot()` only draws.
"""

import torch

from brrr.bench.backends import fresh_compile, strict_dynamo
from brrr.bench.timing import time_steady
from brrr.experiments import common
from brrr.experiments.knee import grows_in_proportion, overhead_bound_batch, scaling_ratios


def example_builder(example, device, dtype, **sizes):
    """model_fn(batch) -> (model, inputs) from a brrr.examples builder."""
    from brrr.examples import build_example

    return lambda batch: build_example(example, device=device, dtype=dtype, batch=batch, **sizes)


def sweep(model_fn, device, backend=None, max_batch=2**16, progress=False, chunk_s=0.02):
    """Step time for batch = 1, 2, 4, ... until runtime grows in proportion, max_batch, or an error."""
    from rich.progress import Progress

    rows, stop_reason = [], f"reached max batch {max_batch}"
    batch = 1
    with strict_dynamo(), Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("batch doubling", total=max_batch.bit_length())
        while batch <= max_batch:
            try:
                model, inputs = model_fn(batch)
                fn = fresh_compile(model, backend, dynamic=False) if backend else model

                def step(fn=fn, inputs=inputs):
                    with torch.no_grad():
                        return fn(*inputs)

                t = time_steady(step, device, chunk_s=chunk_s).median_s
            except Exception as e:  # out of memory, a failing backend: the sweep ends here, recorded
                stop_reason = f"batch {batch}: {type(e).__name__}: {e}"[:300]
                break
            finally:
                model = inputs = fn = None
            rows.append({"batch": batch, "time_s": t, "time_per_sample_s": t / batch})
            bar.advance(task)
            if grows_in_proportion([r["time_s"] for r in rows]):
                stop_reason = "runtime grew in proportion to the batch for two doublings"
                break
            batch *= 2
        torch._dynamo.reset()
    times = [r["time_s"] for r in rows]
    for row, ratio in zip(rows[1:], scaling_ratios(times)):
        row["ratio_to_previous"] = ratio
    return rows, stop_reason


def run(example="mlp", device=None, dtype=None, backend=None, png=None, json_path=None, progress=False,
        model_fn=None, max_batch=None, sizes=None, print_table=True, chunk_s=0.02):
    """Run the sweep, print a table, optionally write a PNG and JSON; return the result dict.

    model_fn(batch) -> (model, inputs) overrides `example`; `sizes` passes builder sizes (e.g. dim=256).
    """
    device = common.resolve_device(device)
    dtype = dtype or torch.float32
    max_batch = max_batch or (2**16 if device.type == "cuda" else 2**12)
    if model_fn is None:
        model_fn = example_builder(example, device, dtype, **(sizes or {}))
        label = example
    else:
        label = getattr(model_fn, "__name__", "model_fn")
    rows, stop_reason = sweep(model_fn, device, backend, max_batch, progress, chunk_s)
    batches, times = [r["batch"] for r in rows], [r["time_s"] for r in rows]
    bound = overhead_bound_batch(batches, times) if rows else None
    result = {
        "experiment": "overhead", "model": label, "backend": backend or "eager", "device": str(device),
        "device_name": common.device_name(device), "dtype": str(dtype).replace("torch.", ""), "rows": rows,
        "overhead_bound_batch": bound, "fixed_cost_s": times[0] if times else None,
        "stop_reason": stop_reason, "versions": common.versions(),
    }
    return common.report(result, print_result, plot, print_table, png, json_path)


def print_result(result, console):
    from rich.table import Table

    table = Table(title=f"batch doubling: {result['model']} ({result['backend']}, {result['dtype']}) "
                        f"on {result['device_name']}")
    for name in ("batch", "ms / step", "µs / sample", "t(B) / t(B/2)"):
        table.add_column(name, justify="right")
    for row in result["rows"]:
        mark = " ◀ overhead-bound up to here" if row["batch"] == result["overhead_bound_batch"] else ""
        ratio = row.get("ratio_to_previous")
        table.add_row(f"{row['batch']}{mark}", f"{row['time_s'] * 1e3:.3f}", f"{row['time_per_sample_s'] * 1e6:.2f}",
                      "—" if ratio is None else f"{ratio:.2f}")
    console.print(table)
    bound = result["overhead_bound_batch"]
    if not result["rows"]:
        console.print(f"no measurement: {result['stop_reason']}")
    elif bound is None:
        console.print("not overhead-bound: the first doubling already grew the step time in proportion")
    else:
        console.print(f"overhead-bound at batch <= {bound}: up to there the step time stays within 1.3x of the "
                      f"fastest smaller batch's (batch 1: {result['fixed_cost_s'] * 1e3:.3f} ms). "
                      f"Sweep stopped: {result['stop_reason']}")


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    batches = [r["batch"] for r in rows]
    fig, (ax_step, ax_sample) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax_step.plot(batches, [r["time_s"] * 1e3 for r in rows], "o-", label="measured")
    if rows:
        last = rows[-1]
        ax_step.plot(batches, [last["time_s"] * 1e3 * b / last["batch"] for b in batches], "--", color="gray",
                     label="proportional to batch")
    ax_sample.plot(batches, [r["time_per_sample_s"] * 1e6 for r in rows], "o-")
    for ax, title, unit in ((ax_step, "time per step", "ms"), (ax_sample, "time per sample", "µs")):
        ax.set_title(title)
        if not rows:  # the first batch already failed: say so instead of drawing empty log axes
            ax.text(0.5, 0.5, f"no measurement: {result['stop_reason']}"[:80], ha="center", va="center",
                    transform=ax.transAxes, fontsize=8)
            continue
        if result["overhead_bound_batch"] is not None:
            ax.axvline(result["overhead_bound_batch"], color="tab:red", linestyle=":",
                       label=f"overhead-bound up to batch {result['overhead_bound_batch']}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"batch doubling: {result['model']} ({result['backend']}, {result['dtype']}), {result['device_name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
