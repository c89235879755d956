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
    # judged as METHOD.md says: brrr's gradient error against a float64 copy, next to eager's own error
    import copy
    cases = [(f"{name}{' graphs' if graphs else ''}", build, graphs) for name, build in
             (("mlp", lambda: mlp(device="cuda", batch=64, dim=128)), ("bert", lambda: bert(device="cuda")))
             for graphs in (False, True)]

    def loss_of(out):
        out = out if isinstance(out, torch.Tensor) else out.last_hidden_state
        return (out.double() ** 2).mean()

    for label, build, graphs in cases:
        model, (x,) = build()
        model.eval()   # no dropout: the same function in every run (gradients still flow)
        m64 = copy.deepcopy(model).double()
        torch.manual_seed(0)
        torch._dynamo.reset()
        fn = brrr.compile(model, cuda_graphs=graphs)

        def new_input(i):
            if x.is_floating_point():
                return torch.randn_like(x) * (1 + i)
            return torch.randint(0, 100, x.shape, device=x.device)

        def cast64(t):
            return t.double() if t.is_floating_point() else t

        def run(kind, inputs, retain=False):
            """grads of (sum of losses) for brrr, eager and fp64, with the pattern `kind`."""
            out = {}
            for name, f, m in (("brrr", fn, model), ("eager", model, model), ("fp64", m64, m64)):
                m.zero_grad(set_to_none=True)
                xs = [cast64(t) for t in inputs] if name == "fp64" else inputs
                if kind == "loop":
                    loss_of(f(xs[0])).backward()
                elif kind == "accumulate":
                    la, lb = loss_of(f(xs[0])), loss_of(f(xs[1]))
                    la.backward()
                    lb.backward()
                else:   # retain: the same backward twice, a forward of another input in between
                    la = loss_of(f(xs[0]))
                    la.backward(retain_graph=True)
                    loss_of(f(xs[1]))
                    la.backward()
                out[name] = grads_of(m)
            return max_rel(out["brrr"], out["fp64"]), max_rel(out["eager"], out["fp64"])

        for kind, steps in (("loop", 6), ("accumulate", 4), ("retain", 3)):
            worst = 0.0
            for i in range(steps):
                got, eager = run(kind, [new_input(i), new_input(i + 10)])
                worst = max(worst, got / max(eager, 1e-7))
            check(f"{label} {kind}", worst < 3, f"worst brrr/eager error ratio against fp64 {worst:.2f}")
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
