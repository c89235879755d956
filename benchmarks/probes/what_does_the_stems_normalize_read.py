"""Probe: which layout does the ResNet-18 stem's batch-norm normalize kernel read on the GPU (the conv output's
strides), and how long does each of brrr's kernels take there?"""
import os, sys, torch
sys.path[:0] = ["benchmarks/acceptance", "benchmarks/sweep"]
import floor_models
from brrr.compile.explain import explain
from brrr.compile.passes import layouts

model = floor_models.Stem(64).cuda().train()
x = torch.randn(128, 3, 224, 224, device="cuda")
ex = explain(model, x, train=True)
print(layouts.DECISIONS)
out = os.environ.get("OUT", "/tmp")
for k in ex.kernels:
    print(k.name)
with open(os.path.join(out, "stem-kernels.py"), "w") as f:
    f.write(ex.source())
conv_out = torch.nn.functional.conv2d(x.to(memory_format=torch.channels_last), model.conv.weight.to(memory_format=torch.channels_last), stride=2, padding=3)
print("eager channels_last conv output strides", conv_out.stride())

import brrr
from torch.profiler import profile, ProfilerActivity
torch._dynamo.reset()
step_model = brrr.compile(model)
for _ in range(3):
    step_model(x).sum().backward()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        step_model(x).sum().backward()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
