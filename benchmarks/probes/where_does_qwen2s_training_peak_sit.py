"""Where does brrr's Qwen2-0.5B training peak sit, forward or backward, and what does the chunked loss add?

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_qwen2s_training_peak_sit.py

Prediction (CPU replay of the generated calls on meta tensors, and the changes since): with saved tensors freed
at their last use, the backward peaks ~1.4 GB under the forward's end; the forward peaks inside the chunked
loss at ~1.1 GB above its inputs (one 594 MiB chunk, the 519 MiB fp32 weight-gradient sum), unless cuBLAS's
fp32-output addmm allocates a temporary of its output's size (then ~1.6 GB).
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))
MiB = 1 << 20


def loss_op_alone():
    from brrr.compile import linear_cross_entropy_op  # noqa: F401  (registers the op)
    x = torch.randn(4096, 896, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(151936, 896, device="cuda", dtype=torch.bfloat16) * 0.02
    t = torch.randint(0, 151936, (4096,), device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = torch.ops.brrr.fused_linear_cross_entropy_with_grads(x, w, None, t, -100, "mean", 0.0, True, True, False,
                                                               torch.float32)
    torch.cuda.synchronize()
    print(f"loss op alone: peak {(torch.cuda.max_memory_allocated() - base) / MiB:.0f} MiB above its inputs, "
          f"{(torch.cuda.memory_allocated() - base) / MiB:.0f} MiB held after", flush=True)
    del out
    acc = torch.zeros(151936, 896, device="cuda")
    a, b = torch.randn(151936, 2048, device="cuda", dtype=torch.bfloat16), x[:2048]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    torch.cuda.synchronize()
    print(f"addmm(out_dtype=fp32, out=acc) in place: {(torch.cuda.max_memory_allocated() - base) / MiB:.0f} MiB "
          f"beyond its operands (acc is {acc.numel() * 4 / MiB:.0f} MiB)", flush=True)


def training_peaks(backend):
    import models
    from brrr.bench.backends import resolve_backend, skip_logging_in_graphs

    work = models.BY_NAME["qwen2-0.5b-train"].build("cuda", torch.bfloat16, False)
    skip_logging_in_graphs()
    torch._dynamo.reset()
    if backend == "brrr-launched":   # no CUDA graphs: each graph's buffers come and go with the caching allocator
        import brrr
        fn = brrr.compile(work.model, cuda_graphs=False)
    else:
        fn = torch.compile(work.model, backend=resolve_backend(backend)) if backend != "eager" else work.model
    for _ in range(3):
        for p in work.model.parameters():
            p.grad = None
        fn(*work.inputs).backward()
    for p in work.model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = fn(*work.inputs)
    torch.cuda.synchronize()
    fwd_peak, after_fwd = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated()
    print(f"{backend}: weights and inputs {base / MiB:.0f} MiB; forward peak +{(fwd_peak - base) / MiB:.0f}, "
          f"held after it +{(after_fwd - base) / MiB:.0f}; backward peak +{(bwd_peak - base) / MiB:.0f} MiB",
          flush=True)
    del work, fn, loss
    torch.cuda.empty_cache()


def held_between_steps(backend):
    """What a backend keeps allocated between the zoo's steps: live CUDA tensors of >= 32 MiB that are not the
    model's parameters or gradients, by size, with what holds them."""
    import gc

    import models
    from brrr.bench.backends import fresh_compile, skip_logging_in_graphs
    from brrr.bench.step import Step, make_cotangents
    from brrr.compile import replay_choice

    work = models.BY_NAME["qwen2-0.5b-train"].build("cuda", torch.bfloat16, False)
    skip_logging_in_graphs()
    cot = make_cotangents(work.model(*work.inputs))
    step = Step(fresh_compile(work.model, backend), work.model, [work.inputs], True, cot)
    step()
    outputs, grads = step.run_on_first_inputs()
    del outputs, grads
    for _ in range(replay_choice.TRIAL_CALLS + 10):
        step()
    for p in work.model.parameters():
        p.grad = None
    gc.collect()
    torch.cuda.synchronize()
    params = {p.data_ptr() for p in work.model.parameters()}
    weights = sum(p.numel() * p.element_size() for p in work.model.parameters())
    print(f"{backend}: allocated {torch.cuda.memory_allocated() / MiB:.0f} MiB between steps, weights "
          f"{weights / MiB:.0f} MiB; verdicts: {[str(d)[:60] for d in replay_choice.DECISIONS[-2:]]}", flush=True)
    big = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda and
           o.untyped_storage().nbytes() >= 32 * MiB and o.data_ptr() not in params]
    seen = set()
    for t in sorted(big, key=lambda t: -t.untyped_storage().nbytes()):
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        holders = [type(r).__name__ for r in gc.get_referrers(t) if r is not big][:4]
        print(f"  {t.untyped_storage().nbytes() / MiB:.0f} MiB {t.dtype} {list(t.shape)} held by {holders}",
              flush=True)
    del big, step, work
    gc.collect()
    torch.cuda.empty_cache()


def replayed_peaks():
    """brrr with every graph replayed: memory held between steps and a step's peak, with the backward's graph
    captured into its forward's pool and in a pool of its own."""
    import gc

    import brrr
    import models
    from brrr.bench.backends import skip_logging_in_graphs
    from brrr.compile.graphs import GraphedCall

    shared = GraphedCall._after_pool
    for label, after_pool in (("backward in the forward's pool", shared), ("pools apart", lambda self: None)):
        GraphedCall._after_pool = after_pool
        work = models.BY_NAME["qwen2-0.5b-train"].build("cuda", torch.bfloat16, False)
        skip_logging_in_graphs()
        torch._dynamo.reset()
        fn = brrr.compile(work.model, cuda_graphs=True)
        torch.cuda.empty_cache()
        for _ in range(4):
            for p in work.model.parameters():
                p.grad = None
            fn(*work.inputs).backward()
        for p in work.model.parameters():
            p.grad = None
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn(*work.inputs).backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.empty_cache()   # what stays reserved: the graphs' pools and live tensors
        print(f"replayed, {label}: held between steps {held / MiB:.0f} MiB, step peak "
              f"{peak / MiB:.0f} MiB; reserved after empty_cache {torch.cuda.memory_reserved() / MiB:.0f} MiB", flush=True)
        del work, fn
        gc.collect()
        torch.cuda.empty_cache()
    GraphedCall._after_pool = shared


def main():
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if "--replayed" in sys.argv:
        return replayed_peaks()
    if "--held" in sys.argv:
        for backend in ("brrr", "inductor"):
            held_between_steps(backend)
        return
    if "--launched-only" not in sys.argv:
        loss_op_alone()
        torch.cuda.empty_cache()
    for backend in (("brrr-launched",) if "--launched-only" in sys.argv else
                    ("eager", "brrr", "brrr-launched", "inductor")):
        training_peaks(backend)


if __name__ == "__main__":
    main()
