"""Shared helpers for the analyzer's tests: hand-built ceilings and op records, and analyses reused by tests."""

import pytest
import torch

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
