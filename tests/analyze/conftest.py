"""Shared helpers for the analyzer's tests: hand-built ceilings and op records, and analyses reused by tests."""

import os
import tempfile

# brrr-compiled models run their kernels in the Triton interpreter (as `make test` runs every test): set before
# triton is imported anywhere, with a kernel cache of the tests' own
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("BRRR_CACHE_DIR", tempfile.mkdtemp(prefix="brrr-test-cache-"))
# tests watch planning (spies, injected failures): a graph kept by an earlier test would skip it; the graph
# cache's own tests (test_graph_cache.py) turn it on
os.environ.setdefault("BRRR_GRAPH_CACHE", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.analyze.synthetic import make_ceilings


@pytest.fixture(scope="session")
def cpu_ceilings():
    """Plausible CPU-like numbers, not measured (tests never measure except the CLI test)."""
    return make_ceilings(kind="cpu", bandwidth=2e10, fp32=1e11, tf32=1e11, bf16=5e10, fp16=2e10,
                         vector_fp32=1e11, launch_latency=3e-6)


@pytest.fixture(scope="session")
def mlp_target():
    from brrr.examples import mlp

    torch.manual_seed(0)
    return mlp(batch=64, dim=128)


@pytest.fixture(scope="session")
def bert_target():
    from brrr.examples import bert

    torch.manual_seed(0)
    return bert()


@pytest.fixture(scope="session")
def mlp_analysis(mlp_target, cpu_ceilings):
    from brrr.analyze import analyze

    model, inputs = mlp_target
    return analyze(model, *inputs, ceilings=cpu_ceilings)


@pytest.fixture(scope="session")
def bert_train_analysis(bert_target, cpu_ceilings):
    from brrr.analyze import analyze

    model, inputs = bert_target
    return analyze(model, *inputs, train=True, ceilings=cpu_ceilings)
