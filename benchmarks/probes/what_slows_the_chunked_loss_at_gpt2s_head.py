"""What makes brrr's chunked linear + cross-entropy slower than brrr's unfused head at GPT-2's head, and how
much accuracy its bf16 weight-gradient accumulation loses?

    PYTHONPATH=$PWD python3 benchmarks/probes/what_slows_the_chunked_loss_at_gpt2s_head.py

Prediction: the input-gradient matmul of a 2048-row chunk ([2048 x 50257] @ [50257 x 768]) has 48-96 output
tiles for 132 SMs and runs at a third of the whole matmul's rate; the weight gradient accumulated over four
chunks in bf16 has ~2x the error of one bf16 rounding, and an fp32 accumulator (addmm with out_dtype) costs
< 0.3 ms.
"""

import torch
from triton.testing import do_bench

from brrr.compile import linear_cross_entropy_op as lce

torch.manual_seed(0)
dev = "cuda"


def ms(fn):
    return do_bench(fn, warmup=10, rep=100)


def head(rows, hidden, vocab):
    x = (torch.randn(rows, hidden, device=dev) * 0.5).to(torch.bfloat16)
    w = (torch.randn(vocab, hidden, device=dev) * 0.02).to(torch.bfloat16)
    t = torch.randint(0, vocab, (rows,), device=dev)
    return x, w, t


def whole_op(x, w, t):
    return torch.ops.brrr.fused_linear_cross_entropy_with_grads(x, w, None, t, -100, "mean", 0.0, True, True,
                                                                 False, torch.float32)


def parts(x, w, t, chunk):
    rows, vocab = x.shape[0], w.shape[0]
    pad = (-vocab) % 8
    wt = torch.nn.functional.pad(w, (0, 0, 0, pad)).t()
    xc = x[:chunk]
    logits = (xc @ wt)[:, :vocab]
    loss = torch.empty(chunk, device=dev)
    lse = torch.empty(chunk, device=dev)
    scale = torch.ones(1, device=dev) / rows
    gx = torch.empty(chunk, x.shape[1], device=dev, dtype=x.dtype)
    gw = torch.zeros_like(w)
    gw32 = torch.zeros(w.shape, device=dev, dtype=torch.float32)
    out = {
        "logits mm": ms(lambda: xc @ wt),
        "rows fwd": ms(lambda: lce._rows_forward(logits, t[:chunk], loss, lse, -100, 0.0)),
        "rows bwd": ms(lambda: lce._rows_backward(logits, t[:chunk], lse, scale, -100, 0.0)),
        "gx mm": ms(lambda: torch.mm(logits, w, out=gx)),
        "gx mm (padded K)": ms(lambda: torch.mm((xc @ wt), wt.t())),
        "gw addmm bf16": ms(lambda: gw.addmm_(logits.t(), xc)),
    }
    try:
        out["gw addmm fp32 out_dtype"] = ms(lambda: torch.addmm(gw32, logits.t(), xc, out_dtype=torch.float32,
                                                                out=gw32))
    except Exception as e:
        out["gw addmm fp32 out_dtype"] = f"{type(e).__name__}: {str(e)[:80]}"
    return {k: (v * rows / chunk if isinstance(v, float) else v) for k, v in out.items()}   # per whole head


def accuracy(x, w, t, chunk):
    """Relative error of the weight gradient against float64: one bf16 matmul, chunks summed in bf16, in fp32."""
    rows, vocab = x.shape[0], w.shape[0]
    ref_logits = x.double() @ w.double().t()
    g = torch.softmax(ref_logits, 1)
    g[torch.arange(rows, device=dev), t] -= 1
    g /= rows
    ref = g.t() @ x.double()
    gb = g.to(torch.bfloat16)
    one = (gb.t() @ x).double()
    acc16 = torch.zeros_like(w)
    acc32 = torch.zeros(w.shape, device=dev)
    for s in range(0, rows, chunk):
        acc16.addmm_(gb[s:s + chunk].t(), x[s:s + chunk])
        try:
            torch.addmm(acc32, gb[s:s + chunk].t(), x[s:s + chunk], out_dtype=torch.float32, out=acc32)
        except Exception:
            acc32 += (gb[s:s + chunk].t().float() @ x[s:s + chunk].float())
    err = lambda a: ((a.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    return {"one bf16 matmul": err(one), "chunks in bf16": err(acc16), "chunks in fp32": err(acc32),
            "fp32 rounded to bf16": err(acc32.to(torch.bfloat16))}


def main():
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for name, (rows, hidden, vocab) in {"GPT-2": (8192, 768, 50257), "Qwen2-0.5B": (4096, 896, 151936),
                                        "LLaMA": (8192, 1024, 32000)}.items():
        x, w, t = head(rows, hidden, vocab)
        print(f"\n== {name} head {rows} x {hidden} -> {vocab}; op's chunk "
              f"{lce.chunk_rows(rows, vocab, hidden, 2)} rows", flush=True)
        print(f"whole op: {ms(lambda: whole_op(x, w, t)):.3f} ms", flush=True)
        pad = (-vocab) % 8
        wt = torch.nn.functional.pad(w, (0, 0, 0, pad)).t()
        logits = x @ wt
        print(f"unfused matmuls: logits {ms(lambda: x @ wt):.3f}, gx {ms(lambda: logits @ wt.t()):.3f}, "
              f"gw {ms(lambda: logits.t() @ x):.3f} ms", flush=True)
        del logits
        for chunk in (1024, 2048, 4096, 8192):
            if chunk > rows:
                continue
            p = parts(x, w, t, chunk)
            print(f"chunk {chunk}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in p.items()), flush=True)
        if name == "GPT-2":
            for chunk in (2048, 8192):
                print(f"weight-gradient error vs float64, chunk {chunk}: "
                      + ", ".join(f"{k} {v:.2e}" for k, v in accuracy(x, w, t, chunk).items()), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
