"""Session-2 GPU probe: (A) why BERT-base's traced graph holds math attention, (B) where the seed MLP bf16
inference loses to Inductor, (C) where the host time of a compiled MLP train step goes."""
import cProfile
import pstats
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
import triton

from brrr.compile.backend import brrr_backend
from brrr.examples import bert_base, mlp

part = sys.argv[1] if len(sys.argv) > 1 else "ABC"
print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)


def meta(v):
    if isinstance(v, torch.Tensor):
        return f"T{tuple(v.shape)} s{tuple(v.stride())} {v.dtype} rg={v.requires_grad}"
    return repr(v)


if "A" in part:
    model, (ids,) = bert_base(device="cuda", dtype=torch.bfloat16)
    print("attn impl", getattr(model.config, "_attn_implementation", None))
    calls = []

    def grab(gm, inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function" and "scaled_dot_product" in str(n.target):
                ev = lambda a: a.meta.get("example_value") if hasattr(a, "meta") else a
                calls.append(([ev(a) for a in n.args], {k: ev(v) for k, v in n.kwargs.items()}))
        return gm

    for grad in (False, True):
        calls.clear()
        torch._dynamo.reset()
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            torch.compile(model, backend=grab)(ids)
        print(f"grad={grad}: {len(calls)} sdpa calls")
        if calls:
            args, kwargs = calls[0]
            print("  args", [meta(a) for a in args])
            print("  kwargs", {k: meta(v) for k, v in kwargs.items()})
            real = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="cuda").normal_()
                    .requires_grad_(grad and a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                    for a in args]
            rk = {k: (torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda").zero_()
                      if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
            q, k, v = real[:3]
            mask = real[3] if len(real) > 3 else rk.get("attn_mask")
            try:
                choice = torch._fused_sdp_choice(q, k, v, mask, rk.get("dropout_p", 0.0), rk.get("is_causal", False),
                                                 scale=rk.get("scale"))
                print("  real _fused_sdp_choice", choice)
            except Exception as e:
                print("  choice failed", e)
            try:
                params = torch.backends.cuda.SDPAParams(q, k, v, mask, rk.get("dropout_p", 0.0),
                                                       rk.get("is_causal", False), False)
                print("  can_use_flash", torch.backends.cuda.can_use_flash_attention(params, True))
                print("  can_use_efficient", torch.backends.cuda.can_use_efficient_attention(params, True))
            except Exception as e:
                print("  SDPAParams failed", e)
            from torch._subclasses.fake_tensor import FakeTensorMode
            with FakeTensorMode() as fm:
                fq, fk, fv = (fm.from_tensor(t) for t in (q, k, v))
                fmask = fm.from_tensor(mask) if isinstance(mask, torch.Tensor) else mask
                try:
                    print("  fake _fused_sdp_choice", torch._fused_sdp_choice(fq, fk, fv, fmask, 0.0, False,
                                                                           scale=rk.get("scale")))
                except Exception as e:
                    print("  fake choice failed", e)
    from torch._dynamo.backends.common import aot_autograd

    def show(tag):
        def compiler(gm, inputs):
            ops = {}
            for n in gm.graph.nodes:
                if n.op == "call_function" and any(s in str(n.target) for s in ("attention", "bmm", "_softmax", "amax")):
                    ops[str(n.target)] = ops.get(str(n.target), 0) + 1
            print(" ", tag, ops, flush=True)
            return gm
        return compiler
    for grad in (False, True):
        torch._dynamo.reset()
        be = aot_autograd(fw_compiler=show(f"grad={grad} fw"), bw_compiler=show(f"grad={grad} bw"),
                          inference_compiler=show(f"grad={grad} inf"))
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            out = torch.compile(model, backend=be)(ids)
            if grad:
                out.last_hidden_state.float().sum().backward()
    del model

if "B" in part:
    model, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
    torch._dynamo.reset()
    fns = {"eager": model, "inductor": torch.compile(model, backend="inductor"),
           "brrr": torch.compile(model, backend=brrr_backend)}
    with torch.no_grad():
        for name, fn in fns.items():
            for _ in range(3):
                fn(x)
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(lambda: fn(x), warmup=50, rep=300)
            t0 = time.perf_counter()
            for _ in range(200):
                fn(x)
            host = (time.perf_counter() - t0) / 200
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn(x)
            gms = triton.testing.do_bench(lambda: g.replay(), warmup=50, rep=300)
            print(f"B {name}: do_bench {ms*1e3:.1f} us, host/call {host*1e6:.1f} us, graph replay {gms*1e3:.1f} us")
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn(x)
                torch.cuda.synchronize()
            for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]:
                print(f"   {e.key[:90]:90s} n={e.count} avg {e.device_time_total/e.count:.1f} us")

if "C" in part:
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func
    model, (x,) = mlp(device="cuda", dtype=torch.bfloat16, batch=16384)
    params = list(model.parameters())
    cot = torch.randn_like(x)
    for name, be in (("eager", None), ("aot_eager", "aot_eager"), ("brrr", brrr_backend)):
        torch._dynamo.reset()
        fn = model if be is None else torch.compile(model, backend=be)

        def step():
            for p in params:
                p.grad = None
            out = fn(x)
            torch.autograd.backward([out], [cot])
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(step, warmup=50, rep=300)
        t0 = time.perf_counter()
        for _ in range(100):
            step()
        host = (time.perf_counter() - t0) / 100
        torch.cuda.synchronize()
        print(f"C {name}: do_bench {ms*1e3:.1f} us, host/step {host*1e6:.1f} us", flush=True)
        if name != "eager":
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(100):
                step()
            pr.disable()
            torch.cuda.synchronize()
            pstats.Stats(pr).sort_stats("tottime").print_stats(22)
