"""A Chrome/Perfetto trace of the analyzed step (report's sibling: analysis -> **trace**).

    analysis.save_trace("step.json")       # brrr analyze ... --trace step.json; open in ui.perfetto.dev

Chrome's trace event format, JSON object form: `{"traceEvents": [...], "displayTimeUnit": "ms"}` with "X"
(complete) events, `ts` and `dur` in microseconds from the start of the traced step, and "M" (metadata) events
naming the tracks. Tracks:
- pid 1 "host", tid 1 "ops": each op's profiler range (`brrr#<i>`, the tracer's); on CPU also tid 2 "compiled
  kernels": each interpreted brrr kernel's launch range;
- pid 2 "device", tid 1 "kernels" (CUDA): each device kernel, named as the profiler saw it, the kernels of an ATen
  op carrying that op's numbers.
Slices of one track that overlap without nesting (kernels on two streams) go to extra lanes, tid + 100k.
Each slice's args: `op` (the ATen op; a compiled kernel's ATen ops, joined), `module`, `phase`, `flops`,
`bytes`, `roofline_fraction` (the op's roofline floor / its measured time; null where unknown), `regime`, and
for a compiled kernel `kernel` (its name) and `modules`.

The times are the traced run's (Analysis.timeline, kept from the profiler session). An Analysis built without one
(`from_measurements` on synthetic records) is laid out op after op by measured time on one track.
"""

import json

from brrr.analyze.regimes import achieved_fraction
from brrr.analyze.report import json_safe

HOST_PID, DEVICE_PID = 1, 2
OPS_TID, KERNELS_TID = 1, 2
LANE_TIDS = 100   # overlapping slices of one track go to tids tid + 100, tid + 200, ...
TRACKS = {"host": (HOST_PID, OPS_TID), "device": (DEVICE_PID, OPS_TID)}


def slice_args(op):
    """The args of every slice of one OpRecord."""
    return {
        "op": ", ".join(op.fused_ops) if op.kernel and op.fused_ops else op.name,
        "module": op.module, "phase": op.phase, "flops": int(op.flops), "bytes": int(op.bytes),
        "roofline_fraction": None if op.unpriced else achieved_fraction(op.roofline_time_s, op.time_s),
        "regime": op.regime,
        **({"kernel": op.name, "modules": list(op.modules)} if op.kernel else {}),
    }


def _metadata(pid, tid, process, thread):
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": tid, "args": {"name": process}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}}]


def _complete(name, pid, tid, ts_us, dur_us, args, category):
    return {"ph": "X", "name": name, "cat": category, "pid": pid, "tid": tid, "ts": round(ts_us, 3),
            "dur": round(max(dur_us, 0.0), 3), "args": args}


def chrome_trace(analysis):
    """The trace as a dict (json.dumps-able)."""
    ops = analysis.ops
    events = _metadata(HOST_PID, OPS_TID, "host", "ops")
    args = [slice_args(op) for op in ops]
    timeline = analysis.timeline
    if timeline:
        t0 = min(start for _, start, _, _, _ in timeline)
        lanes = {}   # (pid, tid) -> end of the last slice in each of its lanes
        names = {(HOST_PID, OPS_TID): "ops", (HOST_PID, KERNELS_TID): "compiled kernels",
                 (DEVICE_PID, OPS_TID): "kernels"}
        for track, start, end, index, name in sorted(timeline, key=lambda s: (s[1], -s[2])):
            op = ops[index] if 0 <= index < len(ops) else None
            if op is None:
                continue
            if track == "device":
                pid, tid, category, label = DEVICE_PID, OPS_TID, "kernel", name or op.name
            elif op.kernel:
                pid, tid, category, label = HOST_PID, KERNELS_TID, "kernel", op.name
            else:
                pid, tid, category, label = HOST_PID, OPS_TID, "op", op.name
            ends = lanes.setdefault((pid, tid), [])
            # a slice must nest in or follow the slices of its thread (Perfetto's JSON import): one that overlaps
            # (kernels of two streams) goes to a lane of its own
            lane = next((i for i, last in enumerate(ends) if last <= start), len(ends))
            ends[lane:lane + 1] = [end]
            events.append(_complete(label, pid, tid + LANE_TIDS * lane, (start - t0) / 1e3, (end - start) / 1e3,
                                    args[index], category))
        for (pid, tid), ends in lanes.items():
            process = "host" if pid == HOST_PID else f"device ({analysis.device})"
            for lane in range(len(ends)):
                if (pid, tid, lane) != (HOST_PID, OPS_TID, 0):
                    events += _metadata(pid, tid + LANE_TIDS * lane, process,
                                        names[pid, tid] + (f" ({lane + 1})" if lane else ""))
    else:   # no profiler timeline: the ops one after another, each as long as measured
        ts = 0.0
        for op, op_args in zip(ops, args):
            events.append(_complete(op.name, HOST_PID, OPS_TID, ts, op.time_s * 1e6, op_args,
                                    "kernel" if op.kernel else "op"))
            ts += op.time_s * 1e6
    return {"traceEvents": json_safe(events), "displayTimeUnit": "ms",
            "otherData": json_safe({"device": analysis.device, "train": analysis.train,
                                    "wall_time_s": analysis.wall_time_s, "busy_time_s": analysis.busy_time_s,
                                    "regime": analysis.regime})}


SLICE_ARGS = ("op", "module", "phase", "flops", "bytes", "roofline_fraction", "regime")


def validate(data):
    """The "X" slices of a trace in Chrome's JSON object format, checked strictly (what Perfetto's JSON importer
    reads of each event, and the args every brrr slice carries); ValueError on the first thing wrong."""
    def check(ok, what):
        if not ok:
            raise ValueError(f"not a brrr Chrome trace: {what}")

    check(isinstance(data, dict) and isinstance(data.get("traceEvents"), list), "no traceEvents list")
    slices = []
    for i, event in enumerate(data["traceEvents"]):
        check(isinstance(event, dict) and event.get("ph") in ("X", "M"), f"event {i} is not an X or M event")
        check(isinstance(event.get("name"), str) and event["name"], f"event {i} has no name")
        check(type(event.get("pid")) is int and type(event.get("tid")) is int, f"event {i} has no int pid/tid")
        if event["ph"] == "M":
            check(event["name"] in ("process_name", "thread_name") and isinstance(event.get("args", {}).get("name"),
                                                                                   str), f"metadata event {i}")
            continue
        for key in ("ts", "dur"):
            check(type(event.get(key)) in (int, float) and event[key] >= 0, f"event {i} has no {key} >= 0")
        args = event.get("args")
        check(isinstance(args, dict) and all(k in args for k in SLICE_ARGS), f"event {i} lacks args {SLICE_ARGS}")
        slices.append(event)
    return slices


def save_trace(analysis, path):
    with open(path, "w") as f:
        json.dump(chrome_trace(analysis), f, allow_nan=False)
