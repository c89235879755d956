"""The cost model against FlopCounterMode (FLOPs) and hand counts (bytes)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from brrr.cost.ops import OpCost, cost_key, launches_no_kernel, nbytes_touched, op_bytes, op_class, op_cost, op_flops

aten = torch.ops.aten


class Recorder(TorchDispatchMode):
    """Every op with its cost, as the analyzer will see it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls.append((func, op_cost(func, args, kwargs, out)))
        return out


def recorded(fn):
    with Recorder() as rec:
        fn()
    return rec.calls


def flop_counter_total(fn):
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("name,fn", [
    ("mm", lambda: torch.mm(torch.randn(7, 5), torch.randn(5, 3))),
    ("addmm", lambda: torch.addmm(torch.randn(3), torch.randn(7, 5), torch.randn(5, 3))),
    ("bmm", lambda: torch.bmm(torch.randn(4, 7, 5), torch.randn(4, 5, 3))),
    ("conv", lambda: torch.nn.functional.conv2d(torch.randn(2, 3, 9, 9), torch.randn(8, 3, 3, 3), padding=1)),
])
def test_contraction_flops_equal_flop_counter(name, fn):
    torch.manual_seed(0)
    calls = recorded(fn)
    ours = sum(cost.flops for func, cost in calls if cost.op_class == "contraction")
    assert ours == flop_counter_total(fn) > 0


def test_mm_flops_formula():
    a, b = torch.randn(7, 5), torch.randn(5, 3)
    assert op_flops(aten.mm.default, (a, b), {}, a @ b) == 2 * 7 * 5 * 3


def test_add_bytes_hand_count():
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    read, written = op_bytes(aten.add.Tensor, (x, y), {}, x + y)
    assert (read, written) == (2 * 64 * 32 * 4, 64 * 32 * 4)


def test_broadcast_input_counts_unique_elements():
    x, bias = torch.randn(64, 32), torch.randn(32)
    read, written = op_bytes(aten.add.Tensor, (x, bias.expand(64, 32)), {}, x + bias)
    assert (read, written) == (64 * 32 * 4 + 32 * 4, 64 * 32 * 4)


def test_same_tensor_twice_is_read_once():
    x = torch.randn(10, dtype=torch.float16)
    assert op_bytes(aten.mul.Tensor, (x, x), {}, x * x) == (20, 20)


def test_softmax_bytes_and_class():
    x = torch.randn(16, 128)
    out = aten._softmax.default(x, -1, False)
    cost = op_cost(aten._softmax.default, (x, -1, False), {}, out)
    assert (cost.bytes_read, cost.bytes_written) == (16 * 128 * 4, 16 * 128 * 4)
    assert cost.op_class == "normalization" and cost.flops == 5 * 16 * 128


def test_layer_norm_bytes_hand_count():
    x, w, b = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    out = aten.native_layer_norm.default(x, [64], w, b, 1e-5)
    read, written = op_bytes(aten.native_layer_norm.default, (x, [64], w, b, 1e-5), {}, out)
    # x, weight and bias read; output (bf16) plus per-row mean and rstd (fp32 on CUDA, bf16 on CPU) written
    stat_size = out[1].element_size()
    assert read == 8 * 64 * 2 + 64 * 2 + 64 * 2
    assert written == 8 * 64 * 2 + 8 * stat_size + 8 * stat_size


def test_mm_bytes_hand_count():
    a, b = torch.randn(7, 5), torch.randn(5, 3)
    assert op_bytes(aten.mm.default, (a, b), {}, a @ b) == ((35 + 15) * 4, 21 * 4)


@pytest.mark.parametrize("func,args", [
    (aten.view.default, (torch.randn(4, 6), [24])),
    (aten.t.default, (torch.randn(4, 6),)),
    (aten.expand.default, (torch.randn(1, 6), [5, 6])),
    (aten.slice.Tensor, (torch.randn(4, 6), 1, 0, 3)),
    (aten._unsafe_view.default, (torch.randn(4, 6), [6, 4])),
])
def test_views_move_zero_bytes(func, args):
    out = func(*args)
    cost = op_cost(func, args, {}, out)
    assert cost == OpCost(0, 0, 0, "view")


