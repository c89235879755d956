"""After advise (capture -> time -> regimes -> predict -> advise -> report): how far off each kind of
prediction has been on this device, and the correction that follows.

`--verify` (verify.py) measures each remedy it applies and records measured / predicted step time (the
uncalibrated prediction) in a table per device and remedy kind, kept in the ceilings' cache directory
(`~/.cache/brrr`, `$BRRR_CACHE_DIR`) as `calibration-<device>.json`, the latest MAX_SAMPLES ratios per kind.
A later prediction of that kind is multiplied by the median ratio, and its advice message says so; the
uncalibrated figures stay in the item (`predicted_step_uncalibrated_s`, `predicted_saving_uncalibrated_s`).
For a kind this machine has not measured, the ratios that analyze --verify measured over the sweep on the same
GPU model are used (`calibration_prior.json`, written by benchmarks/sweep/analyze_sweep.py --prior); they are
never copied into the machine's own table.
"""

import json
import os
import re
import statistics
from pathlib import Path

from brrr.cost.device import cache_dir

MAX_SAMPLES = 20   # ratios kept per kind: the latest, so a changed brrr or driver is forgotten soon enough
# measured / predicted per device and kind, from analyze --verify over the sweep (benchmarks/sweep/analyze_sweep.py
# --prior): what a first analysis on a known GPU is corrected by
PRIOR = Path(__file__).with_name("calibration_prior.json")


def device_slug(device):
    """'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()


def calibration_path(device):
    """The table's file for a device name (Ceilings.device)."""
    return cache_dir() / f"calibration-{device_slug(device)}.json"


def _ratios(table):
    return {kind: [float(r) for r in ratios if isinstance(r, (int, float)) and r > 0]
            for kind, ratios in table.items() if isinstance(ratios, list)}


def prior_table(device):
    """{kind: [measured / predicted, ...]} the sweep measured on this device (PRIOR), or empty."""
    try:
        table = json.loads(PRIOR.read_text()).get(device_slug(device), {})
    except (OSError, ValueError, AttributeError):
        return {}
    return _ratios(table) if isinstance(table, dict) else {}


def own_table(device):
    """{kind: [measured / predicted, ...]} this machine measured on `device`; empty when there is none or it is
    unreadable."""
    try:
        own = json.loads(calibration_path(device).read_text())
    except (OSError, ValueError):
        return {}
    return _ratios(own["ratios"]) if isinstance(own, dict) and isinstance(own.get("ratios"), dict) else {}


def load_table(device):
    """{kind: [measured / predicted, ...]} for `device`: this machine's own measurements, and for a kind it has
    not measured, the sweep's (PRIOR); empty when there are neither."""
    table = prior_table(device)
    table.update({kind: ratios for kind, ratios in own_table(device).items() if ratios})
    return table


def record_ratios(device, ratios):
    """Append {kind: measured / predicted} to the device's table (the latest MAX_SAMPLES kept), written
    atomically (another process may be reading it)."""
    if not ratios:
        return
    table = own_table(device)   # the sweep's prior is read beside it, never copied into it
    for kind, ratio in ratios.items():
        if ratio > 0:
            table[kind] = (table.get(kind, []) + [float(ratio)])[-MAX_SAMPLES:]
    path = calibration_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"device": device, "ratios": table}, indent=2))
    os.replace(tmp, path)


def correction(table, kind):
    """(median measured / predicted, measurements) of `kind`, or None when nothing was measured."""
    ratios = table.get(kind)
    if not ratios:
        return None
    return statistics.median(ratios), len(ratios)


def calibrated_step(table, kind, predicted_s):
    """(the step time corrected by `kind`'s median ratio, measurements behind it; 0 and the figure as given
    when there are none)."""
    found = correction(table, kind)
    if found is None:
        return predicted_s, 0
    ratio, count = found
    return predicted_s * ratio, count


def calibrate_advice(advice, table, wall_time_s):
    """Correct, in place, each advice item that predicts a step time (`predicted_step_s`) of a kind the table
    has measured: the step and the saving become the calibrated figures, the message says from how many
    measurements, and the uncalibrated figures are kept beside them. Re-sorted by saving."""
    for item in advice:
        if "predicted_step_s" not in item or "predicted_step_uncalibrated_s" in item:
            continue
        step, count = calibrated_step(table, item["kind"], item["predicted_step_s"])
        if not count:
            continue
        item["predicted_step_uncalibrated_s"] = item["predicted_step_s"]
        item["predicted_saving_uncalibrated_s"] = item["predicted_saving_s"]
        item["predicted_step_s"] = step
        item["predicted_saving_s"] = max(wall_time_s - step, 0.0)
        item["calibrated_from"] = count
        item["message"] += (f"; calibrated from {count} measurement{'s' if count > 1 else ''}: predicted step "
                            f"{step * 1e3:.3g} ms (uncalibrated {item['predicted_step_uncalibrated_s'] * 1e3:.3g})")
    advice.sort(key=lambda a: -a["predicted_saving_s"])
    return advice
