"""Starting the helper processes of the multi-process compiler tests (distributed, kernel-cache faults): each
runs a module of tests/compile under the Triton interpreter with BRRR_DEBUG=1, logs to a file, and is killed
when it outlives its time limit, so a hang fails the test instead of blocking the run. They run at a lower
priority: beside them, on CI's two cores, another worker runs tests that time sleeps (experiments/overhead)."""

import os
import shutil
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start(module, args, log, **env):
    """`python -m tests.compile.<module> *args` with `env` added to ours, output to the file `log`."""
    full_env = dict(os.environ, TRITON_INTERPRET="1", BRRR_DEBUG="1", OMP_NUM_THREADS="1",
                    PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p), **env)
    command = [sys.executable, "-m", f"tests.compile.{module}", *map(str, args)]
    nice = shutil.which("nice")
    with open(log, "w") as out:
        proc = subprocess.Popen([nice, "-n", "5", *command] if nice else command, cwd=REPO, env=full_env,
                                stdout=out, stderr=subprocess.STDOUT)
    proc.log, proc.label = log, " ".join(command[2:])
    return proc


def finish(procs, timeout_s):
    """Wait for every process; fail with their logs unless all exited 0. The rest are killed as soon as one
    fails (its peers would wait for it in a collective) or once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode != 0 for p in procs):
        pytest.fail(f"a process failed or hung (limit {timeout_s} s):\n{logs(procs)}")


def logs(procs):
    return "\n".join(f"--- {p.label} (exit {p.returncode}) ---\n{open(p.log).read()[-4000:]}" for p in procs)


def wait_for(path, proc, timeout_s):
    """Wait until `path` exists; fail if `proc` exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            pytest.fail(f"{path} never appeared:\n{logs([proc])}")
        time.sleep(0.02)
