"""CUDA-graph replay logic (runtime/cuda_graphs.py) on the CPU, with a stand-in graph whose replay reruns the
captured call into the same output tensors (conftest.fake_cuda_graphs): what is copied, what is lent, and when a
loan gets its own copies."""

import torch

from brrr.compile.runtime import cuda_graphs as graphs
from brrr.compile.runtime.cuda_graphs import GraphedCall, Loan


def double_and_sum(args):
    x, w = args
    y = x * w
    return y * 2, y.sum(0)


def test_unmoved_inputs_read_in_place_others_copied_outputs_copied(fake_cuda_graphs):
    w = torch.randn(4)
    x1, x2 = torch.randn(3, 4), torch.randn(3, 4)
    g = GraphedCall(double_and_sum, [x1, w])
    out = g([x2, w])
    assert g.slots == ["copy", "address"]
    torch.testing.assert_close(out[0], x2 * w * 2)
    again = g([x1, w])
    torch.testing.assert_close(out[0], x2 * w * 2)   # the first result was a copy: not overwritten
    torch.testing.assert_close(again[0], x1 * w * 2)
    assert g([x1, torch.randn(4)]) is None           # a moved "address" input: no replay
    assert g.refusals == 1 and g.failure.startswith("input 1 ((4,)), read in place")   # the trial's reason


def test_an_activation_at_one_address_for_two_calls_still_replays_once_it_moves(fake_cuda_graphs):
    """The previous piece's output (DDP's graph pieces) can land at the same address twice, then elsewhere:
    with the parameters known (static), it is copied in, and the graph keeps replaying."""
    w = torch.randn(4)
    x1, x2 = torch.randn(3, 4), torch.randn(3, 4)
    g = GraphedCall(double_and_sum, [x1, w], static=(1,))
    out = g([x1, w])                                  # the same address as the first call
    assert g.slots == ["copy", "address"]
    moved = g([x2, w])
    assert moved is not None and g.refusals == 0
    torch.testing.assert_close(out[0], x1 * w * 2)
    torch.testing.assert_close(moved[0], x2 * w * 2)
    unknown = GraphedCall(double_and_sum, [x1, w])    # without static positions: read in place, then refused
    unknown([x1, w])
    assert unknown.slots == ["address", "address"] and unknown([x2, w]) is None


def test_lent_outputs_are_the_graphs_memory_and_pending_loans_get_copies(fake_cuda_graphs):
    w = torch.randn(4)
    x0, x1, x2, x3 = (torch.randn(3, 4) for _ in range(4))
    g = GraphedCall(double_and_sum, [x0, w], lend=(1,))
    out = g([x1, w])
    # the capture call lends the real tensor; the graph keeps an alias of its memory, which later replays lend
    assert out[1].data_ptr() == g.static_out[1].data_ptr() and out[1] is not g.static_out[1]
    assert out[0].data_ptr() != g.static_out[0].data_ptr()
    pending, done = torch.empty(0), torch.empty(0)   # markers: held by a backward's saved state
    loan = Loan([out[1]], pending)
    g.track(loan)
    g([x2, w])                                        # overwrites the graph's memory...
    assert loan.copied                                 # ...after copying what the pending backward needs
    torch.testing.assert_close(loan.tensors[0], (x1 * w).sum(0))
    second = Loan([g.static_out[1]], done)
    g.track(second)
    del done                                           # its backward ran: nothing to keep
    g([x3, w])
    assert not second.copied
    torch.testing.assert_close(g.static_out[1], (x3 * w).sum(0))


