"""What a training call holds for its backward, counted on fake tensors (runtime/held_for_backward.py): saved
storages and outputs count once each, inputs' storages not at all, and nothing real runs."""

import torch

from brrr.compile.runtime.held_for_backward import graph_constants, held_bytes


def test_saved_and_output_storages_count_once_and_inputs_not_at_all():
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    # mm saves x and w (inputs); relu saves its result, which is also the output: one [4, 16] fp32 storage
    assert held_bytes(lambda x, w: (x @ w).relu(), [x, w]) == 4 * 16 * 4
    # sin saves the matmul's result, and returns a second storage; a view of the output adds nothing
    assert held_bytes(lambda x, w: (x @ w).sin()[:, :8], [x, w]) == 2 * 4 * 16 * 4
    # without grad nothing is saved: only the output is held
    assert held_bytes(lambda x, w: (x @ w).sin(), [x.detach(), w.detach()]) == 4 * 16 * 4


def test_attributes_of_a_graph_count_as_inputs():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("s", torch.randn(16))

        def forward(self, x):
            return x * self.s

    gm = torch.fx.symbolic_trace(Scale())
    x = torch.randn(4, 16, requires_grad=True)
    constants = graph_constants(gm.forward)
    assert len(constants) == 1 and constants[0] is gm.s
    # mul saves the buffer (held anyway) for x's gradient; only the output is new
    assert held_bytes(gm.forward, [x], constants) == 4 * 16 * 4


def test_counting_draws_no_random_numbers_and_unknown_is_none(monkeypatch):
    monkeypatch.setenv("BRRR_DEBUG", "0")
    x = torch.randn(64, 64, requires_grad=True)
    state = torch.get_rng_state()
    assert held_bytes(lambda x: torch.nn.functional.dropout(x, 0.5, training=True), [x]) > 0
    assert torch.equal(state, torch.get_rng_state())
    assert held_bytes(lambda x: x[x > 0].sum(), [x]) is None   # a data-dependent size: unknown
