"""Stage 4 of the analyzer (capture -> time -> regimes -> advise -> report): what to do, and what it saves.

Each piece of advice is `{"kind", "message", "predicted_saving_s"}` (plus detail keys), sorted by saving:
- "fuse": a group of memory-bound ops (elementwise / normalization, linked producer -> consumer through
  the capture's storage tracking) that one kernel could run. Saved: the intermediates' bytes, each read
  back once by its consumer and written once by its producer unless something outside the group (or the
  step's result) still needs it, over the measured bandwidth.
- "cuda-graphs", "compile", "batch": for runs where overhead holds a large share of the wall time.
- "tf32", "bf16": fp32 matmuls that faster tensor-core modes would speed up, scaled by the measured
  matmul rates of the modes.
"""

import torch

FUSIBLE_CLASSES = ("elementwise", "normalization")
MAX_FUSE_ITEMS = 5                # the largest fusion groups get an item each; the rest one summary item
OVERHEAD_ADVICE_FRACTION = 0.3    # overhead advice when overhead holds at least this share of the wall time
MIN_FUSE_BYTES = 1024             # smaller savings are scalars (a loss, a gradient seed), not worth a line
STEP_KINDS = ("cuda-graphs", "compile", "batch", "tf32", "bf16")  # advice whose whole step brrr can measure
FASTER_MODE_MARGIN = 1.2          # a precision mode must be this much faster than the current one to advise it


def advice_item(kind, message, predicted_saving_s, **detail):
    """One piece of advice. `basis`: "predicted" (from the cost model) until verify.py measures its remedy, then
    "measured" with `measured_saving_s` beside the prediction."""
    return {"kind": kind, "message": message, "predicted_saving_s": max(float(predicted_saving_s), 0.0),
            "basis": "predicted", **detail}


def short_name(op_name):
    """'aten.native_layer_norm.default' -> 'native_layer_norm'."""
    parts = op_name.split(".")
    return parts[1] if len(parts) >= 2 else op_name


def common_module(paths, most=3):
    """The longest dotted prefix shared by all module paths, else the first few distinct paths."""
    prefix = []
    for parts in zip(*[p.split(".") for p in paths]):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    if prefix:
        return ".".join(prefix)
    distinct = list(dict.fromkeys(paths))
    more = f" and {len(distinct) - most} more" if len(distinct) > most else ""
    return ", ".join(distinct[:most]) + more


# --- fusion -------------------------------------------------------------------------------------------------

def fusion_groups(records):
    """Groups (2+ ops) of fusible ops joined by producer -> consumer edges within one phase.

    An edge joins only when the consumer is the producer's sole reader, so a group is a tree flowing into
    one last op and no op outside the group can sit on a path between two of its members: one kernel
    can run it. (A producer with several readers, like a layer norm feeding three projections and a
    residual add, would need those readers inside the kernel too.)
    """
    def sole_reader(producer, consumer, by_index):
        return producer.consumers == [consumer.index]

    return [g for g in linked_groups(records, sole_reader) if len(g) > 1]


def linked_groups(records, joins):
    """Fusible ops (not compiled kernels) grouped along producer -> consumer edges of one phase for which
    `joins(producer, consumer, by_index)` holds; every fusible op is in one group, alone or not."""
    by_index = {r.index: r for r in records}
    parent = {r.index: r.index for r in records if r.op_class in FUSIBLE_CLASSES and not r.kernel}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for r in records:
        if r.index not in parent:
            continue
        for producer, _ in r.inputs_from:
            p = by_index.get(producer)
            if p is not None and p.index in parent and p.phase == r.phase and joins(p, r, by_index):
                parent[find(r.index)] = find(p.index)
    groups = {}
    for i in parent:
        groups.setdefault(find(i), []).append(by_index[i])
    return [sorted(g, key=lambda r: r.index) for g in groups.values()]


def fusion_bytes_saved(group):
    """Bytes one kernel for `group` would not move: intermediate reads, and writes nobody outside needs."""
    members = {r.index for r in group}
    saved = 0
    for r in group:
        saved += sum(nbytes for producer, nbytes in r.inputs_from if producer in members)
        internal_consumers = [c for c in r.consumers if c in members]
        if internal_consumers and len(internal_consumers) == len(r.consumers) and not r.is_step_output:
            saved += r.bytes_written
    return saved


