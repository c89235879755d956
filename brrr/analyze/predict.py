"""Between regimes and advise (capture -> time -> regimes -> predict -> advise -> report): one predicted step
time per remedy brrr can apply, from the measured ops, the regime split and the machine's ceilings.

`brrr analyze --verify` (verify.py) applies each remedy to a copy of the model and measures it against these
figures; advise.py quotes the same figures, so advice and its verification agree. How each is built:

- "compile" (`brrr.compile(model)`) and "inductor" (`torch.compile(model)`): a fusing compiler keeps every
  matmul, convolution and other ATen call at its measured time, and runs the memory-bound ops
  (elementwise, normalization) as fused kernels. Ops join a kernel along producer -> consumer edges of one
  phase when every reader of the producer in that phase is memory-bound too (`compiler_groups`); a kernel
  moves its ops' bytes less the intermediates it keeps in registers (advise.fusion_bytes_saved) at
  FUSED_BANDWIDTH_FRACTION of the copy bandwidth, and takes no less than the step's shortest kernel and no
  more than its ops did. That is the device time; op times are scaled to the plain step's busy time first (as
  regimes.run_split does). The host launches each kernel at the measured launch latency, views cost nothing,
  an ATen call of no class the compiler knows costs what its profiler range took beyond the step's median call
  (`kept_host_seconds`: a cuDNN RNN planning on every call),
  and each compiled graph call pays COMPILED_CALL_S (AOTAutograd's wrapper) and GUARD_S per guard it checks,
  for every graph Dynamo cuts the step into (graphs.py counts them; where it could not, one), forward and
  backward in training; the step takes the longer of the two. `brrr.compile`'s default replays a graph where
  that is faster, so its prediction is the lesser of the launched and the replayed one (on CUDA). Inductor's
  default mode launches from its generated Python wrapper: on a GPU each of its kernels costs the host
  INDUCTOR_KERNEL_S instead of the bare launch latency (fitted on the sweep).
- "cuda-graphs" (`brrr.compile(model, cuda_graphs=True)`): the compiled device time plus one replay launch and
  the call's cost per graph call: no launch gaps. A graph holding an op no CUDA graph captures (`.item()`,
  nonzero, ctc_loss, attention with dropout on its host RNG state: runtime/host_copies.py, read from each traced
  call), one per such op traced, launches its share of the kernels.
- "tf32", "bf16" (`torch.autocast`): the ops the mode runs (for bf16 with autocast's casts), their contractions
  timed in the mode, the host paying a launch per op autocast adds (precision.py). Where the mode could not be
  measured: the fp32 matmul-family ops that are not launch-bound (for TF32 only the cuBLAS matmuls) scaled by
  the ratio of their roofline floors at the measured rates (advise.precision_seconds); the rest unchanged.
- "channels-last": each convolution at most its roofline floor over the best fraction of roof any
  contraction of the step reached (NCHW convolutions pay layout transposes inside cuDNN); the rest unchanged.
- "batch" (the batch doubled): overhead is per step, not per sample, so twice the batch costs one more busy
  time: (wall + compute + bandwidth) / 2 per current batch.

Every figure is a step time in seconds for the current batch. Calibration (calibration.py) corrects them per
kind from earlier measurements; the figures here are the uncalibrated ones.
"""

from dataclasses import dataclass

from brrr.analyze.advise import FUSIBLE_CLASSES, fusion_bytes_saved, linked_groups, precision_seconds
from brrr.analyze.capture import launches_kernel
from brrr.analyze.precision import mode_step_seconds
from brrr.analyze.regimes import time_scale
from brrr.compile.runtime import host_copies

REMEDY_KINDS = ("compile", "cuda-graphs", "inductor", "bf16", "tf32", "channels-last", "batch")

# brrr's fused softmax and layer norm kernels reached 86-91% of copy bandwidth on the H100 (README)
FUSED_BANDWIDTH_FRACTION = 0.85
# host cost of one call of a compiled graph beyond its launches: Dynamo's guards and AOTAutograd's runtime
# wrapper. An assumption (tens of microseconds on the H100 hosts), corrected by calibration where it matters
COMPILED_CALL_S = 30e-6
# host cost of one guard a compiled graph's call checks (Dynamo's C++ guards: tens of nanoseconds); an assumption
GUARD_S = 50e-9
# host cost of one kernel that Inductor's default mode launches from its generated Python wrapper, on a GPU: fitted
# on analyze --verify over 29 sweep configurations (H200 hosts, torch 2.11): 25-40 us gave the lowest errors, and
# host-bound steps such as BERT training (581 kernels, 18.9 ms) and densenet121 inference (246, 7.0 ms) take
# about this per kernel; the bare launch latency the ceilings measure (~10 us there) left Inductor's figure 38% off
INDUCTOR_KERNEL_S = 30e-6


