"""First look at the GPU machine: versions, ceilings, and the profiler fields brrr's timing relies on."""
import json, os, sys, time
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "python", sys.version.split()[0])
print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))
from triton.testing import do_bench
import inspect; print("do_bench", inspect.signature(do_bench))
from brrr.cost.device import get_ceilings, print_ceilings
from rich.console import Console
t = time.time(); c = get_ceilings("cuda", refresh=True); print("ceilings took", time.time() - t)
print_ceilings(c, Console(width=120))
json.dump(c.to_dict(), open(os.path.join(os.environ.get("OUT", "."), "ceilings.json"), "w"), indent=2)
# profiler fields
from torch.profiler import profile, ProfilerActivity, record_function
x = torch.randn(1024, 1024, device="cuda")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    with record_function("brrr#0"):
        y = (x @ x).relu()
    torch.cuda.synchronize()
for e in prof.events()[:12]:
    attrs = {a: getattr(e, a, None) for a in ("name", "device_type", "device_time_total", "cuda_time_total", "self_device_time_total", "cpu_time_total", "time_range")}
    print({k: (str(v)[:60]) for k, v in attrs.items()}, [k.name for k in getattr(e, "kernels", [])][:3])
import torch.utils.module_tracker as mt; print("module_tracker ok")
from torch.distributed._tools.mod_tracker import ModTracker; print("ModTracker ok")
print("has Tag.reduction", hasattr(torch.Tag, "reduction"))
