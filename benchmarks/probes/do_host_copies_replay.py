"""Probe: do graphs with host-to-device copies and expanded inputs now capture and replay on a GPU, equal to eager?
And does the floor measure a fused slow kernel on a real GPU? Prints replay and floor decisions."""

import torch
import torch.nn.functional as F

from brrr.compile.backend import brrr_backend
from brrr.compile.runtime import captured_choice, floor, replay_choice


def host_arg(x, scale):
    return torch.relu(x * scale.to(x.device)) + 1


def host_const(x):
    return x + torch.tensor([1.0, 2.0, 3.0, 4.0]).to(x.device)


def expanded(x, mask):
    return torch.softmax(x.masked_fill(mask, -1e4), -1)


def bn_relu(x, bn):
    return F.relu(bn(x))


def run(name, fn, make_args, steps=40, train=False):
    torch._dynamo.reset()
    before = len(replay_choice.DECISIONS)
    c = torch.compile(fn, backend=brrr_backend)
    worst = 0.0
    for _ in range(steps):
        args = make_args()
        out, ref = c(*args), fn(*args)
        if train:
            out.sum().backward()
        worst = max(worst, (out.float() - ref.float()).abs().max().item())
    print(f"{name}: max |brrr - eager| {worst:.3g}")
    for d in replay_choice.DECISIONS[before:]:
        print(f"   replay: {d}")


dev = "cuda"
x = torch.randn(64, 4, device=dev)
run("host argument", host_arg, lambda: (torch.randn(64, 4, device=dev), torch.randn(4)))
run("host constant", host_const, lambda: (torch.randn(64, 4, device=dev),))
m = torch.rand(1, 1, 128) > 0.5
run("expanded mask", expanded, lambda: (torch.randn(8, 16, 128, device=dev),
                                        (torch.rand(1, 1, 128, device=dev) > 0.5).expand(8, 16, 128)))
bn = torch.nn.BatchNorm2d(64).to(dev)
xb = torch.randn(128, 64, 112, 112, device=dev, requires_grad=True)
torch._dynamo.reset()
c = torch.compile(bn_relu, backend=brrr_backend)
for _ in range(3):
    c(xb, bn).sum().backward()
for v in floor.DECISIONS:
    if v.tried or v.fraction < floor.THRESHOLD:
        print(f"   floor: {v}")
for d in captured_choice.DECISIONS:
    print(f"   captured: {d}")