@dataclass(frozen=True)
class Prediction:
    kind: str
    step_s: float     # predicted step time, seconds, for the current batch
    how: str          # what the figure is built from, in one line
    wall_share: float = 0.0   # d(step_s) / d(wall time): 1 for "the step as analyzed, less a saving", 0 for a
                              # figure built from device time and launches alone
    parts: tuple = ()         # (name, number) pairs the figure is built from: what the sweep fits constants on

    def at_wall(self, analyzed_wall_s, wall_s):
        """The prediction had the step as analyzed taken `wall_s` instead of `analyzed_wall_s`."""
        return max(self.step_s + self.wall_share * (wall_s - analyzed_wall_s), 0.0)

    def to_dict(self):
        return {"kind": self.kind, "step_s": self.step_s, "how": self.how, "wall_share": self.wall_share,
                "parts": dict(self.parts)}


def compiler_groups(records):
    """Kernels a fusing compiler would make of the memory-bound ops: lists of records, singletons included.

    A producer joins its consumer (same phase, both memory-bound) when every reader of the producer in that
    phase is memory-bound: one kernel can then compute them all, the producer's value in registers. Readers
    in the other phase (a forward activation the backward reads) only force its write, which
    fusion_bytes_saved already keeps."""
    def all_readers_fuse(producer, consumer, by_index):
        readers = [by_index[c] for c in producer.consumers if c in by_index]
        return all(c.op_class in FUSIBLE_CLASSES and not c.kernel for c in readers if c.phase == producer.phase)

    return linked_groups(records, all_readers_fuse)


def compiled_program(records, ceilings, wall_time_s, busy_time_s, groups=None):
    """(device seconds, kernel launches) of the step as a fusing compiler would run it (`groups`: its
    compiler_groups, when known)."""
    scale = time_scale(records, wall_time_s, busy_time_s)
    groups = compiler_groups(records) if groups is None else groups
    grouped = {r.index for g in groups for r in g}
    device = sum(r.time_s for r in records if r.index not in grouped) * scale
    launches = sum(1 for r in records if r.index not in grouped and launches_kernel(r)) + len(groups)
    bandwidth = ceilings.bandwidth * FUSED_BANDWIDTH_FRACTION
    # no kernel runs shorter than the step's shortest one did (a launch's fixed device cost)
    shortest = min((r.time_s for r in records if r.time_s > 0 and launches_kernel(r)), default=0.0) * scale
    for group in groups:
        eager = sum(r.time_s for r in group) * scale
        moved = sum(r.bytes for r in group) - fusion_bytes_saved(group)
        fused = max(moved / bandwidth if bandwidth > 0 else 0.0, shortest)
        device += min(eager, fused)
    return device, launches


def _channels_last_seconds(records):
    """Seconds of the convolutions if each ran at the best fraction of its roof any contraction reached."""
    fractions = [r.roofline_time_s / r.time_s for r in records if r.contraction and r.time_s > 0
                 and r.roofline_time_s > 0 and r.regime != "overhead"]
    best = min(max(fractions, default=0.0), 1.0)
    saved = 0.0
    for r in records:
        if "convolution" in r.name and best > 0 and r.time_s > 0:
            saved += max(r.time_s - r.roofline_time_s / best, 0.0)
    return saved


def host_ranges(records, timeline):
    """{record index: seconds} of the analyzed step's op ranges on the host (analysis.timeline: (track, start_ns,
    end_ns, index, name))."""
    return {s[3]: (s[2] - s[1]) / 1e9 for s in timeline or () if s[0] == "host" and s[3] < len(records)}


