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


class Messages(torch.nn.Module):
    """A graph attention layer's messages: node features gathered at each edge's source ([edges, heads,
    channels], far larger than the [nodes, heads * channels] table), weighted by a softmax over each destination's
    edges, and added into it. The features also feed the attention scores, whose sums go through a scatter
    before the gather: torch's rule against recomputing what is used on both sides of such an op saves it."""

    def __init__(self, nodes=8, edges=200, heads=2, channels=16):
        super().__init__()
        self.lin = torch.nn.Linear(channels, heads * channels)
        self.heads, self.channels, self.nodes = heads, channels, nodes
        g = torch.Generator().manual_seed(1)
        self.register_buffer("src", torch.randint(0, nodes, (edges,), generator=g))
        self.register_buffer("dst", torch.randint(0, nodes, (edges,), generator=g))
        self.att = torch.nn.Parameter(torch.randn(heads, channels, generator=g) * channels ** -0.5)

    def forward(self, x):
        h = self.lin(x).unflatten(1, (self.heads, self.channels))
        weight = (h * self.att).sum(-1)[self.src].exp()                                   # [edges, heads]
        total = weight.new_zeros(self.nodes, self.heads).index_add(0, self.dst, weight)
        m = h[self.src] * (weight / total[self.dst])[..., None]
        out = m.new_zeros(self.nodes, self.heads, self.channels).index_add(0, self.dst, m)
        return out.square().mean()


def saved_bytes_and_grads(recompute, make=None, x_shape=(32, 16), saved_shapes=None):
    """Bytes the forward graph returns beyond the loss (what it saves), and the gradients of one step; the shapes
    of the saved tensors appended to `saved_shapes`."""
    torch.manual_seed(0)
    model, x = (make or GeluMLP)(), torch.randn(*x_shape, requires_grad=True)
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
    tensors = [o.meta["val"] for o in outputs[1:]
               if isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor)]
    if saved_shapes is not None:
        saved_shapes.extend(tuple(t.shape) for t in tensors)
    return sum(t.numel() * t.element_size() for t in tensors), [p.grad for p in model.parameters()] + [x.grad]


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


@pytest.mark.parametrize("recompute", ["cheap", "pointwise"])
def test_a_gather_larger_than_its_table_is_recomputed_in_the_backward_not_saved(recompute):
    """h[src] ([200 edges, 2, 16]) outsizes h ([8, 2, 16]) and src together: the backward gathers it again from
    what it keeps anyway, and the gradients are eager's (float64)."""
    shapes = []
    saved, grads = saved_bytes_and_grads(recompute, Messages, (8, 16), shapes)
    assert (200, 2, 16) not in shapes, shapes
    torch.manual_seed(0)
    model, x = Messages().double(), torch.randn(8, 16, requires_grad=True)
    model(x.double()).backward()
    eager = [p.grad for p in model.parameters()] + [x.grad]
    for mine, theirs in zip(grads, eager):
        torch.testing.assert_close(mine.double(), theirs.double(), rtol=1e-4, atol=1e-6)


class GatheredMatmul(torch.nn.Module):
    """Rows of a small table gathered ([200, 16] from [8, 16]) into a matmul, whose weight gradient reads them."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 24, bias=False)
        self.register_buffer("rows", torch.randint(0, 8, (200,), generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return self.proj(torch.tanh(x)[self.rows]).square().mean()


def test_a_gather_a_matmul_reads_stays_saved_unless_recompute_is_pointwise():
    """The matmul's weight gradient needs the gathered rows in memory: recomputed, the backward would write them
    again, which "cheap" never has it do."""
    cheap, pointwise = [], []
    saved_bytes_and_grads("cheap", GatheredMatmul, (8, 16), cheap)
    saved_bytes_and_grads("pointwise", GatheredMatmul, (8, 16), pointwise)
    assert (200, 16) in cheap, cheap
    assert (200, 16) not in pointwise, pointwise
