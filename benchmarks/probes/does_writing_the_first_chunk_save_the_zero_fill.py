"""Does writing the weight-gradient sum with its first chunk (beta = 0) save the loss op its zero fill?

The training op used to zero a [vocab, hidden] fp32 sum (147 MiB at GPT-2's head, ~50 us at 3 TB/s) and add
every chunk's product into it; now the first chunk's product is written over uninitialized memory. Both ways are
timed in one process, alternating, from CUDA graphs of 10 calls (median per call over 7 rounds each).
"""

import statistics
import sys

import torch

import brrr.compile.linear_cross_entropy_op as op

HEADS = {"gpt2": (8184, 768, 50257), "llama": (8184, 1024, 32000), "qwen2": (4092, 896, 151936),
         "bert-mlm": (8192, 768, 30522)}


def zero_filled(monkeypatch_target):
    made, accumulate = op._gradient_buffers, op._accumulate

    def buffers(*args):
        gx, gw, gb = made(*args)
        if gw.numel() and args[1].several:
            gw.zero_()
        return gx, gw, gb
    return {"_gradient_buffers": buffers, "_accumulate": lambda acc, a, b, first: accumulate(acc, a, b, False)}


def graph_of(call, calls=10):
    call()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            call()
    return g, calls


def replay_us(graph):
    g, calls = graph
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def main():
    print(torch.cuda.get_device_name(), torch.__version__, file=sys.stderr)
    for name, (rows, hidden, vocab) in HEADS.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
        w = (torch.randn(vocab, hidden, device="cuda", generator=g) * 0.02).bfloat16()
        t = torch.randint(0, vocab, (rows,), device="cuda", generator=g)

        def call():
            return torch.ops.brrr.fused_linear_cross_entropy_with_grads(
                x, w, None, t, -100, "mean", 0.0, True, True, False, torch.float32)
        written = graph_of(call)
        want = call()
        saved = {k: getattr(op, k) for k in ("_gradient_buffers", "_accumulate")}
        for k, v in zero_filled(op).items():
            setattr(op, k, v)
        try:
            zeroed = graph_of(call)
            got = call()
        finally:
            for k, v in saved.items():
                setattr(op, k, v)
        same = all(torch.equal(a, b) for a, b in zip(want, got))
        times = {"zero-filled": [], "first chunk writes": []}
        for _ in range(7):
            times["zero-filled"].append(replay_us(zeroed))
            times["first chunk writes"].append(replay_us(written))
        print(f"{name:9s} " + "  ".join(f"{k} {statistics.median(v):8.1f} us" for k, v in times.items()) +
              f"  | same results {same}", flush=True)
        del written, zeroed


if __name__ == "__main__":
    main()
