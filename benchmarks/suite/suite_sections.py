"""The GPU suite's sections: each a function (config, budget) -> data, run by run_suite.py.

Sections: ceilings, repeat (x*2 sweep per backend), cos (x.cos().cos() vs eager x.cos()), mlp (the seeds'
MLP, 2 batches x fp32/bf16 x inference/training), micro (softmax, layer norm, RMS norm, bias+GELU,
cross-entropy), models (BERT-base, GPT-2 small: inference and a training step). Inside a section each
configuration is guarded: an exception or an exhausted time budget is recorded and the next one runs.
"""

import time
import traceback

import torch

from brrr.bench import bench
from brrr.bench.micro import MICROS, run_micro

FULL = {
    "device": "cuda", "backends": ("eager", "inductor", "brrr"), "warmup": 25, "rep": 100,
    "repeat_numel": 2**28, "max_repeat": 256, "cos_numel": 2**28,
    "mlp_batches": (512, 16384), "mlp_dim": 1024, "mlp_dtypes": (torch.float32, torch.bfloat16),
    "micro_shapes": ((16384, 1024), (4096, 4096)), "micro_dtype": torch.bfloat16, "rotate_bytes": 128 * 2**20,
    "models": {"bert-base": {"batch": 8, "seq": 512}, "gpt2-small": {"batch": 8, "seq": 512}},
    "model_dtype": torch.bfloat16,
}

QUICK = {  # a CPU smoke run of the same code paths: tiny sizes, no C++ compile
    "device": "cpu", "backends": ("eager", "aot_eager", "brrr"), "warmup": 2, "rep": 5,
    "repeat_numel": 2**12, "max_repeat": 8, "cos_numel": 2**12,
    "mlp_batches": (8,), "mlp_dim": 64, "mlp_dtypes": (torch.float32, torch.bfloat16),
    "micro_shapes": ((64, 128),), "micro_dtype": torch.bfloat16, "rotate_bytes": 2**18,
    "models": {"bert": {"layers": 1, "hidden": 32, "heads": 2, "batch": 2, "seq": 8},
               "gpt2": {"layers": 1, "hidden": 32, "heads": 2, "batch": 2, "seq": 8}},
    "model_dtype": torch.bfloat16,
}


class Budget:
    """Seconds left for the suite; a configuration starts only while some remain."""

    def __init__(self, seconds):
        self.start, self.seconds = time.perf_counter(), seconds

    def elapsed(self):
        return time.perf_counter() - self.start

    def left(self):
        return self.seconds - self.elapsed()


def guarded(budget, fn, *args, **kwargs):
    """{"status": ok|error|skipped, "elapsed_s", "data" | "error"}: one configuration, never raising."""
    if budget.left() <= 0:
        return {"status": "skipped", "error": f"time budget of {budget.seconds:.0f} s spent"}
    start = time.perf_counter()
    try:
        data = fn(*args, **kwargs)
        return {"status": "ok", "elapsed_s": time.perf_counter() - start, "data": data}
    except Exception as e:
        return {"status": "error", "elapsed_s": time.perf_counter() - start,
                "error": f"{type(e).__name__}: {e}"[:500], "traceback": traceback.format_exc()[-3000:]}
    finally:
        torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def dtype_key(dtype):
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def section_ceilings(cfg, budget, console, ceilings_box):
    from brrr.cost.device import get_ceilings

    ceilings = get_ceilings(torch.device(cfg["device"]), progress=True)
    ceilings_box.append(ceilings)
    return ceilings.to_dict()


def section_repeat(cfg, budget, console, ceilings, out_prefix):
    from brrr.experiments import repeat

    results = {}
    for backend in [b for b in cfg["backends"] if b != "eager"]:
        png = f"{out_prefix}-repeat-{backend}.png"
        results[backend] = guarded(budget, repeat.run, backend=backend, device=cfg["device"],
                                   numel=cfg["repeat_numel"], max_repeat=cfg["max_repeat"], png=png,
                                   ceilings=ceilings, warmup=cfg["warmup"], rep=cfg["rep"], progress=True)
    return results