def kept_host_seconds(records, timeline, fused):
    """Host seconds the ATen calls of no class a compiler knows (op class "other": a cuDNN RNN that builds its
    plan on every call) take beyond the step's median ATen call, from their profiler ranges. Compiled code calls
    them as eager does, so that time stays. Contractions are left out: a host ahead of the device blocks inside
    their ranges, which is the device's time; so are ops that wait for the device (.item(), nonzero)."""
    ranges = host_ranges(records, timeline)
    if not ranges:
        return 0.0
    typical = sorted(ranges.values())[len(ranges) // 2]
    extra = 0.0
    for r in records:
        if r.index in ranges and r.index not in fused and r.op_class == "other" and not r.kernel \
                and launches_kernel(r) and not (r.blocker or host_copies.uncapturable(r.name)):
            extra += max(ranges[r.index] - typical, 0.0)
    return extra


def predict_steps(records, ceilings, split, wall_time_s, busy_time_s, train=False, tf32_enabled=None,
                  structure=None, modes=None, timeline=None):
    """{kind: Prediction} for every kind of REMEDY_KINDS that can be priced on this device. `structure`: the
    graphs.GraphStructure of the model (its graphs, breaks and guards), where counted; else one graph.
    `modes`: precision.measure_modes' ModeSteps; a precision mode without one is priced by the ratio of its roofs
    (advise.precision_seconds). `timeline`: the analyzed step's profiler ranges (kept_host_seconds)."""
    wall = max(wall_time_s, 0.0)
    scale = time_scale(records, wall, busy_time_s)   # traced op times -> the plain step's
    groups = compiler_groups(records)
    device, launches = compiled_program(records, ceilings, wall, busy_time_s, groups)
    per_call = 2 if train else 1  # AOTAutograd's forward and backward per Dynamo graph
    graphs = per_call * (structure.graphs if structure is not None else 1)
    call_s = COMPILED_CALL_S + (structure.guards / max(structure.graphs, 1) * GUARD_S if structure else 0.0)
    # on the CPU an op's host time is its time, in `device` already. No more than eager's device waited on its host:
    # a range that waits for the device (a cuDNN RNN syncs) holds device time too
    kept_host = min(kept_host_seconds(records, timeline, {r.index for g in groups for r in g}),
                    split.get("overhead", 0.0)) if ceilings.kind == "cuda" else 0.0
    host = launches * ceilings.launch_latency + graphs * call_s + kept_host
    launched = max(device, host)
    fused = f"{launches} kernels, {device * 1e3:.3g} ms on the device after fusion"
    if structure is not None:
        fused += f", {structure}"
    inductor_host = host
    if ceilings.kind == "cuda":   # Inductor's wrapper, not the bare launch, paces its launches
        inductor_host += launches * max(INDUCTOR_KERNEL_S - ceilings.launch_latency, 0.0)
    parts = (("device_s", device), ("launches", launches), ("launch_latency_s", ceilings.launch_latency),
             ("graph_calls", graphs), ("graph_call_s", call_s), ("kept_host_s", kept_host))
    preds = {
        "inductor": Prediction("inductor", max(device, inductor_host),
                               f"{fused}, launched from Inductor's wrapper ({inductor_host * 1e3:.3g} ms on the host)",
                               parts=parts + (("host_s", inductor_host),)),
    }
    if ceilings.kind == "cuda":
        # a graph holding an op no CUDA graph can capture launches its kernels: its share of the launches stays
        blockers = [(r.name, why) for r in records if (why := r.blocker or host_copies.uncapturable(r.name))]
        blocked = min(len(blockers), graphs)
        replayed = device + (graphs - blocked) * (ceilings.launch_latency + call_s) + \
            blocked * (launches / graphs * ceilings.launch_latency + call_s) + kept_host
        how = f"{fused}, replayed without launch gaps"
        if blocked:
            how += (f"; {blocked} of {graphs} graph calls cannot be captured ({blockers[0][0]} "
                    f"{blockers[0][1]}) and launch")
        preds["cuda-graphs"] = Prediction("cuda-graphs", replayed, how,
                                          parts=parts + (("uncapturable_graph_calls", blocked),))
        best = min(launched, replayed)
        preds["compile"] = Prediction("compile", best, f"{fused}, launched ({launched * 1e3:.3g} ms) or replayed "
                                                       f"({replayed * 1e3:.3g} ms), whichever is faster",
                                      parts=parts + (("host_s", host), ("replayed_s", replayed)))
    else:
        preds["compile"] = Prediction("compile", launched, f"{fused}, launched from the host ({host * 1e3:.3g} ms)",
                                      parts=parts + (("host_s", host),))
    for key in ("tf32", "bf16") if ceilings.kind == "cuda" else ("bf16",):
        measured = mode_step_seconds(modes[key], records, ceilings, wall, busy_time_s, split) \
            if key in (modes or {}) else None
        if measured is not None:
            step, how, mode_parts = measured
            preds[key] = Prediction(key, step, how, 1.0, parts=mode_parts)
            continue
        priced = precision_seconds(records, ceilings, key, tf32_enabled)
        if priced is not None:
            # traced op times, scaled to the plain step's: a loaded host traces slowly, and the traced matmuls
            # alone could outlast the plain step (a prediction of 0 s)
            old, new, n = priced[0] * scale, priced[1] * scale, priced[2]
            preds[key] = Prediction(key, max(wall - (old - new), 0.0),
                                    f"{n} fp32 matmul-family ops: {old * 1e3:.3g} -> {new * 1e3:.3g} ms", 1.0)
        else:
            preds[key] = Prediction(key, wall, "no fp32 matmul-family op to speed up (or the mode is on): no change",
                                    1.0)
    conv_saved = _channels_last_seconds(records) * scale
    if any("convolution" in r.name for r in records):
        preds["channels-last"] = Prediction("channels-last", max(wall - conv_saved, 0.0),
                                            f"convolutions {conv_saved * 1e3:.3g} ms faster at the step's best "
                                            f"fraction of the matmul roof", 1.0)
    work = split["compute"] + split["bandwidth"]
    preds["batch"] = Prediction("batch", (wall + work) / 2,
                                f"twice the batch costs one more busy time ({work * 1e3:.3g} ms), per current batch",
                                0.5)
    return preds
