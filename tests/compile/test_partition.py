"""What a training forward saves for its backward (partition.py): `recompute="pointwise"` saves fewer bytes
than the default and computes the same gradients as eager."""

import pytest
import torch
import torch.nn.functional as F

import brrr
from brrr.compile.runtime import compiled as runtime


class GeluMLP(torch.nn.Module):
    """GPT-2's MLP: the GELU output is the down-projection's input, which its weight gradient reads again."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh")).square().mean()


def saved_bytes_and_grads(recompute):
    """Bytes the forward graph returns beyond the loss (what it saves), and the gradients of one step."""
    torch.manual_seed(0)
    model, x = GeluMLP(), torch.randn(32, 16, requires_grad=True)
    built = []
    real = runtime.build

    def spy(plan, gm, cuda_graphs=False, **kw):
        built.append((kw.get("kind"), gm))
        return real(plan, gm, cuda_graphs, **kw)
    runtime.build = spy
    try:
        torch._dynamo.reset()
        brrr.compile(model, recompute=recompute)(x).backward()
    finally:
        runtime.build = real
    forward = next(gm for kind, gm in built if kind == "forward")
    outputs = next(n for n in forward.graph.nodes if n.op == "output").args[0]
    saved = sum(o.meta["val"].numel() * o.meta["val"].element_size() for o in outputs[1:]
                if isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor))
    return saved, [p.grad for p in model.parameters()] + [x.grad]


def test_pointwise_recompute_saves_fewer_bytes_and_the_same_gradients():
    torch.manual_seed(0)
    model, x = GeluMLP(), torch.randn(32, 16, requires_grad=True)
    model(x).backward()
    eager = [p.grad for p in model.parameters()] + [x.grad]
    cheap, cheap_grads = saved_bytes_and_grads("cheap")
    pointwise, pointwise_grads = saved_bytes_and_grads("pointwise")
    # the GELU output ([32, 64] fp32) is recomputed in the backward instead of saved
    assert cheap - pointwise >= 32 * 64 * 4
    for grads in (cheap_grads, pointwise_grads):
        for mine, theirs in zip(grads, eager):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_an_unknown_recompute_choice_is_refused():
    with pytest.raises(ValueError, match="recompute"):
        brrr.compile(GeluMLP(), recompute="everything")
