"""Session-3 probe 4: training with CUDA graphs under the lean runtime (forward replays lend the saved tensors to
the backward's replay). A: correctness against eager over several steps: a plain loop with new inputs each
step, gradient accumulation (two forwards, then both backwards), retain_graph. B: seed MLP bf16 16384 train
step, eager / brrr / brrr-cudagraphs (Inductor last). C: BERT-base bf16 8x512 train step, same."""
import os
import sys

import torch

import brrr
from brrr.bench import bench
from brrr.examples import bert, mlp

parts = sys.argv[1] if len(sys.argv) > 1 else "ABC"


def grads_of(model):
    return [p.grad.detach().clone() if p.grad is not None else None for p in model.parameters()]


def max_rel(a, b):
    worst = 0.0
    for x, y in zip(a, b):
        if x is None or y is None:
            continue
        worst = max(worst, ((x.double() - y.double()).norm() / (y.double().norm() + 1e-12)).item())
    return worst


def check(name, ok, detail):
    print(f"A {'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)


if "A" in parts:
    cases = [(f"{name}{' graphs' if graphs else ''}", build, graphs) for name, build in
             (("mlp", lambda: mlp(device="cuda", batch=64, dim=128)), ("bert", lambda: bert(device="cuda")))
             for graphs in (False, True)]
    for label, build, graphs in cases:
        model, (x,) = build()
        torch.manual_seed(0)
        torch._dynamo.reset()
        fn = brrr.compile(model, cuda_graphs=graphs)

        def loss_of(out):
            out = out if isinstance(out, torch.Tensor) else out.last_hidden_state
            return (out.float() ** 2).mean()

        def new_input(i):
            if x.is_floating_point():
                return torch.randn_like(x) * (1 + i)
            return torch.randint(0, 100, x.shape, device=x.device)
        worst = 0.0
        for i in range(6):   # a plain loop: the previous loss stays alive while the next forward runs
            xi = new_input(i)
            model.zero_grad(set_to_none=True)
            loss = loss_of(fn(xi))
            loss.backward()
            got = grads_of(model)
            model.zero_grad(set_to_none=True)
            loss_of(model(xi)).backward()
            err = max_rel(got, grads_of(model))
            print(f"A   {label} step {i}: {err:.2e}", flush=True)
            worst = max(worst, err)
        check(f"{label} loop of 6 steps", worst < 1e-4, f"worst relative grad error {worst:.2e}")
        worst = 0.0
        for i in range(4):   # gradient accumulation: two forwards, then both backwards
            a, b = new_input(i), new_input(i + 10)
            model.zero_grad(set_to_none=True)
            la, lb = loss_of(fn(a)), loss_of(fn(b))
            la.backward()
            lb.backward()
            got = grads_of(model)
            model.zero_grad(set_to_none=True)
            loss_of(model(a)).backward()
            loss_of(model(b)).backward()
            worst = max(worst, max_rel(got, grads_of(model)))
        check(f"{label} accumulation", worst < 1e-4, f"worst relative grad error {worst:.2e}")
        worst = 0.0
        for i in range(3):   # retain_graph: the same backward twice, with a forward in between
            a, b = new_input(i), new_input(i + 20)
            model.zero_grad(set_to_none=True)
            la = loss_of(fn(a))
            la.backward(retain_graph=True)
            loss_of(fn(b))
            la.backward()
            got = grads_of(model)
            model.zero_grad(set_to_none=True)
            lr = loss_of(model(a))
            lr.backward(retain_graph=True)
            lr.backward()
            worst = max(worst, max_rel(got, grads_of(model)))
        check(f"{label} retain_graph", worst < 1e-4, f"worst relative grad error {worst:.2e}")
        torch._dynamo.reset()

ms = lambda v: "-" if v is None else f"{v*1e3:.3f}"  # noqa: E731


def show(tag, r):
    for row in r.rows:
        print(f"{tag} {row.backend:18s} {row.status:6s} median {ms(row.median_s)} steady {ms(row.steady_s)} ms "
              f"peak {row.peak_memory_bytes and row.peak_memory_bytes / 2**20:.0f} MiB {row.reason or ''}", flush=True)


if "B" in parts:
    model, inputs = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
    show("B mlp train", bench(model, *inputs, backends=["eager", "brrr", "brrr-cudagraphs", "inductor"],
                              train=True, warmup=25, rep=100, compile_warm=False))

if "C" in parts:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from suite_sections import HiddenStates

    from brrr.examples import build_example
    model, inputs = build_example("bert-base", device="cuda", dtype=torch.bfloat16, batch=8, seq=512)
    show("C bert-base train", bench(HiddenStates(model, use_cache_kwarg=False), *inputs,
                                    backends=["eager", "brrr", "brrr-cudagraphs", "inductor"], train=True,
                                    warmup=25, rep=100, compile_warm=False))