def fusion_advice(records, ceilings, groups=None):
    items = []
    for group in fusion_groups(records) if groups is None else groups:
        saved = fusion_bytes_saved(group)
        if saved < MIN_FUSE_BYTES:
            continue
        chain = " -> ".join(short_name(r.name) for r in group)
        module = common_module([r.module for r in group])
        phase = group[0].phase
        items.append(advice_item(
            "fuse",
            f"fuse {chain} in {module} ({phase}) into one kernel: {len(group)} ops, {saved / 1e6:.3g} MB of "
            f"intermediates not written and read back; torch.compile(model, backend=\"brrr\") does this",
            saved / ceilings.bandwidth, ops=[r.index for r in group], module=module, bytes_saved=saved,
        ))
    items.sort(key=lambda a: -a["predicted_saving_s"])
    if len(items) > MAX_FUSE_ITEMS:
        rest = items[MAX_FUSE_ITEMS:]
        rest_bytes = sum(a["bytes_saved"] for a in rest)
        items = items[:MAX_FUSE_ITEMS] + [advice_item(
            "fuse", f"{len(rest)} more fusible group(s) of memory-bound ops: {rest_bytes / 1e6:.3g} MB of "
                    f"intermediates in all", rest_bytes / ceilings.bandwidth, bytes_saved=rest_bytes,
        )]
    return items


# --- overhead -------------------------------------------------------------------------------------------------

def overhead_advice(records, split, wall_time_s, busy_time_s, kind, fusion_items, groups=None, predictions=None):
    """CUDA graphs, compiling and a larger batch, when overhead holds a large share of the step.

    predictions: predict.predict_steps' figures; where given, the CUDA-graph and compile items quote them (the
    figures `--verify` measures against) instead of the estimates here."""
    if wall_time_s <= 0 or split["overhead"] < OVERHEAD_ADVICE_FRACTION * wall_time_s:
        return []
    overhead = split["overhead"]
    idle = max(wall_time_s - min(busy_time_s, wall_time_s), 0.0)
    share = f"{overhead / wall_time_s:.0%} of the step ({overhead * 1e3:.3g} ms) is overhead"
    items = []
    graph_saving = idle
    if predictions and "cuda-graphs" in predictions:
        graph_saving = wall_time_s - predictions["cuda-graphs"].step_s
    if kind == "cuda":
        items.append(advice_item(
            "cuda-graphs",
            f"{share}; the GPU idles {idle / wall_time_s:.0%} of the time waiting for launches. CUDA graphs "
            f"(brrr.compile(model) replays where it measures a gain, cuda_graphs=True always; torch.compile "
            f"mode=\"reduce-overhead\" or torch.cuda.graphs) "
            f"replay the step's kernels in one launch: predicted step {(wall_time_s - graph_saving) * 1e3:.3g} ms",
            graph_saving,
        ))
    # Compiling removes the dispatch of every op it fuses away (views and fused groups), at the average
    # overhead per op, and the fused groups' traffic.
    removed_ops = sum(1 for r in records if r.op_class == "view")
    groups = fusion_groups(records) if groups is None else groups
    removed_ops += sum(len(group) - 1 for group in groups)
    per_op = overhead / len(records) if records else 0.0
    compile_saving = min(per_op * removed_ops + sum(a["predicted_saving_s"] for a in fusion_items), overhead)
    if predictions and "compile" in predictions:
        compile_saving = wall_time_s - predictions["compile"].step_s
    items.append(advice_item(
        "compile",
        f"{share}; torch.compile(model, backend=\"brrr\") removes {removed_ops} of {len(records)} op dispatches "
        f"(views and fused ops): predicted step {(wall_time_s - compile_saving) * 1e3:.3g} ms",
        compile_saving,
    ))
    # Overhead is per step, not per sample: twice the batch costs one more busy time, not one more wall time.
    work = split["compute"] + split["bandwidth"]
    items.append(advice_item(
        "batch",
        f"{share}, a fixed cost per step: doubling the batch is predicted to take {(wall_time_s + work) * 1e3:.3g} ms "
        f"for twice the samples, {overhead / 2 * 1e3:.3g} ms less per current batch",
        overhead / 2,
    ))
    return items


# --- precision --------------------------------------------------------------------------------------------------

def _floor(flops, nbytes, peak, bandwidth):
    return max(flops / peak if peak > 0 else 0.0, nbytes / bandwidth if bandwidth > 0 else 0.0)


PRECISION_MODES = {  # key -> (byte scale of the operands, how to turn it on)
    "tf32": (1.0, "torch.set_float32_matmul_precision(\"high\") (TF32 tensor cores, fp32 storage)"),
    "bf16": (0.5, "torch.autocast(device_type, dtype=torch.bfloat16) (bf16 tensor cores, half the bytes)"),
}


CUBLAS_MATMULS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "matmul", "_addmm_activation")


