"""Which attention op ends up in the graph brrr compiles (GPU, bf16), beside aot_eager's."""
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd

from brrr.compile.backend import brrr_backend, decomposition_table


def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def show(tag):
    def compiler(gm, inputs):
        ops = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        print(tag, [o for o in ops if "attention" in o or "bmm" in o])
        return gm
    return compiler


q, k, v = (torch.randn(8, 12, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for grad in (False, True):
    for t in (q, k, v):
        t.requires_grad_(grad)
    for name, decomps in (("no-decomps", None), ("brrr-table", decomposition_table())):
        torch._dynamo.reset()
        be = aot_autograd(fw_compiler=show(f"grad={grad} {name} fw"), bw_compiler=show(f"grad={grad} {name} bw"),
                          inference_compiler=show(f"grad={grad} {name} inf"), decompositions=decomps)
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            torch.compile(attention, backend=be)(q, k, v)
