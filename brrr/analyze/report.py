"""Stage 5 of the analyzer (capture -> time -> regimes -> advise -> report): show an Analysis.

Four renderings of the same numbers: a rich terminal report, a JSON-safe dict (NaN/inf become null), a
log-log roofline PNG (ops as points on the machine's measured roofs) and a self-contained HTML page that
embeds the PNG as base64 next to the tables.
"""

import base64
import dataclasses
import html
import io
import math

import torch

from brrr.analyze.advise import short_name
from brrr.analyze.regimes import REGIMES, achieved_fraction
from brrr.cost.ops import OP_CLASSES

CLASS_COLORS = {"contraction": "tab:blue", "normalization": "tab:orange", "elementwise": "tab:green",
                "view": "tab:gray", "other": "tab:purple"}
REGIME_STYLES = {"compute": "green", "bandwidth": "yellow", "overhead": "red"}


# --- numbers -----------------------------------------------------------------------------------------------------

def json_safe(value):
    """The value with non-finite floats as None, dtypes as strings and tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def fmt_seconds(s):
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def fmt_rate(value, unit):
    if value is None or value <= 0:
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def fmt_pct(value):
    return "-" if value is None else f"{100 * value:.1f}%"


def op_row(op, total_time, short=False):
    """The display fields of one op: shared by the terminal table and the HTML table."""
    known = op.time_s and not op.unpriced  # a kernel whose FLOPs and bytes nobody told: no rates
    return {
        "#": str(op.index), "op": short_name(op.name) if short else op.name, "module": op.module + (" (bw)" if op.phase == "backward" else ""),
        "class": "kernel" if op.unpriced else op.op_class, "time": fmt_seconds(op.time_s),
        "% time": fmt_pct(op.time_s / total_time if total_time else None),
        "FLOP/s": fmt_rate(op.flops / op.time_s if known else None, "" if short else "FLOP/s"),
        "bytes/s": fmt_rate(op.bytes / op.time_s if known else None, "" if short else "B/s"),
        "% of roof": fmt_pct(_achieved(op)), "regime": op.regime,
    }


def _achieved(op):
    return None if op.unpriced else achieved_fraction(op.roofline_time_s, op.time_s)


def top_ops(analysis, top):
    return sorted(analysis.ops, key=lambda r: -r.time_s)[:top]


def module_rows(analysis, top):
    """[module, ops, time, % time, regime] for the modules that took the most time."""
    total = sum(m["time_s"] for m in analysis.modules.values()) or 1.0
    ranked = sorted(analysis.modules.items(), key=lambda kv: -kv[1]["time_s"])[:top]
    return [[name, str(m["ops"]), fmt_seconds(m["time_s"]), fmt_pct(m["time_s"] / total), m["regime"]]
            for name, m in ranked]


MODULE_COLUMNS = ["module", "ops", "time", "% time", "regime"]


def op_dict(op):
    return {
        "index": op.index, "name": op.name, "module": op.module, "phase": op.phase, "op_class": op.op_class,
        "flops": int(op.flops), "bytes_read": int(op.bytes_read), "bytes_written": int(op.bytes_written),
        "time_s": float(op.time_s), "regime": op.regime, "intensity": op.intensity,
        "roofline_time_s": float(op.roofline_time_s), "achieved_fraction": _achieved(op), "kernel": op.kernel,
        "dtype": op.dtype, "input_shapes": op.input_shapes, "inputs_from": [p for p, _ in op.inputs_from],
        **({"fused_ops": list(op.fused_ops), "modules": list(op.modules)} if op.kernel else {}),
    }


def analysis_dict(analysis):
    return json_safe({
        "device": analysis.device, "kind": analysis.kind, "train": analysis.train,
        "ceilings": analysis.ceilings.to_dict(),
        "wall_time_s": analysis.wall_time_s, "busy_time_s": analysis.busy_time_s,
        "ops": [op_dict(op) for op in analysis.ops],
        "regimes": {k: float(analysis.regimes[k]) for k in REGIMES}, "regime": analysis.regime,
        "op_classes": analysis.op_classes, "modules": analysis.modules, "advice": analysis.advice,
        "predictions": {k: p.to_dict() for k, p in analysis.predictions.items()}, "verify": analysis.verify,
        "graph_structure": None if analysis.structure is None else dataclasses.asdict(analysis.structure),
    })


# --- verification (verify.py) -------------------------------------------------------------------------------

VERIFY_COLUMNS = ["remedy", "predicted", "measured", "saving", "error", "compile", "verdict"]
DRIFT_NOTE = 0.25   # a re-timed baseline this far from the analyzed wall time gets a note
VERDICTS = {"gain": "gain", "loss": "LOSS", "failed": "failed", "not applicable": "n/a"}


def fmt_signed_seconds(s):
    return "-" if s is None else ("-" if s < 0 else "") + fmt_seconds(abs(s))


ADVICE_COLUMNS = ["kind", "saves", "known by", "what"]


def advice_rows(analysis):
    """[kind, saving, how the saving is known, what] per piece of advice: a measured saving with its prediction
    beside it, or a prediction."""
    rows = []
    for a in analysis.advice:
        if a.get("basis") == "measured":
            saves = fmt_seconds(a["measured_saving_s"])
            predicted = a["predicted_saving_s"]
            known = "measured" + (" (no prediction)" if a.get("unpredicted") else
                                  f" (predicted a loss of {fmt_seconds(-predicted)})" if predicted < 0 else
                                  f" (predicted {fmt_seconds(predicted)})")
        else:
            saves, known = fmt_seconds(a["predicted_saving_s"]), "predicted"
        rows.append([a["kind"], saves, known, a["message"]])
    return rows


def verify_rows(analysis):
    """[remedy kind, predicted (* = calibrated), measured, saving, error, compile, verdict] per remedy."""
    rows = []
    for row in analysis.verify["remedies"]:
        error = row["prediction_error"]
        rows.append([row["kind"], fmt_seconds(row["predicted_s"]) + ("*" if row["calibrated_from"] else ""),
                     fmt_seconds(row["measured_s"]), fmt_signed_seconds(row["saving_s"]),
                     "-" if error is None else f"{100 * error:+.0f}%", fmt_seconds(row["compile_s"]),
                     VERDICTS.get(row["status"], row["status"])])
    return rows


def verify_notes(analysis):
    """One line per remedy that was not measured (why), then what the columns mean."""
    verify = analysis.verify
    notes = [f"{row['kind']}: {row['status']}: {row['reason']}" for row in verify["remedies"]
             if row["status"] in ("failed", "not applicable")]
    notes.append(f"Each remedy ran on a copy of the model; baseline {fmt_seconds(verify['baseline_s'])} re-timed "
                 f"(analyzed {fmt_seconds(verify['analyzed_wall_s'])}). Error: (predicted - measured) / measured. "
                 "Compile time is the warm-up's extra time, not in the step. A LOSS is not advised.")
    baseline, analyzed = verify["baseline_s"], verify["analyzed_wall_s"]
    if analyzed > 0 and abs(baseline - analyzed) > DRIFT_NOTE * analyzed:
        notes.append(f"The step re-timed at {fmt_seconds(baseline)} is not the {fmt_seconds(analyzed)} analyzed (a "
                     "cold or busy host): the analysis' split and predictions are less sure.")
    if any(row["calibrated_from"] for row in verify["remedies"]):
        notes.append("* calibrated by earlier measurements on this device")
    return notes


# --- terminal ---------------------------------------------------------------------------------------------------

def _table(title, columns, rows, right=(), wrap=(), cap=28):
    """A rich table; columns in `right` are right-aligned numbers, only columns in `wrap` may wrap.

    Columns that don't wrap keep their full width, so a narrow terminal squeezes only the wrapping ones."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, column in enumerate(columns):
        if column in wrap:
            table.add_column(column, overflow="fold", min_width=14, ratio=1)
        else:
            width = max([len(column)] + [Text.from_markup(row[i]).cell_len for row in rows])
            table.add_column(column, justify="right" if column in right else "left", no_wrap=True,
                             min_width=min(width, cap), max_width=cap, overflow="ellipsis")
    for row in rows:
        table.add_row(*row)
    return table


