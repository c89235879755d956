import time, torch, sys
import brrr
from brrr.analyze.capture import OpTracer
from brrr.analyze.timing import profiled
from torch._dynamo.utils import counters
act = torch.compile(torch.nn.GELU())
x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
dev = torch.device("cuda")
def frames(): return dict(counters["frames"]), dict(counters["stats"])
def timed(label, fn):
    torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
    print(f"{label}: {(time.perf_counter()-t)*1e3:.2f} ms", frames(), flush=True)
def traced():
    with profiled(dev):
        with OpTracer(None, record_costs=False, mark_ranges=True):
            act(x)
def traced_noprof():
    with OpTracer(None, record_costs=False, mark_ranges=True):
        act(x)
def prof_only():
    with profiled(dev):
        act(x)
order = sys.argv[1]
for step in order.split(","):
    timed(step, {"T": traced, "M": traced_noprof, "P": prof_only, "W": lambda: act(x)}[step])