def test_a_loan_whose_backward_freed_its_saved_tensors_is_not_copied():
    """The marker is what autograd frees: after a backward without retain_graph the weak reference is dead; with
    retain_graph it lives until the last backward."""
    class Saves(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            marker = torch.empty(0)
            ctx.loan = Loan([x * 2], marker)
            ctx.save_for_backward(marker)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = torch.randn(3, requires_grad=True)
    y = Saves.apply(x)
    loan = y.grad_fn.loan
    y.sum().backward(retain_graph=True)
    assert loan.marker() is not None   # a second backward may still read the tensors
    y.sum().backward()
    loan.settle()
    assert loan.marker() is None and not loan.copied


def test_pinned_inputs_are_read_in_place_only_while_lent(fake_cuda_graphs):
    saved, grad = torch.randn(3, 4), torch.randn(3, 4)
    g = GraphedCall(lambda a: (a[0] * a[1],), [torch.randn(3, 4), grad], pin=(0,))
    g.pinned_ready = False
    assert g([saved, grad]) is None and g.graph is None   # not lent memory: no capture
    g.pinned_ready = True
    out = g([saved, grad])
    assert g.slots == ["address", "address"]
    torch.testing.assert_close(out[0], saved * grad)
    assert graphs.MAX_REFUSALS > 1


def project_and_save_transpose(args):
    x, w = args
    wt = w.t()
    return x @ wt, wt   # the transpose is saved for a backward: a view of the input, not the graph's memory


def _same_storage(a, b):
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def test_an_output_viewing_an_input_read_in_place_is_a_view_of_this_calls_input(fake_cuda_graphs):
    """FSDP2 frees a block's gathered parameters after its forward and gathers the next block's into the same
    memory: the same address, another tensor. A replay must return views of the tensor it was given, and a
    loan must not copy them (the caller's memory, which may be freed by then)."""
    w1 = torch.randn(4, 5)
    x0, x1, x2, x3 = (torch.randn(3, 5) for _ in range(4))
    g = GraphedCall(project_and_save_transpose, [x0, w1], lend=(1,))
    out = g([x1, w1])
    assert g.slots == ["copy", "address"] and g.views == {1: 1}
    w2 = torch.from_numpy(w1.numpy())   # another tensor (and storage) at w1's address
    assert w2.data_ptr() == w1.data_ptr() and not _same_storage(w1, w2)
    out = g([x2, w2])
    assert _same_storage(out[1], w2) and out[1].stride() == (1, 5)
    torch.testing.assert_close(out[0], x2 @ w2.t())
    pending = torch.empty(0)
    loan = Loan([out[1]], pending)
    g.track(loan)
    assert loan.callers == {0}
    g([x3, w2])
    assert loan.tensors[0] is out[1]   # not copied: it is w2's memory, which the backward reads


def test_given_outputs_are_the_graphs_memory_and_a_held_one_stops_the_next_replay(fake_cuda_graphs):
    """A backward's gradients are given out, not copied: no gradient held twice. A replay that would overwrite
    one the caller still holds launches instead (None here), and the graph copies its outputs from then on."""
    w = torch.randn(4)
    x0, x1, x2, x3, x4 = (torch.randn(3, 4) for _ in range(5))
    g = GraphedCall(double_and_sum, [x0, w], give=True)
    for x in (x1, x2):                                 # nothing kept between calls: each replays and gives
        out = g([x, w])
        assert _same_storage(out[0], g.static_out[0]) and out[0] is not g.static_out[0]
        torch.testing.assert_close(out[0], x * w * 2)
        del out
    kept = g([x3, w])[1]
    assert g([x4, w]) is None and not g.give and g.refusals == 0   # kept: this call must launch
    torch.testing.assert_close(kept, (x3 * w).sum(0))
    del kept
    again = g([x4, w])                                 # released: replays, now copying out
    assert again is not None and not _same_storage(again[0], g.static_out[0])
    torch.testing.assert_close(again[0], x4 * w * 2)


def test_a_forward_does_not_replay_over_gradients_its_backward_gave_out(fake_cuda_graphs):
    """A backward captures into its forward's pool, so the forward's replay may overwrite the backward's
    outputs: it checks them too, and the backward copies its outputs from then on."""
    w = torch.randn(4)
    x0, x1, x2, x3 = (torch.randn(3, 4) for _ in range(4))
    fw = GraphedCall(double_and_sum, [x0, w])
    fw([x1, w])
    bw = GraphedCall(lambda a: (a[0] * 3,), [x0], after=fw, give=True)
    grad = bw([x1])[0]
    assert len(fw.sharers) == 1 and fw([x2, w]) is None
    del grad
    assert fw([x3, w]) is not None and not bw.give


def test_a_forward_and_its_backward_hold_the_saved_tensors_once(fake_cuda_graphs):
    """One pool per step: the backward captures into its forward's pool and consumes the saved tensors (freed at
    their last use, their memory then the pool's to hand out), and neither graph keeps them: the forward holds
    aliases of their memory (storages that free nothing), the loan hands them over. Counted by storage: once
    the stand-in graph lets go of what its capture made (a real pool owns it), nothing holds them."""
    import gc

    w = torch.randn(4)

    def forward(args):
        x, w = args
        h = x * w
        return h.sum(), h.exp(), h * 3      # the output, then two saved tensors

    def backward(args, owned=False):
        e, h3, g = args
        if owned:
            args.clear()
        return (e * h3 * g,)

    x0 = torch.randn(3, 4)
    fw = GraphedCall(forward, [x0, w], lend=(1, 2), static=(1,))
    bw = GraphedCall(backward, [torch.randn(3, 4), torch.randn(3, 4), torch.ones(3, 4)], pin=(0, 1), after=fw,
                     static=(), consume=True)   # no parameters: the gradient's seed is copied in
    for step in range(3):
        x = torch.randn(3, 4)
        out = fw([x, w])
        loan = Loan(out[1:], torch.empty(0))
        args = loan.take() + [torch.ones(3, 4)]
        del out
        result = bw(args)
        assert result is not None, bw.failure
        (grad,) = result
        torch.testing.assert_close(grad, (x * w).exp() * x * w * 3)
        assert loan.tensors == []
        if step == 0:   # the capture: handed over, each freed at its last use (a replay reads aliases)
            assert args == []
            lent = fw.lent_at_capture
            assert len(lent) == 2 and fw.lent_ptrs == {s.data_ptr() for s in fw.static_out[1:]}
    own = {id(t.untyped_storage()) for g in (fw, bw) for t in (*g.static, *g.static_out) if t is not None}
    del fw.graph.outputs, bw.graph.args, own   # the stand-in graph's references: a real pool's memory
    gc.collect()
    assert all(ref.expired() for ref in lent)   # nothing of brrr's held the saved tensors' storages
    assert bw.graph.captured_into == fw.graph.pool()


def test_an_output_in_a_consumed_inputs_memory_is_not_a_view_of_it():
    """A consuming capture frees a saved tensor at its last use and the pool may hand its memory to a gradient:
    same address, another tensor (a larger one crashed rebuilding it as a view on ResNet-18's backward)."""
    memory = torch.zeros(16)
    saved, grad = memory[:4], memory.view(4, 4)   # the gradient now sits where the saved tensor was
    param = torch.randn(3)
    assert graphs.input_views([saved, param], [grad, param[:2]], ["consumed", "address"]) == {1: 1}
    assert graphs.input_views([saved, param], [grad, param[:2]], ["address", "address"]) == {0: 0, 1: 1}


def test_a_backward_whose_forward_has_no_pool_consumes_nothing(fake_cuda_graphs):
    """Freed into a pool of its own or the device's, a saved tensor's memory could be handed out before the
    capture call's replay reads it: a backward consumes only into its forward's pool."""
    def backward(args, owned=False):
        e, g = args
        if owned:
            args.clear()
        return (e * g,)

    fw = GraphedCall(lambda a: (a[0] * 2,), [torch.randn(3)], lend=(0,))   # never captured: no pool
    bw = GraphedCall(backward, [torch.randn(3), torch.ones(3)], pin=(0,), after=fw, static=(), consume=True)
    saved, grad = torch.randn(3), torch.ones(3)
    args = [saved, grad]
    (out,) = bw(args)
    torch.testing.assert_close(out, saved)
    assert not bw.consume and args == [saved, grad] and bw.static[0] is saved   # held, as before
