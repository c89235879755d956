"""The kernels a step spends its device time in: `torch.profiler` over a few calls, summed by kernel name."""

import torch


def top_kernels(call, device, calls=3, count=8):
    """[{name, device_ms (per call), share}] of the `count` kernels with the most device time over `calls`
    calls of `call`; [] off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize(device)
    totals = {}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = getattr(event, "self_cuda_time_total", 0)
        if us and us > 0:
            totals[event.key] = totals.get(event.key, 0.0) + us
    whole = sum(totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:count]
    return [{"name": name, "device_ms": us / 1e3 / calls, "share": us / whole} for name, us in ranked]
