"""One compile worker process (`python -m brrr.compile.runtime.compile_worker`; compile_workers.py runs them).

It reads jobs from stdin and answers each on stdout, as length-prefixed pickles: a job names a generated
kernel's module source, its function, the dtypes of its tensor arguments, its meta (block sizes, warps) and
the target; the reply carries `launch.binary_of`'s bytes, or the error that stopped the compile. The compile
is Triton's own (`JITFunction.warmup`, what the in-process path runs), so it lands in Triton's and brrr's
caches exactly as an in-process compile would. Triton asks its driver for the current device and target:
this process answers with the target it was given and never initializes CUDA.
"""

import os
import sys


class CompileOnlyDriver:
    """What Triton's JIT asks of its driver to compile (not to launch): a device, a stream and a target."""

    def __init__(self, target):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget(*target)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_device_capability(self, device=None):
        return divmod(self.target.arch, 10)


def import_ahead():
    """What the first compile would import and hash, done before this worker says it is ready."""
    import triton.language  # noqa: F401

    from brrr.compile.runtime import compile_workers, launch

    launch._static_launcher_class()
    compile_workers.triton_key_function()()


def compile_job(job):
    """The reply to one job: {"binary": bytes or None, "error": str or None, "cuda_initialized": bool}."""
    import torch
    from triton.runtime.driver import driver

    from brrr.compile.cache import load_kernel
    from brrr.compile.runtime.launch import binary_of

    driver.set_active(CompileOnlyDriver(job["target"]))
    binary, error = None, None
    try:
        fn = load_kernel(job["source"], job["function"], job["device_name"])
        dtypes = [getattr(torch, d) for d in job["dtypes"]]
        kernel = fn.warmup(*dtypes, grid=(1,), **job["meta"])
        binary = binary_of(kernel, len(dtypes))
    except Exception as e:   # the parent compiles in-process, and raises the real error there
        error = f"{type(e).__name__}: {e}"
    return {"binary": binary, "error": error, "cuda_initialized": torch.cuda.is_initialized()}


def serve(stdin, stdout):
    from brrr.compile.runtime.compile_workers import receive, send

    import_ahead()
    send(stdout, {"ready": True})
    while True:
        try:
            job = receive(stdin)
        except EOFError:   # the parent closed the pipe, or died
            return
        send(stdout, compile_job(job))


def main():
    # replies go through a private copy of stdout; anything printed while compiling goes to stderr
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
