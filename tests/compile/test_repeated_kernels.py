"""Kernels of one source in a graph (a repeated layer's) launch one Triton function: it is compiled and loaded
once, profiles and the analyzer see it under one name, and each launch keeps its own arguments and checks."""

import torch
from torch import nn

from brrr.compile.runtime import compiled as compiled_module, kernel_registry
from tests.compile.helpers import compiled


class Layers(nn.Module):
    """Three identical blocks (linear, layer norm, GELU): their norm kernels share a source."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU()) for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_a_repeated_layers_kernels_launch_one_function_compiled_once(monkeypatch):
    assembled = []
    assemble = compiled_module.assemble

    def spy(source, constants, specs, *args, **kwargs):
        graph = assemble(source, constants, specs, *args, **kwargs)
        assembled.append((specs, graph))
        return graph
    monkeypatch.setattr(compiled_module, "assemble", spy)
    torch.manual_seed(0)
    model, x = Layers(), torch.randn(4, 32, requires_grad=True)
    torch._dynamo.reset()
    out = compiled(model)(x)
    out.sum().backward()
    ref_model = Layers()
    ref_model.load_state_dict(model.state_dict())
    x_ref = x.detach().clone().requires_grad_()
    ref = ref_model(x_ref)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    for specs, graph in assembled:
        functions = {s.function for s in specs}
        assert len(functions) < len(specs)                       # some launches share a function
        assert len({s.name for s in specs}) == len(specs)        # each launch is its own in the call
        for f in functions:
            sources = {s.source for s in specs if s.function == f}
            assert len(sources) == 1 and f"def {f}(" in sources.pop()
            assert kernel_registry.lookup(f) is not None         # the analyzer finds it by its profiled name
            launchers = [graph.call.__globals__[s.name] for s in specs if s.function == f]
            assert len({id(k.jit_fn) for k in launchers}) == 1       # one Triton function: compiled once
            assert {k.name for k in launchers} == {f}
