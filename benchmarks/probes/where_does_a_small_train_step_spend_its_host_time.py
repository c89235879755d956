"""Where does a small training step spend its host time, under eager and under brrr?

Not run on a GPU yet. The seed MLP's bf16 training step (batch 16384, 1024 wide) is host-bound under both: on
the H100 its kernels take 0.45 ms (brrr) and 0.54 ms (eager), yet a step takes 1.21 and 0.83 ms back to back.
cProfile put ~270 us in the autograd engine around brrr's Python backward and ~18 us in each static launch, but
cProfile's own cost inflates every Python call. This probe times the parts without a profiler, back to back
(synchronize, n calls, synchronize; median of chunks), so each figure is host time per call:

- the whole step, the forward alone and (by difference) the backward, under eager and brrr;
- brrr's generated forward and backward `call`s run directly on the main thread (no autograd.Function, no
  engine), and the step with the engine's device threads off (`set_multithreading_enabled(False)`);
- one launch of a one-kernel graph: torch's static launcher, Triton's launcher, Triton's JIT path; the
  equivalent eager op; the generated call around it; the compiled function through Dynamo;
- an autograd.Function with a Python backward against a C++ op: what the engine's hand-off to Python costs;
- the small runtime pieces: `layout`, `empty_cuda`, an extern ATen call through OpOverload's `_op`.

    PYTHONPATH=$PWD python3 benchmarks/probes/where_does_a_small_train_step_spend_its_host_time.py
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/probes/where_does_a_small_train_step_spend_its_host_time.py --quick
"""

import argparse
import statistics
import time

import torch


