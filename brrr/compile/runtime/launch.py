"""Kernel launches for the generated runtime (lower -> schedule -> codegen -> **runtime**).

`fn[grid](*args, **meta)` on a Triton JITFunction binds arguments, rebuilds the specialization key and looks
up the kernel cache on every call: tens of microseconds of Python per launch, which made small compiled
graphs host-bound (the seed MLP's train step spent ~0.6 ms per step in it on the H100 host). A graph's
kernels, grids and dtypes are fixed once it is compiled, so after the first launch `Launcher` calls the
compiled kernel's own launcher directly.

What `JITFunction.run` would re-check per call, and what guards the direct path instead:
- pointer alignment (Triton specializes on 16-byte alignment): every tensor argument is checked against
  the first launch, which made the kernel; a misaligned one takes the JIT path, which compiles a variant;
- the values of non-tensor arguments: must equal the first launch's;
- the current device: the one the kernel was loaded on (CompiledGraph makes the graph's device current);
- launch hooks (profilers such as proton): any registered hook sends launches through the JIT path.
Under TRITON_INTERPRET=1 (or for an object that is not a compiled GPU kernel) every launch is the JIT path.

The direct launch itself goes through torch's static CUDA launcher (`torch._C._StaticCudaLauncher`, what
Inductor uses) when it takes the kernel: one C++ call per launch instead of Triton's Python launcher
(`CudaLauncher.__call__`, ~5-15 us per launch on the H100 hosts; BERT-base's backward launches ~180 kernels).
It takes kernels whose arguments are pointers, then a symbolic graph's size arguments; kernels with other
scalar arguments or launch attributes keep Triton's launcher. BRRR_STATIC_LAUNCH=0 turns it off.

A size argument is compiled as int32 when the first launch's value fits (Triton's rule for unspecialized
ints); a direct launch with a larger size would truncate it, so such a call takes the JIT path, which compiles
an int64 variant.

`tma_descriptor` makes the host-side TMA descriptors a matmul template kernel takes for its operands: the
generated call makes them per call, and the matmul stage when it times the template.
"""

import concurrent.futures
import functools
import hashlib
import os
import pickle

import torch

from brrr.compile.cache import cache_dir, load_kernel, write_atomic
from brrr.compile.fallbacks import KernelFailed
from brrr.compile.runtime import compile_workers, kernel_registry

_PLAIN = (int, float, bool, type(None))


def _current_device():
    return torch._C._cuda_getDevice()


def _current_stream(device):
    return torch._C._cuda_getCurrentRawStream(device)


def _device_tensor(a):
    return isinstance(a, torch.Tensor) and a.is_cuda


def _is_descriptor(a):
    """A host-side TMA descriptor (triton.tools.tensor_descriptor.TensorDescriptor)."""
    return type(a).__name__ == "TensorDescriptor"


