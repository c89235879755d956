"""One process compiling the floor test's block with a test-double timer (test_floor.py runs it twice on one
cache): prints how many kernel and call timings it made and which form it kept."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["BRRR_DEBUG"] = "1"

import torch  # noqa: E402

from brrr.compile.runtime import floor  # noqa: E402
from tests.compile.helpers import compiled  # noqa: E402
from tests.compile.test_floor import FakeTimer, norm_block  # noqa: E402

timer = floor.TIMER = FakeTimer(3.0, 2.0, 2.5)
x, w = torch.randn(8, 64), torch.randn(64)
torch.testing.assert_close(compiled(norm_block)(x, w), norm_block(x, w))
kept = [v.kept for v in floor.DECISIONS if v.tried]
print(f"timed_kernels={timer.kernel_calls} timed_calls={timer.call_calls} kept={','.join(kept)}")
