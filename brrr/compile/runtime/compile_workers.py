"""Triton compiles in worker processes, where asked for (codegen -> **runtime**; BRRR_COMPILE_WORKERS=N).

Threads already compile a graph's functions at once (`compiled.assemble`, the floor's warp variants), but the
front half of a Triton compile, Python walking the kernel's AST into MLIR, holds the GIL: on a cold ConvNeXt
the main thread's profile showed ~10 s in Triton's code generator. With workers, each compiling thread hands its
kernel to a process of its own and waits, with the GIL released, for the compiled kernel's binary: what
`launch.binary_of` keeps (torch's static launcher, its cubin in brrr's cache), which `launch.load_binary` loads
without Triton's JIT.

The workers never touch the GPU: a worker compiles for the target the parent names (`compile_worker.py` gives
Triton a driver that knows only that target), so it holds no CUDA context and no GPU memory. They are plain
`python -m brrr.compile.runtime.compile_worker` processes speaking pickles over their pipes (not
multiprocessing, whose spawned children re-import the user's script), started when a graph's planning begins
(`start`), and they end when this process does (their stdin closes).

Workers are off unless BRRR_COMPILE_WORKERS=N asks for N of them: measured on an H200 host (16 CPUs), they
made cold compiles slower, not faster (benchmarks/NOTES.md, "Compile time"). Threads already overlap most of a
compile (MLIR passes and ptxas run outside the GIL), and eight workers importing torch and compiling beside the
main thread slowed its planning (BERT MLM 3.7 -> 9.7 s) and the floor's timings, so the floor tried more
alternatives.

Everything degrades to the in-process compile: no worker (not asked for, Triton's interpreter, no CUDA), a
worker still starting or busy, a worker that dies, a kernel that fails to compile there (the in-process
compile then raises the real error) or a kernel torch's static launcher cannot take.

`hash_triton_ahead` starts, in a thread, the one cost every process's first JIT compile pays even when Triton's
cache holds the kernel: Triton hashing its own files (`triton_key`, ~0.36 s on the H200 hosts), which a warm
start otherwise pays on the critical path when it reaches a kernel the graph cache does not keep.
"""

import atexit
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time

_HEADER = struct.Struct("<Q")


def usable_cpus():
    """CPUs this process may run on (a zoo worker is pinned to its share), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 8


def send(stream, obj):
    data = pickle.dumps(obj)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def receive(stream):
    """The next pickle on `stream`; EOFError where the other side is gone."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("compile worker closed its pipe")
    (n,) = _HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("compile worker closed its pipe mid-reply")
    return pickle.loads(data)