def test_non_contiguous_input_counts_touched_region():
    base = torch.randn(64, 64)
    col = base[:, :8]  # a strided slice: 64*8 elements touched, not the whole storage
    read, written = op_bytes(aten.clone.default, (col,), {}, col.clone())
    assert (read, written) == (64 * 8 * 4, 64 * 8 * 4)


def test_copy_does_not_read_destination():
    dst, src = torch.empty(100), torch.randn(100)
    assert op_bytes(aten.copy_.default, (dst, src), {}, dst) == (400, 400)


def test_inplace_add_reads_and_writes_self():
    x, y = torch.randn(100), torch.randn(100)
    assert op_bytes(aten.add_.Tensor, (x, y), {}, x) == (800, 400)


def test_embedding_reads_only_fetched_rows():
    weight, idx = torch.randn(1000, 16), torch.tensor([1, 5, 7])
    out = torch.nn.functional.embedding(idx, weight)
    read, written = op_bytes(aten.embedding.default, (weight, idx), {}, out)
    assert written == 3 * 16 * 4 and read == 3 * 16 * 4 + 3 * 8


def test_zero_size_tensors_cost_nothing():
    x = torch.randn(0, 8)
    assert op_cost(aten.add.Tensor, (x, x), {}, x + x) == OpCost(0, 0, 0, "elementwise")
    assert nbytes_touched((0, 8), (8, 1), 4) == 0


def test_like_factories_read_nothing():
    x = torch.randn(50)
    assert op_bytes(aten.zeros_like.default, (x,), {}, torch.zeros_like(x)) == (0, 200)


@pytest.mark.parametrize("func,cls", [
    (aten.mm.default, "contraction"), (aten.convolution.default, "contraction"),
    (aten.native_layer_norm.default, "normalization"), (aten.sum.dim_IntList, "normalization"),
    (aten.gelu.default, "elementwise"), (aten.add.Tensor, "elementwise"), (aten.clone.default, "elementwise"),
    (aten.view.default, "view"), (aten.embedding.default, "other"),
])
def test_op_class(func, cls):
    assert op_class(func) == cls


def test_intensity():
    assert OpCost(100, 40, 10, "elementwise").intensity == 2.0
    assert OpCost(0, 0, 0, "view").intensity == float("inf")


def test_cost_key_tells_apart_what_changes_the_cost():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    same = cost_key(aten.mul.Tensor, (x, y), {}, x * y)
    assert cost_key(aten.mul.Tensor, (torch.randn(4, 8), torch.randn(4, 8)), {}, x * y) == same
    assert cost_key(aten.mul.Tensor, (x, x), {}, x * x) != same  # one tensor read twice is read once
    assert cost_key(aten.mul.Tensor, (x, y.t().contiguous().t()), {}, x * y) != same  # other strides
    assert cost_key(aten.mul.Tensor, (x, y.double()), {}, x * y) != same
    assert cost_key(aten.mul.Tensor, (x, 2), {}, x * 2) != cost_key(aten.mul.Tensor, (x, 2.0), {}, x * 2)


def test_only_views_and_metadata_ops_launch_no_kernel():
    aten = torch.ops.aten
    assert all(launches_no_kernel(f) for f in (aten.view.default, aten.t.default, aten.expand.default,
                                              aten._unsafe_view.default, aten.sym_size.int))
    # allocations fill memory under deterministic mode; copies and reads of a scalar move data
    assert not any(launches_no_kernel(f) for f in (aten.add.Tensor, aten.empty.memory_format, aten.clone.default,
                                                  aten.lift_fresh_copy.default, aten._local_scalar_dense.default,
                                                  aten.add_.Tensor))
