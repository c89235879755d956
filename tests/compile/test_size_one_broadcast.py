"""A per-row node of another rank than its reduction kernel's space: a [1, S, 1] value (a batch of 1 keeps
its size-1 dims) beside a reduction over [S, V] joins that kernel, whose layout probes must evaluate it at its
own rank (Hugging Face BERT's masked-LM loss at batch 1 failed planning with an IndexError)."""

import pytest
import torch

from tests.compile.helpers import compiled


def row_reduction(y, r):
    return y.amax(-1), r.permute(0, 2, 1) * 2


def column_reduction(y, r):
    return y.sum(0), r.transpose(1, 2) + 1


@pytest.mark.parametrize("fn, y_shape", [(row_reduction, (16, 1000)), (column_reduction, (1000, 16))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_node_of_more_dims_beside_a_reduction(fn, y_shape, dtype):
    torch._dynamo.reset()
    torch.manual_seed(0)
    y, r = torch.randn(y_shape, dtype=dtype), torch.randn(1, 1, 16, dtype=dtype)
    out, ref = compiled(fn)(y, r), fn(y, r)
    assert out[1].shape == ref[1].shape == (1, 16, 1)
    assert torch.equal(out[1], ref[1])
    torch.testing.assert_close(out[0], ref[0])
