"""What a recorded result file says about itself, in one line, for `results/INDEX.md` (see results_index.py).

Two kinds of line:
- `summary(path)`: a headline computed from a structured result: a zoo run's JSON (pass rate, brrr's
  geometric means, what was wrong or slower than eager), through the zoo's own `report.summary`, or a
  sweep's (the same, against Inductor's better mode too), through `sweep_report.summarize`;
- `first_line(path)`: what any file shows first: a Markdown file's first heading, a log's first line with words
  in it, a JSON's own `note`, or what an image, page or trace is.
Either is None where the file gives nothing.
"""

import functools
import importlib.util
import json
import re
from pathlib import Path

ZOO_REPORT = Path(__file__).resolve().parent / "zoo" / "report.py"
SWEEP_REPORT = Path(__file__).resolve().parent / "sweep" / "sweep_report.py"
LONGEST = 200             # characters of a line taken from a file
LISTED = 3                # names listed before a count stands for them
WHAT_THE_FILE_IS = {"png": "plot", "html": "HTML report", "trace.json": "Chrome/Perfetto trace"}


@functools.cache
def _script(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _zoo_report():
    return _script("zoo_report", ZOO_REPORT)


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def is_zoo_run(data):
    return isinstance(data, dict) and isinstance(data.get("configs"), dict) \
        and isinstance(data.get("environment"), dict) and "backends" in data["environment"] \
        and not is_sweep_run(data)


def is_sweep_run(data):
    """A sweep's entries hold their backends' rows by name (a zoo's hold a bench result)."""
    return isinstance(data, dict) and isinstance(data.get("configs"), dict) and \
        any(isinstance(e, dict) and isinstance(e.get("rows"), dict) for e in data["configs"].values())


def sweep_summary(data):
    """'ran 14/224, pass 14/14; brrr over eager 2.41x train, 3.14x inference; over Inductor's better mode
    1.02x train, 0.81x inference; 0 slower than eager; 9 behind Inductor's better mode'."""
    s = _script("sweep_report", SWEEP_REPORT).summarize(data)
    parts = [f"ran {s['ran']}/{s['configurations']}, pass {s['brrr_passed']}/{s['ran']}"]
    for base, label in (("eager", "eager"), ("best_inductor", "Inductor's better mode")):
        means = [f"{v:.2f}x {mode}" for mode, kind in (("train", "training"), ("inference", "inference"))
                 if (v := s[kind][f"brrr_over_{base}"])]
        if means:
            parts.append(f"brrr over {label} " + ", ".join(means))
    parts.append(f"{len(s['slower_than_eager'])} slower than eager; {len(s['behind_best_inductor'])} behind "
                 "Inductor's better mode")
    return "; ".join(parts)


def _listed(items, what):
    """'not ok: a, b' or, past LISTED names, '14 not ok'."""
    return f"{what}: " + ", ".join(items) if len(items) <= LISTED else f"{len(items)} {what}"


def zoo_summary(data):
    """'pass 83/84; brrr over eager 2.01x train, 2.33x inference; brrr over inductor 1.58x train, 1.63x inference;
    not ok: resnet50-infer/inductor'."""
    s = _zoo_report().summary(data)
    parts = [f"pass {s['passed']}/{s['checked']}"] if s["pass_rate"] is not None else []
    for base in ("eager", "inductor"):
        means = [f"{value:.2f}x {mode}" for mode in ("train", "inference")
                 if (value := s["geomean"].get(f"brrr over {base}, {mode}"))]
        if means:
            parts.append(f"brrr over {base} " + ", ".join(means))
    if s["not_ok"]:
        parts.append(_listed([entry.split(":")[0] for entry in s["not_ok"]], "not ok"))
    if s.get("slower_than_eager"):
        parts.append(_listed([entry.split(":")[0] for entry in s["slower_than_eager"]], "slower than eager"))
    return "; ".join(parts)


def summary(path):
    if not str(path).endswith(".json"):
        return None
    data = read_json(path)
    if is_sweep_run(data):
        return sweep_summary(data)
    return zoo_summary(data) if is_zoo_run(data) else None


def _clip(line):
    line = " ".join(line.split())
    return line if len(line) <= LONGEST else line[:LONGEST - 3] + "..."


def _first_heading(text):
    for line in text.splitlines():
        if line.startswith("#"):
            return _clip(line.lstrip("#"))
    return None


def _first_worded_line(text):
    for line in text.splitlines():
        if re.search(r"[A-Za-z]{2}", line):       # skips box-drawing rules and bare numbers
            return _clip(line.strip(" │┃|"))
    return None


def first_line(path):
    path = Path(path)
    ext = path.name.partition(".")[2]
    if ext in WHAT_THE_FILE_IS:
        return WHAT_THE_FILE_IS[ext]
    if ext == "json":
        data = read_json(path)
        note = (data.get("note") or data.get("summary")) if isinstance(data, dict) else None
        return _clip(note) if isinstance(note, str) else None
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    return _first_heading(text) if ext == "md" else _first_worded_line(text)
