"""The direct launcher: after the first JIT launch it calls the compiled kernel's launcher with the same
arguments Triton would, and goes back to the JIT path whenever Triton would have specialized differently."""

import pytest
import torch

from brrr.compile.runtime import launch


class FakeKernel:
    def __init__(self, calls):
        self.calls = calls
        self.function, self.packed_metadata = "fn-handle", "packed"

    def run(self, *args):
        self.calls.append(("direct",) + args)


class FakeJIT:
    arg_names = ["in_ptr", "out_ptr", "n", "XBLOCK"]

    def __init__(self):
        self.calls = []
        self.kernel = FakeKernel(self.calls)

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.calls.append(("jit", grid, args, meta))
            return self.kernel
        return run


@pytest.fixture
def gpu_like(monkeypatch):
    """Pretend CPU tensors are device tensors on device 0 with stream 7."""
    monkeypatch.setattr(launch, "_device_tensor", lambda a: isinstance(a, torch.Tensor))
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(launch, "_current_stream", lambda device: 7)
    monkeypatch.setattr(launch, "_launch_hooks", lambda: (None, None))


def aligned(n):
    t = torch.empty(n + 16)
    return t[(16 - t.data_ptr() % 16) % 16 // 4:][:n] if t.data_ptr() % 16 else t[:n]


def test_second_launch_is_direct_with_triton_argument_order(gpu_like):
    jit = FakeJIT()
    k = launch.Launcher(jit, (4,), {"XBLOCK": 128, "num_warps": 4})
    a, b = aligned(8), aligned(8)
    k(a, b, 8)
    k(a, b, 8)
    assert jit.calls[0] == ("jit", (4,), (a, b, 8), {"XBLOCK": 128, "num_warps": 4})
    kind, *rest = jit.calls[1]
    assert kind == "direct"
    # grid x, y, z, stream, function, packed metadata, launch metadata, hooks, then every argument
    assert rest[:9] == [4, 1, 1, 7, "fn-handle", "packed", None, None, None]
    assert rest[9] is a and rest[10] is b and rest[11:] == [8, 128]


def test_misaligned_pointer_or_new_scalar_goes_through_the_jit(gpu_like):
    jit = FakeJIT()
    k = launch.Launcher(jit, (4,), {"XBLOCK": 128})
    a, b = aligned(9), aligned(8)
    k(a[:8], b, 8)
    k(a[1:], b, 8)       # 4 bytes off: Triton would compile an unaligned variant
    k(a[:8], b, 9)       # a different scalar value
    k(a[:8], b, 8)
    assert [c[0] for c in jit.calls] == ["jit", "jit", "jit", "direct"]


def test_no_direct_path_for_misaligned_first_launch_or_busy_hooks(gpu_like, monkeypatch):
    jit = FakeJIT()
    k = launch.Launcher(jit, (4,), {"XBLOCK": 128})
    a, b = aligned(9), aligned(8)
    k(a[1:], b, 8)
    k(a[:8], b, 8)
    assert [c[0] for c in jit.calls] == ["jit", "jit"]

    class Chain:
        calls = [print]
    monkeypatch.setattr(launch, "_launch_hooks", lambda: (Chain(), None))
    jit2 = FakeJIT()
    k2 = launch.Launcher(jit2, (4,), {"XBLOCK": 128})
    k2(a[:8], b, 8)
    k2(a[:8], b, 8)
    assert [c[0] for c in jit2.calls] == ["jit", "jit"]


def test_a_hook_attached_after_the_first_launch_sends_launches_through_the_jit(gpu_like, monkeypatch):
    class Chain:
        calls = []
    chain = Chain()
    monkeypatch.setattr(launch, "_launch_hooks", lambda: (chain, None))
    jit = FakeJIT()
    k = launch.Launcher(jit, (4,), {"XBLOCK": 128})
    a, b = aligned(8), aligned(8)
    k(a, b, 8)
    k(a, b, 8)
    chain.calls = [print]   # a profiler attaches
    k(a, b, 8)
    assert [c[0] for c in jit.calls] == ["jit", "direct", "jit"]


def test_only_arguments_the_call_did_not_allocate_are_checked_for_alignment(gpu_like):
    jit = FakeJIT()
    k = launch.Launcher(jit, (4,), {"XBLOCK": 128}, fresh_slots=(1,))
    a, b = aligned(9), aligned(9)
    k(a[:8], b[:8], 8)
    k(a[:8], b[1:], 8)    # slot 1 is allocated by the generated call just before: not read again
    k(a[1:], b[:8], 8)    # slot 0 (a graph input) moved off alignment: the JIT path
    assert [c[0] for c in jit.calls] == ["jit", "direct", "jit"]


def test_interpreter_or_cpu_tensors_always_use_the_jit():
    jit = FakeJIT()
    k = launch.Launcher(jit, (2,), {"XBLOCK": 16})
    a = torch.zeros(4)
    k(a, a, 4)
    k(a, a, 4)
    assert [c[0] for c in jit.calls] == ["jit", "jit"]


def test_graph_input_slots_read_unmoved_tensors_in_place_and_copy_the_rest():
    from brrr.compile.runtime.cuda_graphs import data_ptrs, input_slots

    param, x1, x2 = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    first = data_ptrs([param, x1, 3])
    assert input_slots(first, [param, x2, 3]) == ["address", "copy", None]
    assert input_slots(first, [x2, x2, 3]) == ["copy", "copy", None]


def test_graph_input_slots_read_only_static_inputs_in_place_where_they_are_known():
    from brrr.compile.runtime.cuda_graphs import data_ptrs, input_slots

    param, x = torch.zeros(4), torch.zeros(4)
    first = data_ptrs([param, x, 3])
    # x sits where it sat on the first call, but is no parameter: copied
    assert input_slots(first, [param, x, 3], static=(0,)) == ["address", "copy", None]
    assert input_slots(first, [param, x, 3], static=()) == ["copy", "copy", None]


def test_kernels_taken_by_torchs_static_launcher_launch_through_it(gpu_like, monkeypatch):
    calls = []

    class StaticKernel:
        function, num_warps, shared = "cu-function", 4, 0

    def fake_static(kernel, n_args, device, symbols=0):
        return (lambda *a: calls.append(a)), StaticKernel(), "OO", (None,)
    monkeypatch.setattr(launch, "static_kernel", fake_static)

    class TensorsOnly(FakeJIT):
        arg_names = ["in_ptr", "out_ptr", "XBLOCK"]
    jit = TensorsOnly()
    k = launch.Launcher(jit, (4, 2), {"XBLOCK": 128, "num_warps": 4})
    a, b = aligned(8), aligned(8)
    k(a, b)
    k(a, b)
    assert [c[0] for c in jit.calls] == ["jit"]        # the second launch went through the static launcher
    function, gx, gy, gz, warps, shared, tys, args, stream = calls[0]
    assert (function, gx, gy, gz, warps, shared, tys, stream) == ("cu-function", 4, 2, 1, 4, 0, "OO", 7)
    assert args[0] is a and args[1] is b and args[2:] == (None,)   # a scratch slot the kernel expects
    k(a[1:], b)                                        # misaligned: back through the JIT, as before
    assert [c[0] for c in jit.calls] == ["jit", "jit"]


def test_size_arguments_vary_directly_up_to_int32_then_take_the_jit(gpu_like, monkeypatch):
    """A symbolic graph's kernels take sizes as trailing arguments: launches with new sizes stay direct, through
    torch's static launcher with their int32 type, until a size no longer fits the int32 it was compiled for."""
    calls = []

    class StaticKernel:
        function, num_warps, shared = "cu-function", 4, 0
    offered = []

    def fake_static(kernel, n_args, device, symbols=0):
        offered.append((n_args, symbols))
        return (lambda *a: calls.append(a)), StaticKernel(), "OOi", ()
    monkeypatch.setattr(launch, "static_kernel", fake_static)
    jit = FakeJIT()
    k = launch.Launcher(jit, (1,), {"XBLOCK": 128, "num_warps": 4}, symbols=1)
    a, b = aligned(8), aligned(8)
    k(a, b, 300, grid=(3,))
    k(a, b, 17, grid=(1,))
    k(a, b, 2**31, grid=(2**31 // 128,))
    assert offered == [(3, 1)]
    assert [c[0] for c in jit.calls] == ["jit", "jit"] and jit.calls[1][2][2] == 2**31
    (function, gx, gy, gz, warps, shared, tys, args, stream), = calls
    assert (gx, tys, args[2]) == (1, "OOi", 17)


def test_static_launcher_declines_what_it_cannot_launch():
    class NotAKernel:
        pass
    assert launch.static_kernel(NotAKernel(), 2, 0) is None


def test_a_kept_binary_launches_from_the_first_call_and_loads_the_jit_only_when_a_call_needs_it(gpu_like):
    """A graph cache hit hands launchers their kernels' binaries: the first call launches directly, without
    Triton's JIT; a call the binary was not compiled for (a misaligned tensor) loads the JIT function then."""
    calls, loads = [], []

    class StaticKernel:
        function, num_warps, shared = "cu-function", 4, 0

    binary = (lambda *a: calls.append(a)), StaticKernel(), "OO", ()
    jit = FakeJIT()

    def load():
        loads.append(1)
        return jit
    k = launch.Launcher(None, (4,), {"XBLOCK": 128, "num_warps": 4}, load=load, binary=binary)
    a, b = aligned(8), aligned(8)
    k(a, b)
    k(a, b)
    assert len(calls) == 2 and not loads and not jit.calls
    assert calls[0][:8] == ("cu-function", 4, 1, 1, 4, 0, "OO", (a, b))
    k(a[1:], b)
    assert loads == [1] and [c[0] for c in jit.calls] == ["jit"]
    retuned = k.retuned(8)
    retuned(a, b)
    assert retuned.meta["num_warps"] == 8 and len(calls) == 2 and jit.calls[-1][3]["num_warps"] == 8


def test_a_kept_binary_is_refused_where_its_first_call_does_not_fit_it(gpu_like):
    class StaticKernel:
        function, num_warps, shared = "cu-function", 4, 0
    calls = []
    jit = FakeJIT()
    k = launch.Launcher(None, (4,), {"XBLOCK": 128}, load=lambda: jit,
                        binary=((lambda *a: calls.append(a)), StaticKernel(), "OOi", ()))
    a, b = aligned(8), aligned(8)
    k(a, b, 8)   # a scalar argument: not what a binary is kept for
    assert not calls and [c[0] for c in jit.calls] == ["jit"]


class KeptStatic:
    """Stands in for torch's static launcher class in a kept binary."""
    def __init__(self, cubin_path):
        self.cubin_path, self.arg_tys, self.name = cubin_path, "OO", "k"
        self.has_global_scratch = self.has_profile_scratch = False
        self.function = None

    def load_kernel(self, device):
        self.function = f"loaded on {device}"

    @property
    def C_impl(self):
        return type("C", (), {"_launch_kernel": "launch"})


def test_a_kept_binary_loads_only_with_its_own_cubin(tmp_path, monkeypatch):
    import hashlib
    import pickle

    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF kernel")
    state = dict(vars(KeptStatic(str(cubin))), cubin_digest=hashlib.sha256(cubin.read_bytes()).hexdigest())
    state.pop("function")
    blob = pickle.dumps((KeptStatic, state))
    launch_fn, sk, arg_tys, extra = launch.load_binary(blob, 3)
    assert (launch_fn, sk.function, arg_tys, extra) == ("launch", "loaded on 3", "OO", ())
    cubin.write_bytes(b"\x7fELF kern")          # truncated
    assert launch.load_binary(blob, 3) is None
    cubin.unlink()                               # gone
    assert launch.load_binary(blob, 3) is None
    assert launch.load_binary(b"not a pickle", 3) is None


def test_a_binary_that_fails_its_first_launch_leaves_the_launch_to_the_jit(gpu_like):
    """A kernel that cannot launch here (too much shared memory, say) fails on the JIT path, which reports it as a
    failed kernel for a re-plan; a binary that fails its first launch leaves that launch to the JIT."""
    class StaticKernel:
        function, num_warps, shared = "cu-function", 4, 0

    def refuse(*a):
        raise RuntimeError("CUDA error: too many resources requested for launch")
    jit = FakeJIT()
    k = launch.Launcher(None, (4,), {"XBLOCK": 128}, load=lambda: jit, binary=(refuse, StaticKernel(), "OO", ()))
    a, b = aligned(8), aligned(8)
    assert k(a, b) is jit.kernel
    assert [c[0] for c in jit.calls] == ["jit"] and k.binary is None


def test_a_warmed_launch_compiles_before_its_first_call_and_launches_the_binary(gpu_like, monkeypatch):
    """`warm` compiles a launch's kernel ahead (the floor warms its warp variants in threads at once) and the first
    call launches the binary, not the JIT."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    calls, warmed = [], []

    class StaticKernel:
        function, num_warps, shared = "cu-function", 8, 0

    class WarmableJIT(FakeJIT):
        def warmup(self, *dtypes, grid, **meta):
            warmed.append((dtypes, grid, meta))
            return "compiled-kernel"
    monkeypatch.setattr(launch, "binary_of", lambda kernel, n: b"blob" if kernel == "compiled-kernel" else None)
    monkeypatch.setattr(launch, "load_binary", lambda blob, device: ((lambda *a: calls.append(a)), StaticKernel(),
                                                                       "OO", ()) if blob == b"blob" else None)
    jit = WarmableJIT()
    k = launch.Launcher(jit, (4,), {"XBLOCK": 128, "num_warps": 4}, warm_dtypes=(torch.float32, torch.float32))
    variant = k.retuned(8)
    variant.warm(0)
    assert warmed == [((torch.float32, torch.float32), (4,), {"XBLOCK": 128, "num_warps": 8})]
    a, b = aligned(8), aligned(8)
    variant(a, b)
    assert len(calls) == 1 and not jit.calls
    launch.Launcher(jit, (4,), {"XBLOCK": 128}).warm(0)   # no dtypes known: nothing compiled ahead
    assert len(warmed) == 1


def test_launches_of_one_kernel_compile_once_and_share_its_binary(gpu_like, monkeypatch):
    """`warm_all` compiles each distinct kernel once: launches of one function with the same dtypes and meta (a
    repeated layer's) take the first one's binary; another warp count is another kernel."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    warmed = []

    class WarmableJIT(FakeJIT):
        def warmup(self, *dtypes, grid, **meta):
            warmed.append(meta["num_warps"])
            return f"kernel with {meta['num_warps']} warps"
    monkeypatch.setattr(launch, "binary_of", lambda kernel, n: kernel.encode())
    monkeypatch.setattr(launch, "load_binary", lambda blob, device: ("launch", blob.decode(), "OO", ()))
    jit = WarmableJIT()
    dtypes = (torch.float32, torch.float32)
    layers = [launch.Launcher(jit, (4 * i,), {"XBLOCK": 128, "num_warps": 4}, warm_dtypes=dtypes,
                              origin=("source", "brrr_add_0123abcd", "gpu")) for i in range(1, 4)]
    wider = layers[0].retuned(8)
    blobs = launch.warm_all(layers + [wider], 0, threads=2)
    assert sorted(warmed) == [4, 8]
    assert [k.binary[1] for k in layers] == ["kernel with 4 warps"] * 3 and wider.binary[1] == "kernel with 8 warps"
    assert blobs[layers[2]] == b"kernel with 4 warps"