def fp32_contractions(records, cublas_only=False):
    """The step's fp32 contractions that do work (`cublas_only`: the cuBLAS matmuls, what TF32 reaches)."""
    return [r for r in records if r.contraction and r.dtype == torch.float32 and r.flops > 0
            and (not cublas_only or short_name(r.name) in CUBLAS_MATMULS)]


def _fp32_contractions(records):
    """fp32 matmul-family ops that are not launch-bound: a faster roof does not shorten a launch."""
    return [r for r in fp32_contractions(records) if r.regime != "overhead"]


def _current_mode(ceilings, tf32_enabled):
    if tf32_enabled is None:
        tf32_enabled = torch.get_float32_matmul_precision() != "highest"
    key = "tf32" if tf32_enabled else "fp32"
    return key, ceilings.matmul.get(key) or ceilings.vector_fp32


def precision_seconds(records, ceilings, key, tf32_enabled=None):
    """(seconds now, seconds in mode `key`, ops) of the step's fp32 contractions, each op's time scaled by the
    ratio of its roofline floors at the measured rates; None when there are none, `key` is the current mode,
    its rate is unknown, or it is TF32 off CUDA (an NVIDIA tensor-core mode)."""
    fp32_ops = _fp32_contractions(records)
    if key == "tf32":  # the matmul precision setting reaches cuBLAS, not attention kernels or convolutions
        fp32_ops = [r for r in fp32_ops if short_name(r.name) in CUBLAS_MATMULS]
    current_key, current_rate = _current_mode(ceilings, tf32_enabled)
    rate = ceilings.matmul.get(key) or 0.0
    if not fp32_ops or key == current_key or rate <= 0 or (key == "tf32" and ceilings.kind != "cuda"):
        return None
    byte_scale = PRECISION_MODES[key][0]
    new_time = 0.0
    for r in fp32_ops:
        old = _floor(r.flops, r.bytes, current_rate, ceilings.bandwidth)
        new = _floor(r.flops, r.bytes * byte_scale, rate, ceilings.bandwidth)
        new_time += r.time_s * (new / old if old > 0 else 1.0)
    return sum(r.time_s for r in fp32_ops), new_time, len(fp32_ops)


def precision_advice(records, ceilings, tf32_enabled=None, predictions=None, wall_time_s=None):
    """tf32 / bf16 advice for fp32 contractions (precision_seconds), where the mode's measured rate is
    FASTER_MODE_MARGIN above the current one. On CPU only bf16 is considered (AMX and AVX512-BF16 machines).
    Where `predictions` priced the mode from the ops it runs (precision.py), the advice quotes that figure."""
    current_key, current_rate = _current_mode(ceilings, tf32_enabled)
    items = []
    for key, (_, how) in PRECISION_MODES.items():
        priced = precision_seconds(records, ceilings, key, tf32_enabled)
        rate = ceilings.matmul.get(key) or 0.0
        if priced is None or rate < FASTER_MODE_MARGIN * current_rate:
            continue
        prediction = (predictions or {}).get(key)
        if prediction is not None and dict(prediction.parts).get("timed_calls") is not None \
                and wall_time_s is not None:
            if prediction.step_s < wall_time_s:   # predicted slower (a host-bound step pays autocast's casts)
                items.append(advice_item(key, f"{how}: {prediction.how}", wall_time_s - prediction.step_s))
            continue
        fp32_time, new_time, count = priced
        items.append(advice_item(
            key,
            f"{count} fp32 matmul-family ops (not launch-bound) take {fp32_time * 1e3:.3g} ms at {current_key} "
            f"({current_rate / 1e12:.3g} TFLOP/s measured); {how} runs them at {rate / 1e12:.3g} TFLOP/s: "
            f"predicted {new_time * 1e3:.3g} ms",
            fp32_time - new_time,
        ))
    return items


def advise(records, ceilings, split, wall_time_s, busy_time_s, tf32_enabled=None, predictions=None):
    """All advice for one analyzed step, largest predicted saving first. An item of a kind brrr can apply
    and measure (predict.REMEDY_KINDS) also carries `predicted_step_s`: the step time it predicts."""
    groups = fusion_groups(records)
    fusion = fusion_advice(records, ceilings, groups)
    items = fusion + precision_advice(records, ceilings, tf32_enabled, predictions, wall_time_s)
    items += overhead_advice(records, split, wall_time_s, busy_time_s, ceilings.kind, fusion, groups, predictions)
    for item in items:
        if item["kind"] in STEP_KINDS:
            item["predicted_step_s"] = max(wall_time_s - item["predicted_saving_s"], 0.0)
    return sorted(items, key=lambda a: -a["predicted_saving_s"])