def print_report(analysis, console, top=15):
    from rich.markup import escape  # names and messages are text, not rich markup

    mode = "train step (forward+backward)" if analysis.train else "inference step"
    console.print(f"[bold]brrr analyze[/bold]: {mode} on {analysis.device}, {len(analysis.ops)} ops, "
                  f"wall time {fmt_seconds(analysis.wall_time_s)}, "
                  f"[bold]{analysis.regime}-bound[/bold]")
    total = sum(op.time_s for op in analysis.ops)
    columns = ["#", "op", "module", "class", "time", "% time", "FLOP/s", "bytes/s", "% of roof", "regime"]
    narrow = console.width < 120
    if narrow:
        columns = ["op", "module", "time", "FLOP/s", "% of roof", "regime"]
    rows = []
    for op in top_ops(analysis, top):
        row = op_row(op, total, short=True)
        row["op"], row["module"] = escape(row["op"]), escape(row["module"])
        row["regime"] = f"[{REGIME_STYLES[op.regime]}]{op.regime}[/]"
        rows.append([row[c] for c in columns])
    console.print(_table(f"Top {len(rows)} ops by time", columns, rows,
                         right={"#", "time", "% time", "FLOP/s", "bytes/s", "% of roof"}, wrap={"module"},
                         cap=18 if narrow else 28))
    kernels = [op for op in analysis.ops if op.kernel]
    unpriced = [op for op in kernels if op.unpriced]
    if kernels:
        console.print(f"{len(kernels)} kernels were launched by compiled code, outside any ATen op "
                      f"({fmt_seconds(sum(op.time_s for op in kernels))}); {len(kernels) - len(unpriced)} carry "
                      "FLOPs and bytes from their compiler's plan.")
    if unpriced:
        console.print(f"{len(unpriced)} of them ({fmt_seconds(sum(op.time_s for op in unpriced))}) have FLOPs "
                      "and bytes nobody told: their time is measured and their regime assumed from their length.")
    rows = module_rows(analysis, top=8)
    for row in rows:
        row[0], row[-1] = escape(row[0]), f"[{REGIME_STYLES[row[-1]]}]{row[-1]}[/]"
    console.print(_table("Top modules by time (forward and backward)", MODULE_COLUMNS, rows,
                         right={"ops", "time", "% time"}, wrap={"module"}))
    wall = analysis.wall_time_s or 1.0
    rows = [[f"[{REGIME_STYLES[k]}]{k}[/]", fmt_seconds(analysis.regimes[k]), fmt_pct(analysis.regimes[k] / wall)]
            for k in REGIMES]
    console.print(_table("Where the time goes", ["regime", "seconds", "% of wall"], rows, right={"seconds", "% of wall"}))
    rows = [[cls, str(c["ops"]), f"{c['flops_pct']:.2f}%", f"{c['time_pct']:.1f}%"]
            for cls, c in analysis.op_classes.items() if c["ops"]]
    console.print(_table("Operator classes (cf. BERT on A100: contraction 99.8% FLOPs / 61% runtime)",
                         ["class", "ops", "% FLOPs", "% runtime"], rows, right={"ops", "% FLOPs", "% runtime"}))
    if analysis.verify:
        rows = [[escape(c) for c in row] for row in verify_rows(analysis)]
        for row in rows:
            row[-1] = {"gain": "[green]gain[/]", "LOSS": "[red]LOSS[/]"}.get(row[-1], row[-1])
        console.print(_table("Remedies applied and measured", VERIFY_COLUMNS, rows,
                             right=set(VERIFY_COLUMNS[1:6])))
        for note in verify_notes(analysis):
            console.print(escape(note))
    if analysis.advice:
        rows = [[escape(c) for c in row] for row in advice_rows(analysis)]
        console.print(_table("Advice", ADVICE_COLUMNS, rows, right={"saves"}, wrap={"what", "known by"}))
    else:
        lost = analysis.verify and any(row["status"] == "loss" for row in analysis.verify["remedies"])
        console.print("No advice: no remedy measured faster (see above), and nothing else is predicted to be."
                      if lost else "No advice: nothing fusible, no fp32 matmuls to speed up, overhead is small.")


