"""Stage 3 of the analyzer (capture -> time -> regimes -> advise -> report): place ops on the roofline.

Every op gets a roofline floor, max(flops / peak, bytes / bandwidth), with the matmul peak of its dtype for
contractions and the plain fp32 rate for everything else (Ceilings.roofline_time), and a regime:
- "compute":   the FLOP roof is the higher of the two floors;
- "bandwidth": the bytes roof is;
- "overhead":  fixed cost dominates: no work at all, or a tiny op that finishes within a few launch
               latencies while its floor is well under its measured time.
Kernels launched by compiled code outside any ATen op are placed like ops when their compiler told their FLOPs
and bytes (brrr's kernels, analyze/kernels.py); the others are placed by duration alone (`compiled_kernel_regime`).
The run is split into seconds of each regime that add up to the wall time (see `run_split`), and ops are
grouped per module and per op class (the "% FLOPs vs % runtime" table of Data Movement Is All You Need).
"""

from brrr.cost.ops import OP_CLASSES

REGIMES = ("compute", "bandwidth", "overhead")

# An op is fixed-cost bound when it finishes within this many launch latencies (the measured launch latency
# is the host's cost per op, ~7 us on the H100 machine; 4x that called a 35 us, 32%-of-roof column sum
# "overhead" when it is a slow bandwidth kernel)...
OVERHEAD_LATENCIES = 2.0
# ...and its roofline floor is below this fraction of its measured time.
OVERHEAD_FLOOR_FRACTION = 0.5


def classify(flops, bytes, time_s, peak_flops, bandwidth, launch_latency):
    """The regime of one op from plain numbers (FLOPs, bytes moved, measured seconds, the device's roofs)."""
    compute_s = flops / peak_flops if peak_flops > 0 else 0.0
    memory_s = bytes / bandwidth if bandwidth > 0 else 0.0
    floor = max(compute_s, memory_s)
    if floor <= 0:
        return "overhead"  # no FLOPs, no bytes: views, metadata, empty tensors
    tiny = time_s <= OVERHEAD_LATENCIES * launch_latency
    if time_s > 0 and tiny and floor < OVERHEAD_FLOOR_FRACTION * time_s:
        return "overhead"
    return "compute" if compute_s >= memory_s else "bandwidth"


def achieved_fraction(roofline_time_s, time_s):
    """How close an op came to its roofline floor (1.0 = on the roof); None without a measured time."""
    return roofline_time_s / time_s if time_s > 0 else None


def compiled_kernel_regime(time_s, launch_latency):
    """The regime of a kernel compiled code launched (FLOPs and bytes unknown): overhead when it is as short
    as a fixed cost, else bandwidth. An assumption, not a measurement: the kernels compilers generate outside
    ATen are fused pointwise and reduction kernels, memory-bound but for matmul templates."""
    return "overhead" if time_s <= OVERHEAD_LATENCIES * launch_latency else "bandwidth"


def place_ops(records, ceilings):
    """Fill `roofline_time_s` and `regime` of every OpRecord from its FLOPs, bytes and measured time."""
    floors = {}  # (flops, bytes, dtype, contraction) -> (peak, floor): a model's layers repeat the same ops
    for r in records:
        if r.unpriced:
            r.roofline_time_s, r.regime = 0.0, compiled_kernel_regime(r.time_s, ceilings.launch_latency)
            continue
        if not (r.flops or r.bytes_read or r.bytes_written):  # views, metadata, empty tensors: no roof at all
            r.roofline_time_s, r.regime = 0.0, "overhead"
            continue
        work = (r.flops, r.bytes, r.dtype, r.contraction)
        roofs = floors.get(work)
        if roofs is None:
            roofs = floors[work] = (ceilings.peak_flops(r.dtype, contraction=work[3]),
                                    ceilings.roofline_time(work[0], work[1], r.dtype, contraction=work[3]))
        peak, r.roofline_time_s = roofs
        r.regime = classify(work[0], work[1], r.time_s, peak, ceilings.bandwidth, ceilings.launch_latency)
    return records


def dominant_regime(seconds_by_regime):
    """The regime holding the most time; "overhead" when nothing took any time."""
    best = max(REGIMES, key=lambda k: seconds_by_regime.get(k, 0.0))
    return best if seconds_by_regime.get(best, 0.0) > 0 else "overhead"


def time_scale(records, wall_time_s, busy_time_s=None):
    """The factor from traced op times to the plain step's busy time (all op time when None), capped at the wall
    time."""
    op_total = sum(r.time_s for r in records)
    busy = op_total if busy_time_s is None else busy_time_s
    busy = min(max(busy, 0.0), max(wall_time_s, 0.0))
    return busy / op_total if op_total > 0 else 0.0


def run_split(records, wall_time_s, busy_time_s=None):
    """Seconds of compute, bandwidth and overhead in the step; they add up to `wall_time_s`.

    Op times come from the traced run, busy time from a plain one, so op times are first scaled to the busy
    time (capped at the wall time). Compute and bandwidth are then the scaled time of ops in those regimes;
    overhead is the rest: the device idling on the host (wall - busy) plus overhead-regime ops.
    """
    wall = max(wall_time_s, 0.0)
    scale = time_scale(records, wall, busy_time_s)
    split = {k: scale * sum(r.time_s for r in records if r.regime == k) for k in ("compute", "bandwidth")}
    split["overhead"] = max(wall - split["compute"] - split["bandwidth"], 0.0)
    return split


def module_regimes(records):
    """Per module path: op count, FLOPs, bytes, seconds, seconds per regime and the dominant regime."""
    modules = {}
    for r in records:
        m = modules.get(r.module)
        if m is None:
            m = modules[r.module] = {"ops": 0, "flops": 0, "bytes": 0, "time_s": 0.0,
                                     "seconds": dict.fromkeys(REGIMES, 0.0)}
        m["ops"] += 1
        m["flops"] += r.flops
        m["bytes"] += r.bytes
        m["time_s"] += r.time_s
        m["seconds"][r.regime] += r.time_s
    for m in modules.values():
        m["regime"] = dominant_regime(m["seconds"])
    return modules


def op_class_table(records):
    """Per op class: FLOPs, seconds, and their percentages of the step's totals (each column sums to 100)."""
    total_flops = sum(r.flops for r in records)
    total_time = sum(r.time_s for r in records)
    table = {}
    for cls in OP_CLASSES:
        ops = [r for r in records if r.op_class == cls]
        flops, seconds = sum(r.flops for r in ops), sum(r.time_s for r in ops)
        table[cls] = {
            "ops": len(ops), "flops": flops, "time_s": seconds,
            "flops_pct": 100.0 * flops / total_flops if total_flops else 0.0,
            "time_pct": 100.0 * seconds / total_time if total_time else 0.0,
        }
    return table