def section_cos(cfg, budget, console, ceilings, out_prefix):
    from brrr.experiments import cos_chain

    return guarded(budget, cos_chain.run, device=cfg["device"], numel=cfg["cos_numel"], backends=cfg["backends"],
                   warmup=cfg["warmup"], rep=cfg["rep"], progress=True)


def _bench_config(console, model, inputs, **kwargs):
    result = bench(model, *inputs, **kwargs)
    result.print(console)
    return result.to_dict()


def section_mlp(cfg, budget, console, ceilings, out_prefix):
    from brrr.examples import mlp

    results = {}
    for batch in cfg["mlp_batches"]:
        for dtype in cfg["mlp_dtypes"]:
            for train in (False, True):
                name = f"batch {batch}, {dtype_key(dtype)}, {'train' if train else 'inference'}"
                model, inputs = mlp(device=cfg["device"], dtype=dtype, batch=batch, dim=cfg["mlp_dim"])
                results[name] = guarded(budget, _bench_config, console, model, inputs, backends=cfg["backends"],
                                        train=train, progress=True, warmup=cfg["warmup"], rep=cfg["rep"],
                                        label=f"seed MLP dim {cfg['mlp_dim']}, batch {batch}",
                                        compile_warm=batch == cfg["mlp_batches"][0],  # warm once: time budget
                                        graph_timing=True)
                del model, inputs
    return results


def _micro_config(console, name, rows, cols, cfg, bandwidth):
    data, result = run_micro(name, rows, cols, dtype=cfg["micro_dtype"], device=cfg["device"],
                             backends=cfg["backends"], bandwidth=bandwidth, rotate_bytes=cfg["rotate_bytes"],
                             progress=True, warmup=cfg["warmup"], rep=cfg["rep"])
    result.print(console)
    console.print(f"ideal bytes {data['ideal_bytes'] / 2**20:.1f} MiB, " + ", ".join(
        f"{r['backend']} {100 * r['fraction_of_copy_bandwidth']:.0f}% of copy bandwidth"
        for r in data["rows"] if r["fraction_of_copy_bandwidth"] is not None))
    return data


def section_micro(cfg, budget, console, ceilings, out_prefix):
    bandwidth = ceilings.bandwidth if ceilings is not None else None
    results = {}
    for name in MICROS:
        for rows, cols in cfg["micro_shapes"]:
            results[f"{name} [{rows}, {cols}]"] = guarded(budget, _micro_config, console, name, rows, cols, cfg,
                                                          bandwidth)
    return results


class HiddenStates(torch.nn.Module):
    """A Hugging Face model reduced to `ids -> last_hidden_state` (no KV cache), for benchmarking."""

    def __init__(self, model, use_cache_kwarg):
        super().__init__()
        self.model, self.use_cache_kwarg = model, use_cache_kwarg

    def forward(self, ids):
        kwargs = {"use_cache": False} if self.use_cache_kwarg else {}
        return self.model(input_ids=ids, **kwargs).last_hidden_state


def section_models(cfg, budget, console, ceilings, out_prefix):
    from brrr.examples import build_example

    results = {}
    for example, sizes in cfg["models"].items():
        for train in (False, True):
            name = f"{example} {dtype_key(cfg['model_dtype'])}, {'train' if train else 'inference'}"

            def one(example=example, sizes=sizes, train=train):
                model, inputs = build_example(example, device=cfg["device"], dtype=cfg["model_dtype"], **sizes)
                wrapped = HiddenStates(model, use_cache_kwarg=example.startswith("gpt2"))
                shape = "x".join(str(d) for d in inputs[0].shape)
                return _bench_config(console, wrapped, inputs, backends=cfg["backends"], train=train,
                                     progress=True, warmup=cfg["warmup"], rep=cfg["rep"],
                                     label=f"{example} ids {shape}", compile_warm=False)

            results[name] = guarded(budget, one)
    return results


SECTIONS = {"repeat": section_repeat, "cos": section_cos, "mlp": section_mlp, "micro": section_micro,
            "models": section_models}
