"""The attention-mask pass: a broadcast mask (last stride 0) gets one contiguous copy, results unchanged."""

import torch
import torch.nn.functional as F

from brrr.compile.passes.attention_mask import contiguous_attention_masks


def attention_twice(q, k, v, keep):
    # the padding mask as HF builds it under torch.compile: broadcast, last dim stride 0
    mask = keep[:, None, :, None].expand(q.shape[0], 1, q.shape[2], k.shape[2])
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(a, k, v, mask)


def test_broadcast_mask_gets_one_contiguous_copy_and_same_result():
    seen = {}

    def backend(gm, inputs):
        seen["copies"] = contiguous_attention_masks(gm, devices=("cpu",))
        seen["code"] = gm.code
        return gm

    q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
    keep = torch.rand(2, 8) > 0.3
    keep[:, 0] = True
    torch._dynamo.reset()
    got = torch.compile(attention_twice, backend=backend, fullgraph=True)(q, k, v, keep)
    assert seen["copies"] == 1 and seen["code"].count(".contiguous()") == 1
    torch.testing.assert_close(got, attention_twice(q, k, v, keep))


def test_broadcast_mask_of_symbolic_sizes_gets_its_copy():
    # a graph captured with symbolic sizes (a length changed) holds the same mask; its last size is a SymInt
    seen = {}

    def backend(gm, inputs):
        seen["copies"] = contiguous_attention_masks(gm, devices=("cpu",))
        return gm

    torch._dynamo.reset()
    cf = torch.compile(attention_twice, backend=backend, fullgraph=True, dynamic=True)
    for n in (8, 12):
        q, k, v = (torch.randn(2, 3, n, 4) for _ in range(3))
        keep = torch.rand(2, n) > 0.3
        keep[:, 0] = True
        torch.testing.assert_close(cf(q, k, v, keep), attention_twice(q, k, v, keep))
    assert seen["copies"] == 1


def test_contiguous_masks_and_other_devices_are_left_alone():
    seen = {}

    def backend(gm, inputs):
        seen["cuda_only"] = contiguous_attention_masks(gm)          # default: CUDA masks only
        seen["cpu"] = contiguous_attention_masks(gm, devices=("cpu",))
        return gm

    q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
    mask = torch.rand(2, 1, 8, 8) > 0.2
    torch._dynamo.reset()
    torch.compile(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m), backend=backend)(q, k, v, mask)
    assert seen == {"cuda_only": 0, "cpu": 0}