def tma_descriptor(t, block, transposed, writes=False):
    """A TMA descriptor of matrix `t` (transposed first where its unit stride is its first), read in `block`
    tiles. TMA reads 16-byte aligned memory only: a tensor that arrives off that alignment (a graph input sliced
    at an odd offset) is read from an aligned copy. A descriptor the kernel `writes` through is of a buffer the
    graph allocated (aligned): a copy would lose the writes, so misalignment there is an error."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if t.data_ptr() % 16:
        if writes:
            raise RuntimeError(f"brrr: a TMA store into memory at {t.data_ptr():#x}, off 16-byte alignment")
        t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    return TensorDescriptor.from_tensor(t.t() if transposed else t, list(block))


def _hook_chain_idle(hook):
    return hook is None or (hasattr(hook, "calls") and not hook.calls)


def _launch_hooks():
    """(enter, exit) launch hooks as JITFunction.run passes them (Triton >= 3.4 keeps them in knobs)."""
    try:
        from triton import knobs

        return knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    except (ImportError, AttributeError):
        from triton.compiler import CompiledKernel

        return CompiledKernel.launch_enter_hook, CompiledKernel.launch_exit_hook


def _static_launcher_class():
    try:   # torch >= 2.12
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    except ImportError:
        from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel
    return StaticallyLaunchedCudaKernel


INT32_MAX = 2**31 - 1


def static_kernel(kernel, n_args, device, symbols=0):
    """(C launch function, static kernel, argument type codes, extra trailing args) to launch `kernel` with
    torch's static launcher, or None when it cannot (then Triton's own launcher is used). `symbols`: the
    trailing arguments that are sizes (int32 "i" or int64 "l")."""
    sk = _unloaded_static(kernel, n_args, symbols)
    return _loaded(sk, device) if sk is not None else None


def _unloaded_static(kernel, n_args, symbols=0):
    try:
        metadata = kernel.metadata
        if getattr(metadata, "launch_pdl", False) or getattr(metadata, "launch_cooperative_grid", False):
            return None
        if getattr(kernel, "_cubin_path", None) is None:
            kernel._cubin_path = _cubin_file(kernel)
        sk = _static_launcher_class()(kernel)
        pointers, sizes = sk.arg_tys[:n_args - symbols], sk.arg_tys[n_args - symbols:]
        if len(sk.arg_tys) != n_args or set(pointers) != {"O"} or not set(sizes) <= {"i", "l"}:
            return None   # other scalars or constants in the signature: Triton's launcher handles those
        return sk
    except Exception:
        return None


def _loaded(sk, device):
    try:
        sk.load_kernel(device)
        extra = tuple(None for flag in (sk.has_global_scratch, sk.has_profile_scratch) if flag)
        return sk.C_impl._launch_kernel, sk, sk.arg_tys + "O" * len(extra), extra
    except Exception:
        return None


_UNPICKLED = ("C_impl", "function", "module")   # the loaded module's handles, and the C launcher: per process


def binary_of(kernel, n_args):
    """`kernel` (a compiled Triton kernel of `n_args` tensor arguments) as bytes `load_binary` loads in another
    process without Triton's JIT (its cubin stays in brrr's cache), or None where torch's static launcher cannot
    launch it."""
    kept = getattr(kernel, "_brrr_binary", False)   # the launches of one function share its binary
    if kept is not False:
        return kept
    kernel._brrr_binary = blob = _binary(kernel, n_args)
    return blob


def _binary(kernel, n_args):
    sk = _unloaded_static(kernel, n_args)
    if sk is None:
        return None
    state = {k: v for k, v in vars(sk).items() if k not in _UNPICKLED}
    try:
        with open(sk.cubin_path, "rb") as f:
            state["cubin_digest"] = hashlib.sha256(f.read()).hexdigest()
        return pickle.dumps((type(sk), state))
    except Exception:
        return None


def load_binary(blob, device):
    """The static launch `binary_of` kept, loaded on CUDA device `device`; None where it cannot be (its cubin
    gone from the cache, another torch): the JIT then loads the kernel."""
    try:
        cls, state = pickle.loads(blob)
        with open(state["cubin_path"], "rb") as f:   # gone, truncated or corrupt: the JIT loads the kernel
            if hashlib.sha256(f.read()).hexdigest() != state.pop("cubin_digest"):
                return None
        sk = cls.__new__(cls)
        vars(sk).update(state)
        sk.function = sk.module = None
        return _loaded(sk, device)
    except Exception:
        return None


def _cubin_file(kernel):
    """The kernel's cubin on disk (the static launcher loads it from a path), next to brrr's kernel cache. As
    with kernel sources, a file is trusted only when it holds the kernel's bytes (else rewritten: truncated,
    corrupt)."""
    cubin = kernel.asm["cubin"]
    path = os.path.join(cache_dir(), "cubin", f"{kernel.hash}.cubin")
    try:
        with open(path, "rb") as f:
            whole = f.read() == cubin
    except OSError:
        whole = False
    if not whole:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, cubin)
    return path


def warm_all(launchers, device_index, strict=False, threads=1):
    """`Launcher.warm` for each of `launchers`, compiling each distinct kernel once (launches of one function
    with the same dtypes and meta share a binary), `threads` at a time; {launcher: binary or None}."""
    firsts, of = {}, {}
    for k in launchers:
        kernel = k.origin[:2] if k.origin else id(k._load if k._load is not None else k._jit_fn)
        key = (kernel, k.warm_dtypes, tuple(sorted(k.meta.items())))
        of[k] = firsts.setdefault(key, k)
    if threads > 1 and len(firsts) > 1:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(threads, len(firsts))) as pool:
            blobs = dict(zip(firsts.values(), pool.map(lambda k: k.warm(device_index, strict), firsts.values())))
    else:
        blobs = {k: k.warm(device_index, strict) for k in firsts.values()}
    for k, first in of.items():
        if k is not first and blobs[first] is not None:
            k.binary = load_binary(blobs[first], device_index)
    return {k: blobs[first] for k, first in of.items()}


class Launcher:
    """`launcher(*args)` == `jit_fn[grid](*args, **meta)`, without the JIT's per-call work once it has run.

    `jit_fn` may be None with `load` a function that returns it: a launcher given `binary` (a kernel loaded by
    `load_binary`, from the graph cache) launches it directly from its first call and loads the JIT function only
    when a call needs it (misaligned tensors, launch hooks, a retune). `origin` (module source, function name,
    device name) is where a kernel of brrr's comes from: `load` defaults to reading it from the kernel cache, and
    `warm` can compile it in a worker process (compile_workers.py)."""

    def __init__(self, jit_fn, grid, meta, name="kernel", fx_nodes=(), fresh_slots=(), symbols=0, load=None,
                 binary=None, warm_dtypes=None, origin=None):
        if load is None and origin is not None:
            load = functools.partial(load_kernel, *origin)
        self._jit_fn, self._load, self.origin = jit_fn, load, origin
        self.warm_dtypes = warm_dtypes   # its arguments' dtypes, to compile it before its first launch (`warm`)
        self.grid, self.meta = tuple(grid), dict(meta)
        self.name, self.fx_nodes = name, fx_nodes   # what a failed JIT launch reports (fallbacks.KernelFailed)
        # arguments the generated call allocates itself just before (the caching allocator's blocks are
        # aligned): only the others can change alignment between calls, so only they are checked per launch
        self.fresh_slots = frozenset(fresh_slots)
        self.symbols = symbols   # trailing size arguments (a symbolic graph's): they change between calls
        self.hook_chains = ()   # the launch hooks' chains seen at the first launch: idle then, re-checked
        self.grid3 = (self.grid + (1, 1))[:3]
        self.fast = None   # (run, function, packed_metadata, device index, tail args)
        self.static = None  # (C launch, static kernel, arg types, extra args) when torch's launcher takes it
        self.binary = binary   # the same, loaded before any launch
        self.try_static = os.environ.get("BRRR_STATIC_LAUNCH") != "0"   # read when the graph is built
        self.tensor_slots, self.plain_slots, self.plain_args = (), (), ()
        self.unproven = False   # whether direct launches with TMA descriptors have yet to be tried
        self.narrow_sizes = False   # whether the kernel took its size arguments as int32

    @property
    def jit_fn(self):
        if self._jit_fn is None:
            try:
                self._jit_fn = self._load()
            except Exception as e:
                if isinstance(e, torch.OutOfMemoryError):
                    raise
                raise KernelFailed(self.name, "compile", e, self.fx_nodes) from e
        return self._jit_fn

    def retuned(self, warps):
        """This kernel launched with `warps` warps (another binary: compiled by `warm` or at its first launch)."""
        return Launcher(self._jit_fn, self.grid, {**self.meta, "num_warps": warps}, name=self.name,
                        fx_nodes=self.fx_nodes, fresh_slots=self.fresh_slots, symbols=self.symbols, load=self._load,
                        warm_dtypes=self.warm_dtypes, origin=self.origin)

    def warm(self, device_index, strict=False):
        """Compile the kernel now (from any thread, where its dtypes are known) and launch its binary from the first
        call; returns the binary as `binary_of` keeps it, or None. Where compiling fails, the first launch compiles
        it and reports what fails; `strict`: a kernel that cannot compile raises here. A compile worker compiles
        it where one can (then this process never loads the JIT function for it); where the worker cannot, this
        process compiles it, and raises what failed."""
        if self.warm_dtypes is None or device_index is None or os.environ.get("TRITON_INTERPRET") == "1":
            return None
        if self.origin is not None and not self.symbols and compile_workers.pool() is not None:
            blob = compile_workers.compile_binary(*self.origin, self.warm_dtypes, self.meta,
                                                  compile_workers.target_of(device_index))
            loaded = load_binary(blob, device_index) if blob is not None else None
            if loaded is not None:
                self.binary = loaded
                return blob
        from triton.compiler.errors import CompilationError

        try:   # dtypes stand in for the tensors: the first launch passes aligned tensors of these dtypes
            kernel = self.jit_fn.warmup(*self.warm_dtypes, grid=self.grid, **self.meta)
        except CompilationError:
            if strict:
                raise
            return None
        except Exception:
            return None
        blob = binary_of(kernel, len(self.warm_dtypes)) if not self.symbols else None
        self.binary = load_binary(blob, device_index) if blob is not None else None
        return blob

    def __call__(self, *args, grid=None):
        """Launch on `args`; `grid` (a symbolic graph's kernels) is this call's grid, else the one built in."""
        fast = self.fast
        if fast is None and self.binary is not None:
            fast = self._prepare_binary(args)
            if fast:
                return self._first_binary_launch(args, grid)
        if fast and self._fits(args):
            static = self.static
            g0, g1, g2 = self.grid3 if grid is None else (tuple(grid) + (1, 1))[:3]
            if static is not None:
                launch, sk, arg_tys, extra = static
                launch(sk.function, g0, g1, g2, sk.num_warps, sk.shared, arg_tys, args + extra,
                       _current_stream(fast[3]))
                return None
            run, function, packed, device, tail = fast
            # no launch metadata and no hooks: _fits saw both hook chains empty
            if self.unproven:   # TMA descriptors in the arguments: the first direct launch proves Triton takes them
                try:
                    run(g0, g1, g2, _current_stream(device), function, packed, None, None, None, *args, *tail)
                except (TypeError, ValueError, AttributeError):   # raised before launching: the JIT path serves
                    self.fast = False
                    return self.jit_fn[(g0, g1, g2)](*args, **self.meta)
                self.unproven = False
                return None
            run(g0, g1, g2, _current_stream(device), function, packed, None, None, None, *args, *tail)
            return None
        try:
            hook = kernel_registry.LAUNCH_HOOK   # set only while brrr.analyze traces a CPU step
            if hook is None:
                kernel = self.jit_fn[self.grid if grid is None else tuple(grid)](*args, **self.meta)
            else:
                with hook(self.name):
                    kernel = self.jit_fn[self.grid if grid is None else tuple(grid)](*args, **self.meta)
        except Exception as e:   # compiling or launching failed: the graph can re-plan without this kernel
            if isinstance(e, torch.OutOfMemoryError):
                raise
            raise KernelFailed(self.name, "launch", e, self.fx_nodes) from e
        if fast is None and self.fast is None:
            self._prepare(kernel, args)
        return kernel

    def _fits(self, args):
        # the current device is the kernel's: CompiledGraph makes the graph's device current for the call
        for chain in self.hook_chains:
            if chain.calls:
                return False
        for i in self.tensor_slots:
            if args[i].data_ptr() & 15:
                return False
        if self.narrow_sizes and max(args[-self.symbols:]) > INT32_MAX:
            return False   # compiled for int32 sizes: the JIT path compiles the int64 variant
        return not self.plain_slots or tuple(args[i] for i in self.plain_slots) == self.plain_args

    def _prepare_args(self, args):
        """Keep what `_fits` checks per call, when the first launch's `args` allow direct launches; else False."""
        descriptors = {i for i, a in enumerate(args) if _is_descriptor(a)}
        if not all(_device_tensor(a) or type(a) in _PLAIN or i in descriptors for i, a in enumerate(args)):
            return False
        enter, exit_ = _launch_hooks()
        if any(isinstance(a, torch.Tensor) and a.data_ptr() & 15 for a in args) or \
                not (_hook_chain_idle(enter) and _hook_chain_idle(exit_)):
            return False
        self.tensor_slots = tuple(i for i, a in enumerate(args)
                                  if isinstance(a, torch.Tensor) and i not in self.fresh_slots)
        self.hook_chains = tuple(h for h in (enter, exit_) if h is not None)
        # a descriptor is made afresh for each call (it holds its tensor's address), so it is never compared
        sized = range(len(args) - self.symbols, len(args))
        self.plain_slots = tuple(i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)
                                 and i not in descriptors and i not in sized)
        self.plain_args = tuple(args[i] for i in self.plain_slots)
        self.unproven = bool(descriptors)
        self.narrow_sizes = bool(self.symbols) and max(args[len(args) - self.symbols:]) <= INT32_MAX
        return True

    def _prepare_binary(self, args):
        """The direct launch of the loaded binary, from the first call (no JIT), where its arguments allow one:
        a binary is loaded for kernels of tensor arguments only, compiled for aligned ones."""
        binary, self.binary = self.binary, None
        if self.try_static and self._prepare_args(args) and not self.plain_slots and not self.unproven \
                and not self.symbols:
            self.static = binary
            self.fast = (None, None, None, _current_device(), ())
        return self.fast

    def _first_binary_launch(self, args, grid):
        """The binary's first launch; where it fails (the kernel cannot launch here), the JIT path launches instead
        and reports the failure as a failed kernel, which a re-plan answers."""
        launch, sk, arg_tys, extra = self.static
        g0, g1, g2 = self.grid3 if grid is None else (tuple(grid) + (1, 1))[:3]
        try:
            launch(sk.function, g0, g1, g2, sk.num_warps, sk.shared, arg_tys, args + extra,
                   _current_stream(self.fast[3]))
        except Exception as e:
            if isinstance(e, torch.OutOfMemoryError):
                raise
            self.fast = self.static = None
            return self(*args, grid=grid)
        return None

    def _prepare(self, kernel, args):
        """Keep what a direct launch needs, when the first launch compiled a GPU kernel from aligned tensors."""
        self.fast = False   # prepared (or refused) once
        try:
            names = list(self.jit_fn.arg_names)
            run, function, packed = kernel.run, kernel.function, kernel.packed_metadata
        except Exception:   # the interpreter, or a Triton whose kernels look different: keep the JIT path
            return
        tail_names = names[len(args):]   # the constexprs; meta's other keys (num_warps) are compile options
        if any(n not in self.meta for n in tail_names) or not self._prepare_args(args):
            return
        self.fast = (run, function, packed, _current_device(), tuple(self.meta[n] for n in tail_names))
        if self.try_static and not self.plain_slots and not self.unproven:
            self.static = static_kernel(kernel, len(args), self.fast[3], self.symbols)
