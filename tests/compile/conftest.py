"""Compiler tests run brrr's kernels in the Triton interpreter on CPU tensors (no GPU needed)."""

import os
import tempfile

os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported anywhere
os.environ["BRRR_DEBUG"] = "1"                # brrr errors raise here instead of quietly running ATen
os.environ.setdefault("BRRR_CACHE_DIR", tempfile.mkdtemp(prefix="brrr-test-cache-"))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

np.seterr(all="ignore")

@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
