"""Which attention op BERT-base's traced graph holds on the GPU (bf16, 8x512), with and without brrr's table."""
import torch
from torch._dynamo.backends.common import aot_autograd

from brrr.compile.backend import decomposition_table
from brrr.examples import bert_base


def show(tag):
    def compiler(gm, inputs):
        ops = {}
        for n in gm.graph.nodes:
            if n.op == "call_function" and ("attention" in str(n.target) or "bmm" in str(n.target)):
                ops[str(n.target)] = ops.get(str(n.target), 0) + 1
        print(tag, ops, flush=True)
        return gm
    return compiler


model, (ids,) = bert_base(device="cuda", dtype=torch.bfloat16)
print("attn impl:", getattr(model.config, "_attn_implementation", None))
for name, table in (("no-decomps", None), ("brrr-table", decomposition_table())):
    torch._dynamo.reset()
    be = aot_autograd(fw_compiler=show(f"{name} fw"), bw_compiler=show(f"{name} bw"),
                      inference_compiler=show(f"{name} inf"), decompositions=table)
    with torch.no_grad():
        torch.compile(model, backend=be)(ids)
