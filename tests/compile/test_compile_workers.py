"""Triton compiles in worker processes: a worker compiles a kernel to the binary the launcher loads without the
JIT, for the target the parent names, without touching CUDA (these tests run on a machine with no GPU: Triton's
own ptxas builds the cubin); a compile error, a dead worker or no worker at all leaves the compile to this
process."""

import hashlib
import os
import pickle

import pytest
import torch

from brrr.compile.runtime import compile_workers, launch

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def brrr_add_0123abcd(in_ptr0, in_ptr1, out_ptr0, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out_ptr0 + i, tl.load(in_ptr0 + i) + tl.load(in_ptr1 + i))
'''
BROKEN = SOURCE.replace("tl.load(in_ptr1 + i))", "tl.no_such_op(in_ptr1 + i))")
HOPPER = ("cuda", 90, 32)


@pytest.fixture
def workers(tmp_path):
    """A pool of one real worker compiling for the GPU (no interpreter) into this test's caches."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(BRRR_CACHE_DIR=str(tmp_path / "brrr"), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    pool = compile_workers.WorkerPool(1, env=env)
    pool.start()
    assert pool.wait_ready() == 1
    yield pool
    pool.close()


def job(source=SOURCE, warps=4):
    return {"source": source, "function": "brrr_add_0123abcd", "device_name": "NVIDIA H100",
            "dtypes": ["float32", "bfloat16", "float32"], "meta": {"XBLOCK": 128, "num_warps": warps},
            "target": HOPPER}


def test_a_worker_compiles_a_kernel_to_a_binary_the_launcher_loads_without_touching_cuda(workers, tmp_path):
    reply = workers.compile(job(warps=8))
    assert reply["error"] is None and reply["cuda_initialized"] is False
    cls, state = pickle.loads(reply["binary"])
    assert cls is launch._static_launcher_class()
    assert state["name"] == "brrr_add_0123abcd" and state["arg_tys"] == "OOO" and state["num_warps"] == 8
    # the cubin sits in the worker's brrr cache, whole, and is the named kernel's sm_90 binary
    assert state["cubin_path"].startswith(str(tmp_path / "brrr"))
    with open(state["cubin_path"], "rb") as f:
        cubin = f.read()
    assert cubin[:4] == b"\x7fELF" and b"brrr_add_0123abcd" in cubin and b"sm_90" in cubin
    assert hashlib.sha256(cubin).hexdigest() == state["cubin_digest"]
    assert workers.compiled == 1


def test_a_kernel_that_fails_to_compile_is_reported_and_the_worker_serves_on(workers):
    reply = workers.compile(job(BROKEN))
    assert reply["binary"] is None and "no_such_op" in reply["error"]
    assert workers.compile(job())["binary"] is not None


def test_a_dead_worker_leaves_the_compile_to_this_process(workers):
    proc = workers.idle.queue[0]
    proc.kill()
    proc.wait()
    assert compile_workers.compile_binary(SOURCE, "brrr_add_0123abcd", "gpu", (torch.float32,) * 3,
                                          {"XBLOCK": 128}, HOPPER, workers=workers) is None
    assert workers.alive == 0 and len(workers.lost) == 1


def test_a_worker_still_starting_never_holds_a_compile_up(tmp_path):
    """Until a worker has imported what it compiles with, its kernels compile in-process: `compile` answers at once."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    pool = compile_workers.WorkerPool(1, env=dict(env, BRRR_CACHE_DIR=str(tmp_path / "brrr"),
                                                  TRITON_CACHE_DIR=str(tmp_path / "triton")))
    try:
        assert pool.compile(job()) is None and pool.passed == 1
        assert pool.wait_ready() == 1 and pool.compile(job())["binary"] is not None
    finally:
        pool.close()


def test_workers_only_when_asked_for_and_never_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(compile_workers, "usable_cpus", lambda: 4)
    monkeypatch.setenv("BRRR_COMPILE_WORKERS", "3")
    assert compile_workers.worker_count() == 0   # TRITON_INTERPRET=1 in these tests
    monkeypatch.delenv("TRITON_INTERPRET")
    assert compile_workers.worker_count() == 3
    monkeypatch.setenv("BRRR_COMPILE_WORKERS", "16")
    assert compile_workers.worker_count() == 4
    monkeypatch.delenv("BRRR_COMPILE_WORKERS")
    assert compile_workers.worker_count() == 0   # off unless asked for: measured slower (NOTES.md)


def test_warm_launches_a_worker_binary_and_never_loads_the_jit(monkeypatch):
    """A launch that knows its source compiles in a worker: the binary it gets back is launched, and this process
    loads no JIT function. Where no worker compiles it, this process does (and raises what fails there)."""
    monkeypatch.delenv("TRITON_INTERPRET")
    asked, loads = [], []
    monkeypatch.setattr(compile_workers, "target_of", lambda index: HOPPER)
    monkeypatch.setattr(compile_workers, "pool", lambda: "a pool")
    monkeypatch.setattr(compile_workers, "compile_binary",
                        lambda *a: asked.append(a) or (b"from a worker" if len(asked) == 1 else None))
    monkeypatch.setattr(launch, "load_binary", lambda blob, device: ("launch", "kernel", "OO", ())
                        if blob == b"from a worker" else None)

    class WarmableJIT:
        def warmup(self, *dtypes, grid, **meta):
            return "compiled here"
    monkeypatch.setattr(launch, "binary_of", lambda kernel, n: b"compiled here" if kernel == "compiled here" else None)

    def load():
        loads.append(1)
        return WarmableJIT()
    k = launch.Launcher(None, (4,), {"XBLOCK": 128, "num_warps": 4}, load=load,
                        warm_dtypes=(torch.float32, torch.float32), origin=(SOURCE, "brrr_add_0123abcd", "gpu"))
    assert k.warm(0, strict=True) == b"from a worker"
    assert k.binary == ("launch", "kernel", "OO", ()) and not loads
    assert asked == [(SOURCE, "brrr_add_0123abcd", "gpu", (torch.float32, torch.float32),
                      {"XBLOCK": 128, "num_warps": 4}, HOPPER)]
    variant = k.retuned(8)
    assert variant.warm(0) == b"compiled here" and loads == [1]   # the worker gave nothing: compiled here
    assert asked[1][4] == {"XBLOCK": 128, "num_warps": 8}