def per_call_us(fn, calls=200, chunks=7, device="cuda"):
    """Median over chunks of (wall time of `calls` back-to-back calls) / calls, in us."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    out = []
    for _ in range(chunks):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def report(name, us, note=""):
    print(f"{name:58s} {us:9.1f} us  {note}", flush=True)


class Recorder:
    """Keeps the arguments of the last call of every CompiledGraph (forward and backward)."""

    def __init__(self):
        from brrr.compile.runtime import CompiledGraph
        self.cls, self.calls, self.orig = CompiledGraph, {}, CompiledGraph.__call__

    def __enter__(self):
        recorder = self

        def recording(graph, *args):
            boxed = args[0] if len(args) == 1 and isinstance(args[0], list) else list(args)
            recorder.calls[graph.kind] = (graph, list(boxed))
            return recorder.orig(graph, *args)

        self.cls.__call__ = recording
        return self

    def __exit__(self, *exc):
        self.cls.__call__ = self.orig


class Timed(Recorder):
    """Adds up the wall time spent inside each kind of CompiledGraph call."""

    def __enter__(self):
        import collections
        self.totals = collections.Counter()
        orig, totals = self.orig, self.totals

        def timed(graph, *args):
            t0 = time.perf_counter()
            try:
                return orig(graph, *args)
            finally:
                totals[graph.kind] += time.perf_counter() - t0

        self.cls.__call__ = timed
        return self


def seed_step(model, x, cot):
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        out = model(x)
        torch.autograd.backward([out], [cot])
    return step


def forward_only(model, x):
    def fwd():
        model(x)
    return fwd


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny sizes")
    args = p.parse_args(argv)
    import brrr
    from brrr.examples import mlp

    device = "cpu" if args.quick else "cuda"
    dtype = torch.float32 if args.quick else torch.bfloat16
    calls = 5 if args.quick else 200
    chunks = 2 if args.quick else 7
    time_us = lambda fn, c=calls: per_call_us(fn, c, chunks, device)   # noqa: E731
    torch.manual_seed(0)
    model, (x,) = mlp(device=device, dtype=dtype, batch=64 if args.quick else 16384, dim=32 if args.quick else 1024)
    model.train()
    cot = torch.randn(x.shape, device=device, dtype=dtype)
    print(f"device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, torch {torch.__version__}")

    print("\n-- the seed MLP's train step, back to back (host time per step)")
    eager_step = time_us(seed_step(model, x, cot))
    report("eager step", eager_step)
    eager_fwd = time_us(forward_only(model, x))
    report("eager forward (grad on)", eager_fwd)
    report("eager backward (step - forward)", eager_step - eager_fwd)

    compiled = brrr.compile(model)
    with Recorder() as rec:
        seed_step(compiled, x, cot)()
    brrr_step = time_us(seed_step(compiled, x, cot))
    report("brrr step", brrr_step, f"{brrr_step / eager_step:.2f}x eager's time")
    brrr_fwd = time_us(forward_only(compiled, x))
    report("brrr forward (grad on)", brrr_fwd)
    report("brrr backward (step - forward)", brrr_step - brrr_fwd)
    for kind in ("forward", "backward"):
        if kind in rec.calls:
            graph, boxed = rec.calls[kind]
            report(f"brrr {kind} generated call alone (main thread)", time_us(lambda: graph.call(list(boxed))))
    torch.autograd.set_multithreading_enabled(False)
    try:
        report("brrr step, autograd device threads off", time_us(seed_step(compiled, x, cot)))
        report("eager step, autograd device threads off", time_us(seed_step(model, x, cot)))
    finally:
        torch.autograd.set_multithreading_enabled(True)

    print("\n-- the same step at batch 64, 32 wide: host time alone (the device never waits on nobody)")
    tiny, (tx,) = mlp(device=device, dtype=dtype, batch=64, dim=32)
    tiny.train()
    tcot = torch.randn(tx.shape, device=device, dtype=dtype)
    variants = [("eager", lambda m: m), ("dynamo, backend eager (Dynamo's own cost)",
                                        lambda m: torch.compile(m, backend="eager")),
                ("aot_eager (AOTAutograd's runtime, ATen ops)", lambda m: torch.compile(m, backend="aot_eager")),
                ("brrr", lambda m: brrr.compile(m))]
    if device == "cuda":
        variants.append(("brrr, cuda_graphs (fixed cost: Dynamo + Function + engine)",
                         lambda m: brrr.compile(m, cuda_graphs=True)))
    for name, make in variants:
        torch._dynamo.reset()
        fn = make(tiny)
        seed_step(fn, tx, tcot)()
        step_us = time_us(seed_step(fn, tx, tcot))
        fwd_us = time_us(forward_only(fn, tx))
        report(f"step: {name}", step_us, f"forward {fwd_us:.1f} us, backward {step_us - fwd_us:.1f} us")
        if name == "brrr":
            steps = 5 if device == "cpu" else 400
            for threads in (True, False):
                torch.autograd.set_multithreading_enabled(threads)
                try:
                    if not threads:
                        report("step: brrr, autograd device threads off", time_us(seed_step(fn, tx, tcot)))
                    with Timed() as timed:
                        for _ in range(steps):
                            seed_step(fn, tx, tcot)()
                finally:
                    torch.autograd.set_multithreading_enabled(True)
                for kind, total in timed.totals.items():
                    report(f"   inside brrr's {kind} CompiledGraph, device threads {'on' if threads else 'off'}",
                           total / steps * 1e6)
            with Recorder() as rec:
                seed_step(fn, tx, tcot)()
            for kind, (graph, boxed) in rec.calls.items():
                report(f"   brrr's {kind} generated call alone, on the main thread",
                       time_us(lambda: graph.call(list(boxed))))
    torch._dynamo.reset()

    print("\n-- one launch (a + b on 4096 elements)")
    a = torch.randn(4096, device=device, dtype=dtype)
    b = torch.randn(4096, device=device, dtype=dtype)
    out = torch.empty_like(a)
    report("eager torch.add(a, b, out=out)", time_us(lambda: torch.add(a, b, out=out), calls * 5))
    report("eager a + b", time_us(lambda: a + b, calls * 5))
    add = brrr.compile(lambda u, v: u + v)
    with Recorder() as rec:
        add(a, b)
    report("brrr compiled fn (Dynamo + lean + call)", time_us(lambda: add(a, b), calls * 5))
    graph, boxed = rec.calls.get("inference", (None, None))
    if graph is not None:
        report("brrr generated call alone", time_us(lambda: graph.call(list(boxed)), calls * 5))
        launchers = [v for v in graph.call.__globals__.values() if type(v).__name__ == "Launcher"]
        if launchers:
            la = launchers[0]
            largs = (a, b, out) if len(la.jit_fn.arg_names) >= 3 else (a, out)
            la(*largs)
            report(f"Launcher, static={la.static is not None}", time_us(lambda: la(*largs), calls * 5))
            static = la.static
            la.static = None
            report("Launcher through Triton's launcher", time_us(lambda: la(*largs), calls * 5))
            fast = la.fast
            la.fast = None
            report("Launcher through the JIT path", time_us(lambda: la(*largs), calls * 5))
            la.fast, la.static = fast, static

    print("\n-- the autograd engine's hand-off to a Python backward (4096 elements)")
    leaf = torch.randn(4096, device=device, dtype=dtype, requires_grad=True)
    g = torch.ones_like(leaf)

    class PyIdentity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 1

        @staticmethod
        def backward(ctx, grad):
            return grad * 1

    def cxx():
        leaf.grad = None
        torch.autograd.backward([leaf * 1], [g])

    def py():
        leaf.grad = None
        torch.autograd.backward([PyIdentity.apply(leaf)], [g])

    report("forward+backward, C++ op", time_us(cxx))
    report("forward+backward, autograd.Function (Python)", time_us(py))
    torch.autograd.set_multithreading_enabled(False)
    try:
        report("forward+backward, autograd.Function, device threads off", time_us(py))
    finally:
        torch.autograd.set_multithreading_enabled(True)

    print("\n-- runtime pieces")
    from brrr.compile.runtime import _EMPTY_CUDA, layout
    t = torch.randn(64, 32, device=device, dtype=dtype)
    report("layout(t, t.stride()) (no copy)", time_us(lambda: layout(t, (32, 1)), calls * 5))
    if device == "cuda" and _EMPTY_CUDA is not None:
        report("empty_cuda((64, 32), (32, 1), dtype)", time_us(lambda: _EMPTY_CUDA((64, 32), (32, 1), dtype),
                                                                calls * 5))
    report("torch.empty_strided", time_us(lambda: torch.empty_strided((64, 32), (32, 1), dtype=dtype,
                                                                        device=device), calls * 5))
    w = torch.randn(32, 32, device=device, dtype=dtype)
    bias = torch.randn(32, device=device, dtype=dtype)
    addmm = torch.ops.aten.addmm.default
    report("aten.addmm.default._op (small)", time_us(lambda: addmm._op(bias, t, w), calls * 5))
    report("torch.addmm (small)", time_us(lambda: torch.addmm(bias, t, w), calls * 5))
    report("aten.mm.default._op (small)", time_us(lambda: torch.ops.aten.mm.default._op(t, w), calls * 5))
    import threading
    print("\nPython threads at the end:", [t.name for t in threading.enumerate()])


if __name__ == "__main__":
    main()
