"""Ceilings: the roofline math, the cache (reuse, corrupt entries), measuring in a child process, the datasheet
lookup."""

import json

import pytest
import torch

from brrr.cost import device as dev
from brrr.cost.device import Ceilings


def synthetic(**overrides):
    values = dict(device="synthetic", kind="cuda", bandwidth=2e12,
                  matmul={"fp32": 50e12, "tf32": 400e12, "bf16": 800e12, "fp16": 800e12},
                  vector_fp32=50e12, launch_latency=5e-6)
    values.update(overrides)
    return Ceilings(**values)


def test_roofline_time_is_max_of_compute_and_memory():
    c = synthetic()
    assert c.roofline_time(flops=1e12, bytes=1e9) == pytest.approx(1e12 / 50e12)  # compute-bound
    assert c.roofline_time(flops=1e6, bytes=2e12) == pytest.approx(1.0)  # bandwidth-bound
    assert c.roofline_time(1e12, 0, torch.bfloat16, contraction=True) == pytest.approx(1e12 / 800e12)


def test_peak_flops_follows_dtype_and_tf32_setting():
    c = synthetic()
    assert c.peak_flops(torch.float16, contraction=True) == 800e12
    assert c.peak_flops(torch.bfloat16, contraction=False) == 50e12  # not a matmul: no tensor cores
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert c.peak_flops(torch.float32, contraction=True) == 50e12
        torch.set_float32_matmul_precision("high")
        assert c.peak_flops(torch.float32, contraction=True) == 400e12
    finally:
        torch.set_float32_matmul_precision(old)


def test_datasheet_lookup():
    assert dev.datasheet_for("NVIDIA H100 80GB HBM3")["bandwidth"] == 3.35e12
    assert dev.datasheet_for("NVIDIA H200")["bandwidth"] == 4.8e12
    assert dev.datasheet_for("cpu (x86_64, 2 threads)") == {}


def test_cache_is_reused_and_corrupt_entry_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(device, progress=False):
        calls.append(device)
        return synthetic(device=dev.device_name(device), kind="cpu")

    monkeypatch.setattr(dev, "measure_ceilings", fake_measure)
    first = dev.get_ceilings("cpu")
    assert dev.get_ceilings("cpu") == first and len(calls) == 1
    path = dev.cache_path(torch.device("cpu"))
    path.write_text('{"device": "half-writ')  # a torn write
    assert dev.get_ceilings("cpu") == first and len(calls) == 2
    assert json.loads(path.read_text())["bandwidth"] == 2e12
    dev.get_ceilings("cpu", refresh=True)
    assert len(calls) == 3


def test_cpu_measurement_is_sane(tmp_path, monkeypatch):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    c = dev.get_ceilings("cpu")
    assert 1e8 < c.bandwidth < 1e13
    assert 1e8 < c.matmul["fp32"] < 1e14
    assert 1e-8 < c.launch_latency < 1e-3
    assert c.versions["torch"] == torch.__version__
    assert Ceilings.from_dict(c.to_dict()) == c


def _refuse_in_process(monkeypatch):
    def refuse(device, progress=False):
        raise AssertionError("measured in the calling process")
    monkeypatch.setattr(dev, "measure_ceilings", refuse)


def test_measured_apart_in_a_child_process_that_fills_the_cache(tmp_path, monkeypatch):
    """apart=True (a GPU's default): the buffers live in a child process, never in the caller's; the caller reads
    the child's cache entry, and a second call measures nothing."""
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    _refuse_in_process(monkeypatch)
    c = dev.get_ceilings("cpu", apart=True)
    assert c.kind == "cpu" and 1e8 < c.bandwidth < 1e13
    assert dev.cache_path(torch.device("cpu")).exists()
    assert dev.get_ceilings("cpu", apart=True) == c


def test_measured_in_process_where_no_child_can_start(tmp_path, monkeypatch):
    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dev.sys, "executable", str(tmp_path / "no-such-python"))
    monkeypatch.setattr(dev, "measure_ceilings", lambda device, progress=False: synthetic(kind="cpu"))
    assert dev.get_ceilings("cpu", apart=True) == synthetic(kind="cpu")
