"""NaN and infinities through reductions: torch's max/min/argmax/argmin let NaN win (argmax/argmin pick the
first NaN); brrr's kernels must give the same numbers, in one-pass and looped reductions alike."""

import pytest
import torch

from tests.compile.helpers import compiled

OPS = {
    "amax": lambda t: t.amax(-1),
    "amin": lambda t: t.amin(-1),
    "max.dim": lambda t: t.max(-1),
    "min.dim": lambda t: t.min(-1),
    "argmax": lambda t: t.argmax(-1),
    "argmin": lambda t: t.argmin(-1),
    "amax over rows": lambda t: t.amax(0),
    "max of all": lambda t: t.max(),
    "softmax": lambda t: t.softmax(-1),
    "log_softmax": lambda t: t.log_softmax(-1),
}


def special(rows, cols, dtype):
    x = torch.randn(rows, cols)
    x[1, 3] = float("nan")
    x[1, 6] = float("inf")        # a NaN beats a larger-looking inf
    x[2, 0] = float("inf")
    x[3, 5] = float("-inf")
    x[4, :] = float("-inf")       # a row of -inf
    x[5, 2] = x[5, cols - 1] = float("nan")   # two NaNs: argmax/argmin take the first
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [8, 5000])   # one pass, and a looped reduction
@pytest.mark.parametrize("name", list(OPS))
def test_nan_and_inf_match_eager(name, cols, dtype):
    fn = OPS[name]
    x = special(6, cols, dtype)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(fn)(x), fn(x), equal_nan=True)