# --- roofline plot ------------------------------------------------------------------------------------------------

def roofline_figure(analysis):
    from matplotlib.figure import Figure  # no pyplot: no global backend state, renders with Agg

    ceilings = analysis.ceilings
    placed = [op for op in analysis.ops if op.flops > 0 and op.bytes > 0 and op.time_s > 0]
    fig = Figure(figsize=(9, 6), dpi=110)
    ax = fig.subplots()
    total = sum(op.time_s for op in placed) or 1.0
    for cls in OP_CLASSES:
        ops = [op for op in placed if op.op_class == cls]
        if ops:
            ax.scatter([op.intensity for op in ops], [op.flops / op.time_s for op in ops],
                       s=[20 + 800 * op.time_s / total for op in ops], c=CLASS_COLORS[cls], alpha=0.6,
                       edgecolors="black", linewidths=0.4, label=f"{cls} ({len(ops)})")
    intensities = [op.intensity for op in placed]
    peaks = {"fp32 FMA": ceilings.vector_fp32, **{f"{k} matmul": v for k, v in ceilings.matmul.items() if v}}
    ridges = [p / ceilings.bandwidth for p in peaks.values() if ceilings.bandwidth > 0]
    lo = min(intensities + ridges + [1.0]) / 4
    hi = max(intensities + ridges + [1.0]) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [ceilings.bandwidth * x for x in xs], color="black", linestyle="--", linewidth=1,
            label=f"bandwidth {fmt_rate(ceilings.bandwidth, 'B/s')}")
    for name, peak in sorted(peaks.items(), key=lambda kv: kv[1]):
        ax.plot(xs, [min(peak, ceilings.bandwidth * x) for x in xs], linewidth=1.2,
                label=f"{name} {fmt_rate(peak, 'FLOP/s')}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOPs / byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"Roofline: {len(placed)} ops on {analysis.device} (size ~ time)")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def roofline_png_bytes(analysis):
    buffer = io.BytesIO()
    roofline_figure(analysis).savefig(buffer, format="png")
    return buffer.getvalue()


def save_roofline_png(analysis, path):
    with open(path, "wb") as f:
        f.write(roofline_png_bytes(analysis))


# --- HTML ---------------------------------------------------------------------------------------------------------

def _html_table(title, columns, rows):
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<h2>{html.escape(title)}</h2>\n<table><tr>{head}</tr>{body}</table>\n"


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin-bottom:1.5em;font-size:0.9em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#eee}
img{max-width:100%}"""


def html_report(analysis, top=25):
    png = base64.b64encode(roofline_png_bytes(analysis)).decode("ascii")
    mode = "train step (forward+backward)" if analysis.train else "inference step"
    total = sum(op.time_s for op in analysis.ops)
    columns = ["#", "op", "module", "class", "time", "% time", "FLOP/s", "bytes/s", "% of roof", "regime"]
    op_rows = [[op_row(op, total)[c] for c in columns] for op in top_ops(analysis, top)]
    wall = analysis.wall_time_s or 1.0
    regime_rows = [[k, fmt_seconds(analysis.regimes[k]), fmt_pct(analysis.regimes[k] / wall)] for k in REGIMES]
    class_rows = [[cls, c["ops"], f"{c['flops_pct']:.2f}%", f"{c['time_pct']:.1f}%"]
                  for cls, c in analysis.op_classes.items()]
    parts = [
        f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>brrr analyze</title>"
        f"<style>{STYLE}</style></head><body>\n",
        f"<h1>brrr analyze: {html.escape(mode)} on {html.escape(analysis.device)}</h1>\n",
        f"<p>{len(analysis.ops)} ops, wall time {fmt_seconds(analysis.wall_time_s)}, "
        f"<b>{html.escape(analysis.regime)}-bound</b></p>\n",
        f"<img alt=\"roofline\" src=\"data:image/png;base64,{png}\">\n",
        _html_table("Where the time goes", ["regime", "seconds", "% of wall"], regime_rows),
        _html_table(f"Top {len(op_rows)} ops by time", columns, op_rows),
        _html_table("Top modules by time", MODULE_COLUMNS, module_rows(analysis, top=15)),
        _html_table("Operator classes", ["class", "ops", "% FLOPs", "% runtime"], class_rows),
        _html_table("Advice", ADVICE_COLUMNS, advice_rows(analysis)),
    ]
    if analysis.verify:
        parts.append(_html_table("Remedies applied and measured", VERIFY_COLUMNS, verify_rows(analysis)))
        parts.append("".join(f"<p>{html.escape(note)}</p>\n" for note in verify_notes(analysis)))
    parts.append("</body></html>\n")
    return "".join(parts)
