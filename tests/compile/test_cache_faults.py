"""The on-disk kernel cache under faults: processes sharing it, entries damaged on disk, compiles interrupted
mid-write. Every later run must compute the right numbers and leave only whole entries behind."""

import importlib.util
import os
import pathlib
import signal
import stat
import struct
import time
from types import SimpleNamespace

import pytest
import torch

from brrr.compile import cache as kernel_cache
from tests.compile.cache_worker import RACE_KERNELS, graph, inputs
from tests.compile.helpers import compiled
from tests.compile.workers import finish, start, wait_for

TIMEOUT_S = 180


def entries(cache):
    return sorted((cache / "kernels").glob("brrr_*.py"))


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def assert_whole(cache):
    """Every entry holds exactly the source its name is the key of, with an ordinary file's permissions (other
    users sharing the cache can read what the umask lets them); no temporary file is left."""
    found = entries(cache)
    assert found
    for path in found:
        assert kernel_cache.cache_key(path.read_text(), "cpu") == path.stem[len("brrr_"):], f"{path.name} is damaged"
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask(), oct(path.stat().st_mode)
    assert not list((cache / "kernels").glob(".tmp-*"))


def fresh_run(cache, monkeypatch):
    """This process compiling `graph` as a later run would: nothing loaded in memory, only the disk cache."""
    monkeypatch.setenv("BRRR_CACHE_DIR", str(cache))
    monkeypatch.setattr(kernel_cache, "_MODULES", {})
    torch._dynamo.reset()
    got = compiled(graph)(*inputs())
    for a, b in zip(got, graph(*inputs())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    return set(kernel_cache._MODULES)


def test_two_processes_compiling_the_same_graph_at_once_share_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    procs = [start("cache_worker", ["race", tmp_path], tmp_path / f"race{i}.log", BRRR_CACHE_DIR=str(cache))
             for i in range(2)]
    (tmp_path / "go").touch()   # both start loading at once (each waits for this after its imports)
    finish(procs, TIMEOUT_S)
    results = [torch.load(tmp_path / f"{p.pid}.pt") for p in procs]
    for result in results:
        for a, b in zip(result["outs"], graph(*inputs())):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    keys = results[0]["keys"]
    assert results[1]["keys"] == keys and len(keys) > RACE_KERNELS   # the graph's kernels besides the race's
    assert [p.stem[len("brrr_"):] for p in entries(cache)] == keys   # one entry per kernel
    assert_whole(cache)
    written = {p: p.stat().st_mtime_ns for p in entries(cache)}
    assert fresh_run(cache, monkeypatch) <= set(keys)
    assert {p: p.stat().st_mtime_ns for p in entries(cache)} == written   # a later run trusts them as they are


def _truncated(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _emptied(path):
    path.write_bytes(b"")


def _same_size_garbage(path):
    path.write_text(path.read_text().replace("tl.", "tl_"))


def _binary_garbage(path):
    path.write_bytes(b"\xff\xfe\x00garbage" * 10)


def _corrupt_bytecode_beside_it(path):
    # the .pyc Python would cache for the entry, with a header matching the entry's mtime and size (what Python
    # checks before trusting it) over a garbage body
    entry = path.stat()
    pyc = importlib.util.cache_from_source(str(path))
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    with open(pyc, "wb") as f:
        f.write(importlib.util.MAGIC_NUMBER + struct.pack("<III", 0, int(entry.st_mtime) & 0xFFFFFFFF,
                                                          entry.st_size & 0xFFFFFFFF) + b"\x00garbage")


@pytest.mark.parametrize("damage", [_truncated, _emptied, _same_size_garbage, _binary_garbage,
                                    _corrupt_bytecode_beside_it])
def test_a_damaged_entry_is_rebuilt_by_a_later_run(tmp_path, monkeypatch, damage):
    cache = tmp_path / "cache"
    keys = fresh_run(cache, monkeypatch)
    for path in entries(cache):
        damage(path)
    assert fresh_run(cache, monkeypatch) == keys
    assert_whole(cache)


def test_a_damaged_cubin_is_rewritten(tmp_path, monkeypatch):
    # the cubin files torch's static launcher loads (GPU only), kept beside the kernel cache: a stand-in kernel
    from brrr.compile.runtime.launch import _cubin_file

    monkeypatch.setenv("BRRR_CACHE_DIR", str(tmp_path))
    kernel = SimpleNamespace(hash="0123abcd", asm={"cubin": bytes(range(256)) * 8})
    path = pathlib.Path(_cubin_file(kernel))
    assert path.read_bytes() == kernel.asm["cubin"]
    for damage in (_truncated, _emptied, _binary_garbage):
        damage(path)
        assert pathlib.Path(_cubin_file(kernel)) == path and path.read_bytes() == kernel.asm["cubin"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_compile_interrupted_mid_write_leaves_nothing_a_later_run_trusts(tmp_path, monkeypatch, sig):
    cache = tmp_path / "cache"
    proc = start("cache_worker", ["pause", tmp_path], tmp_path / "pause.log", BRRR_CACHE_DIR=str(cache))
    wait_for(tmp_path / "paused", proc, TIMEOUT_S)
    proc.send_signal(sig)
    proc.wait(timeout=TIMEOUT_S)
    log = (tmp_path / "pause.log").read_text()
    assert proc.returncode != 0 and "done" not in log.split(), log[-3000:]
    left = list((cache / "kernels").glob(".tmp-*"))
    if sig == signal.SIGINT:
        # the interrupted compile's writer threads finish their entries: nothing half-written stays
        assert "KeyboardInterrupt" in log, log[-3000:]
        assert not left
    else:
        # a killed writer leaves its temporary file; a later run deletes it once it is clearly dead, and leaves
        # a young one alone (another process may be writing it)
        assert left
        old = time.time() - kernel_cache.STALE_TMP_S - 60
        for tmp in left:
            os.utime(tmp, (old, old))
        live = cache / "kernels" / ".tmp-being-written"
        live.touch()
    for path in entries(cache):   # whatever got renamed into place is whole
        assert kernel_cache.cache_key(path.read_text(), "cpu") == path.stem[len("brrr_"):]
    monkeypatch.setattr(kernel_cache, "_SWEPT", set())
    fresh_run(cache, monkeypatch)
    if sig == signal.SIGKILL:
        assert live.exists()
        live.unlink()
    assert_whole(cache)
