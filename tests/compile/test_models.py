"""The seed MLP and tiny BERT / GPT-2: brrr's outputs and gradients match eager (fp32) and are as accurate as
eager in half precision (error against a float64 reference)."""

import copy

import pytest
import torch

from brrr.examples import bert, gpt2, mlp
from tests.compile.helpers import compiled, first, rel_err

MODELS = {"mlp": lambda dt: mlp(dtype=dt, batch=16, dim=64), "bert": lambda dt: bert(dtype=dt),
          "gpt2": lambda dt: gpt2(dtype=dt)}


def _grads(model, out, g):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(out, params, g, allow_unused=True)


@pytest.mark.parametrize("name", list(MODELS))
def test_fp32_forward_and_backward_match_eager(name):
    model, inputs = MODELS[name](torch.float32)
    if name == "mlp":
        inputs = (inputs[0].requires_grad_(),)
    out = first(compiled(model)(*inputs))
    ref = first(model(*inputs))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    g = torch.randn_like(ref)
    ref_grads = _grads(model, ref, g)
    scale = max(r.abs().max().item() for r in ref_grads if r is not None)
    for a, b in zip(_grads(model, out, g), ref_grads):
        if b is not None:
            # key-projection bias grads are ~0 (softmax is shift invariant): compare against the global scale
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(MODELS))
def test_half_precision_as_accurate_as_eager(name, dtype):
    model, inputs = MODELS[name](torch.float32)
    m64 = copy.deepcopy(model).double()
    mh = model.to(dtype)
    inp_h = [i.to(dtype) if i.is_floating_point() else i for i in inputs]
    inp_64 = [i.double() if i.is_floating_point() else i for i in inputs]
    ref = first(m64(*inp_64))
    with torch.no_grad():
        eager_err = rel_err(first(mh(*inp_h)), ref)
        brrr_err = rel_err(first(compiled(mh)(*inp_h)), ref)
    assert brrr_err <= 2 * eager_err + 1e-3, (brrr_err, eager_err)


def test_mlp_training_half_grads():
    model, (x,) = mlp(dtype=torch.float32, batch=16, dim=64)
    m64 = copy.deepcopy(model).double()
    mh = model.to(torch.bfloat16)
    x64 = x.double().requires_grad_()
    xh = x.to(torch.bfloat16).requires_grad_()
    ref = m64(x64)
    g = torch.randn_like(ref)
    (gref,) = torch.autograd.grad(ref, x64, g)
    (geager,) = torch.autograd.grad(mh(xh), xh, g.to(torch.bfloat16))
    (gbrrr,) = torch.autograd.grad(compiled(mh)(xh), xh, g.to(torch.bfloat16))
    assert rel_err(gbrrr, gref) <= 2 * rel_err(geager, gref) + 1e-3
