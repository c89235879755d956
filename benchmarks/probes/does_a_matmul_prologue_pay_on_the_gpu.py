"""Does computing a matmul operand's cheap producer in the template's K loop (a prologue) pay on the GPU?

Cases: an autocast-style linear (fp32 weight cast to bf16 on every call, bias, GELU) and a scaled input
(`(x * 0.125) @ w`, sigmoid). Each is timed (CUDA graph of 20 calls, median of 7 replays) as: the template with
the prologue (BRRR_MATMUL_TEMPLATES=1), the template with the operand loaded from its producer's kernel (prologue
off), brrr's default (cuBLAS), eager and Inductor; the folded output is compared bit for bit with the unfolded one.
"""

import os
import statistics
import sys

import torch
import torch.nn.functional as F

import brrr
from brrr.compile import matmul_fusion


def graph_time(fn, calls=20, reps=7):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def cast_weight(x, w, b):
    return F.gelu(F.linear(x, w.to(torch.bfloat16), b))


def scaled_input(x, w):
    return torch.sigmoid((x * 0.125) @ w)


def cast_input(x, w, b):
    return F.gelu(F.linear(x.to(torch.bfloat16), w, b))


def scaled_weight(x, w):
    return torch.sigmoid(x @ (w * 0.125))


def cases():
    g = torch.Generator(device="cuda").manual_seed(0)
    bf16 = torch.bfloat16

    def r(*shape, dtype=bf16, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)
    for m, n, k in ((8192, 3072, 768), (8192, 768, 3072), (1024, 1024, 1024), (128, 4096, 4096)):
        yield f"cast weight {m}x{n}x{k}", cast_weight, (r(m, k), r(n, k, dtype=torch.float32, scale=k ** -0.5),
                                                       r(n))
    for m, n, k in ((4096, 4096, 4096), (512, 512, 512)):
        yield f"scaled input {m}x{n}x{k}", scaled_input, (r(m, k), r(k, n, scale=k ** -0.5))
        yield f"scaled weight {m}x{n}x{k}", scaled_weight, (r(m, k), r(k, n, scale=k ** -0.5))
    for m, n, k in ((8192, 3072, 768), (1024, 1024, 1024)):
        yield f"cast input {m}x{n}x{k}", cast_input, (r(m, k, dtype=torch.float32), r(n, k, scale=k ** -0.5), r(n))


def compiled(fn, **opts):
    torch._dynamo.reset()
    return brrr.compile(fn, cuda_graphs=False, **opts)


def main():
    print(torch.cuda.get_device_name(), torch.__version__, file=sys.stderr)
    real = matmul_fusion.foldable_producers
    for label, fn, args in cases():
        row = {}
        os.environ["BRRR_MATMUL_TEMPLATES"] = "1"
        folded = compiled(fn)
        out_folded = folded(*args)
        ex = brrr.explain(fn, *args)
        row["prologue"] = graph_time(lambda: folded(*args))
        matmul_fusion.foldable_producers = lambda *a, **k: {}
        try:
            unfolded = compiled(fn)
            out_unfolded = unfolded(*args)
            row["no prologue"] = graph_time(lambda: unfolded(*args))
        finally:
            matmul_fusion.foldable_producers = real
        auto = compiled(fn, matmul_templates="auto")
        auto(*args)
        row["auto"] = graph_time(lambda: auto(*args))
        os.environ["BRRR_MATMUL_TEMPLATES"] = "0"
        default = compiled(fn)
        row["cuBLAS"] = graph_time(lambda: default(*args))
        row["eager"] = graph_time(lambda: fn(*args))
        torch._dynamo.reset()
        ind = torch.compile(fn)
        ind(*args)
        row["inductor"] = graph_time(lambda: ind(*args))
        same = torch.equal(out_folded, out_unfolded)
        err = (out_folded.float() - fn(*args).float()).abs().max().item()
        info = ex.matmuls[0] if ex.matmuls else None
        print(f"{label:30s} " + "  ".join(f"{k} {v:7.1f} us" for k, v in row.items()) +
              f"  | bitwise {same}, max diff vs eager {err:.2e}; {info}", flush=True)


if __name__ == "__main__":
    main()