class WorkerPool:
    """`size` compile workers; `compile(job)` from any thread runs `job` on a worker that is ready and idle, and
    returns its reply, or None at once where none is (the caller then compiles in-process: a worker still
    importing torch never holds a compile up). `env` replaces the workers' environment (default: this
    process's)."""

    def __init__(self, size, env=None):
        self.size, self.env = size, env
        self.idle = queue.Queue()
        self.alive = 0
        self.lock = threading.Lock()
        self.lost = []   # why workers died, for explain and tests
        self.compiled = 0   # kernels a worker compiled to a binary
        self.passed = 0   # kernels asked for while every worker was busy or starting
        self._started = False

    def start(self):
        """Start the workers; each joins the idle ones once it has imported what it compiles with. Idempotent."""
        with self.lock:
            if self._started:
                return
            self._started = True
            for _ in range(self.size):
                try:
                    proc = self._spawn()
                except OSError as e:
                    self.lost.append(f"could not start: {e}")
                    continue
                self.alive += 1
                threading.Thread(target=self._await_ready, args=(proc,), daemon=True).start()

    def _spawn(self):
        env = dict(os.environ if self.env is None else self.env)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return subprocess.Popen([sys.executable, "-m", "brrr.compile.runtime.compile_worker"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

    def _await_ready(self, proc):
        try:
            receive(proc.stdout)   # its greeting: imports done
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            self._lose(proc, e)
            return
        self.idle.put(proc)

    def _lose(self, proc, why):
        with self.lock:
            self.alive -= 1
            self.lost.append(f"{type(why).__name__}: {why}")
        proc.kill()

    def wait_ready(self, timeout=60.0):
        """Block until every live worker is idle (tests), or `timeout`; how many are."""
        deadline = time.monotonic() + timeout
        while self.idle.qsize() < self.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.idle.qsize()

    def compile(self, job):
        """The reply of an idle worker to `job` (a dict, see compile_worker.compile_job), or None where no worker
        is idle (busy, starting, or dead)."""
        self.start()
        try:
            proc = self.idle.get_nowait()
        except queue.Empty:
            with self.lock:
                self.passed += 1
            return None
        try:
            send(proc.stdin, job)
            reply = receive(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            self._lose(proc, e)
            return None
        self.idle.put(proc)
        if reply.get("binary") is not None:
            with self.lock:
                self.compiled += 1
        return reply

    def close(self):
        while True:
            try:
                proc = self.idle.get_nowait()
            except queue.Empty:
                return
            try:
                proc.stdin.close()
                proc.wait(timeout=5)
            except Exception:
                proc.kill()


_POOL = None
_POOL_LOCK = threading.Lock()


def worker_count():
    """How many workers this process uses: BRRR_COMPILE_WORKERS (at most the usable CPUs), else none; none
    where compiling in-process is the only way (Triton's interpreter, no CUDA)."""
    setting = os.environ.get("BRRR_COMPILE_WORKERS", "0")
    if os.environ.get("TRITON_INTERPRET") == "1" or setting == "0":
        return 0
    import torch

    if not torch.cuda.is_available() or torch.version.hip is not None:
        return 0
    return max(0, min(int(setting), usable_cpus()))


def pool():
    """This process's pool, or None where it compiles in-process."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            n = worker_count()
            if n == 0:
                return None
            _POOL = WorkerPool(n)
            atexit.register(_POOL.close)
        return _POOL


def start():
    """Start the workers ahead of the first kernel (a graph's planning is about to produce kernels)."""
    p = pool()
    if p is not None:
        p.start()


_HASHED = []


def triton_key_function():
    """Triton's `triton_key` (its own files hashed: part of every kernel's cache key)."""
    try:   # Triton >= 3.3 keeps it in runtime.cache, earlier ones in compiler.compiler
        from triton.runtime.cache import triton_key
    except ImportError:
        from triton.compiler.compiler import triton_key
    return triton_key


def hash_triton_ahead():
    """Compute Triton's `triton_key` in a daemon thread (once per process, on CUDA machines): it is cached, so the
    first JIT compile finds it done."""
    if _HASHED or os.environ.get("TRITON_INTERPRET") == "1":
        return
    _HASHED.append(True)
    import torch

    if not torch.cuda.is_available():
        return
    try:
        triton_key = triton_key_function()
    except ImportError:
        return

    def run():
        try:
            triton_key()
        except Exception:   # the first compile computes it again, and reports what fails
            pass
    threading.Thread(target=run, name="brrr-triton-key", daemon=True).start()


def target_of(device_index):
    """What Triton compiles for on CUDA device `device_index`: (backend, arch, warp size), as its driver says."""
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    return ("cuda", major * 10 + minor, 32)


def compile_binary(source, function, device_name, dtypes, meta, target, workers=None):
    """The binary (`launch.binary_of`'s bytes) of `function` in `source` compiled for `dtypes` (tensor
    arguments) and `meta` on `target`, compiled in a worker; None where no worker compiled it."""
    workers = workers or pool()
    if workers is None:
        return None
    reply = workers.compile({"source": source, "function": function, "device_name": device_name,
                             "dtypes": [str(d).removeprefix("torch.") for d in dtypes], "meta": dict(meta),
                             "target": tuple(target)})
    return None if reply is None else reply.get("binary")
