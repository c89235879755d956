"""CUDA-graph replay of one generated call (lower -> schedule -> codegen -> **runtime**), for cuda_graphs=True.

A replay costs one launch however many kernels the graph holds, so a graph of hundreds of small launches
stops being bound by the host. What a replay must get right:
- Inputs. The graph reads fixed addresses. A parameter or buffer (AOTAutograd's static inputs, where the graph
  knows them; else an input whose address was the same on the first two calls) is read where it lives. Where
  AOTAutograd knows them, the caller keeps a graph per place of them (recordings.py: one layer graph that every
  layer calls, each with its own parameters); else a replay with that input elsewhere is refused, and the call
  runs without the graph. Any other input is copied into
  a private buffer before each replay. (An activation from another graph, such as the previous piece of a
  model DDP's graph splitting cut in pieces, may sit at one address for two calls and move on the third; read
  in place it would have stopped the graph replaying for good.) A graph never
  writes into an input (AOTAutograd applies input mutations outside the compiled graph).
- Host inputs. A capture cannot copy from pageable host memory. An input on the host that the call only copies
  to the device (host_copies.py says which) is staged: copied into device memory of the graph's own before
  each replay, outside the capture, so the captured copy is device to device. A call that reads host data any
  other way (or runs an op such as ctc_loss that copies host data over itself) is never captured: it
  launches, and `failure` says why (replay_choice logs it as the verdict's reason).
- Expanded tensors (elements sharing memory, e.g. a mask broadcast before the graph). The graph's copy of
  such an input keeps its strides (the call holds inputs to their traced strides, and copying a dense copy into
  an expanded buffer fails), and is refreshed by copying the memory it spans; one laid out otherwise launches.
  Such an output is copied out the same way, keeping eager's strides.
- An output that is a view of an input read in place (a parameter's transpose saved for the backward) is
  rebuilt on each replay as the same view of *this* call's input: the tensor seen at capture may since have
  been freed, with its memory handed to the one now at that address (FSDP2 frees each block's gathered
  parameters after its forward and gathers the next block's into the same memory). Such views are the
  caller's memory, never copied and never part of a loan.
- Other outputs live in the graph's private memory and the next replay overwrites them, so each replay returns
  copies: the caller may keep outputs as long as it likes. The exception is outputs *lent* to the lean
  training runtime (the tensors a forward graph saves for its backward): they are returned as they are, and
  before the next replay overwrites them, any loan whose backward may still run gets its own copies
  (`Loan.settle`). A training loop pays no copies; gradient accumulation (several forwards, then the
  backwards) pays one per pending forward.
- A backward graph's outputs, the gradients, are *given*: returned as the graph's memory (fresh tensors over
  it, which autograd makes the parameters' .grad without a copy), not copied. Copies would hold every
  gradient twice, the graph's and the caller's (GPT-2's training step: +237 MiB at its peak). A replay that
  would overwrite given memory something still holds (a .grad kept across steps, a view of one) does not
  run: that call launches its kernels into fresh memory, and from then on the graph copies its outputs out.
  A backward captures into its forward's pool, so the forward's replay checks the same (`sharers`). The lean
  runtime turns a kept .grad into a copy before the forward replays (gradient accumulation), so a
  training loop that zeroes its gradients, or accumulates them, keeps replaying.
- Inputs the call updates (batch norm's running statistics, `write_back`): where read in place, their new values
  are copied into them inside the graph, recorded at its capture, so a replay neither clones those outputs nor
  copies them back on the host (DenseNet121's amp step: 728 copies a step, its replayed step 23.1 -> 13.2 ms);
  an input copied in is the graph's own copy, and the caller writes that one back.
- Capture runs on the second call (the first one checked the kernels) with thread-local capture mode,
  because a backward graph is captured on autograd's device thread while other threads may run.
- A graph planned at symbolic sizes captures one CUDA graph per shape it replays (recordings.py), and those
  graphs share one memory pool (`SharedPool`): the graph's memory is the largest shape's, not the sum of all.
  Any one of them replaying may then overwrite what another left in the pool, which is harmless for outputs
  copied out, and for lent outputs is why every pending loan of the pool is settled before any member replays.
- One pool per training step. A backward graph captures into its forward graph's pool (`after`), as torch's
  `make_graphed_callables` does, and consumes the saved tensors (`consume`): the lean runtime hands them over, the
  capture call frees each at its last use, and the pool hands its memory to the backward's later buffers. The
  forward lends the real tensors on its capture call only, and keeps aliases of their memory (storages at the
  same address that free nothing): the saved tensors are allocated once, in the capture, and nothing of brrr's
  holds them, so the step's graphs hold about what a launched step allocates at its peak, not the saved tensors
  plus the backward's buffers. (ResNet-18's training step held its 976 MiB of saved tensors between steps,
  against 173 launched.) What this asks for:
  - the backward replays only right after its forward replayed (`pinned_ready`), reading the lent memory in
    place; a replay then overwrites it, so a graph retained for another backward (`saved_kept`) launches;
  - it captures only while the tensors its forward's capture call lent are alive: freed earlier, their memory
    is the pool's to hand out, and the capture could overwrite it before reading it;
  - a pending loan whose backward may still run gets copies before a replay overwrites it, and before the
    graph (with its pool) is released.
"""

import itertools
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from brrr.compile.runtime.write_back import write_back

MAX_REFUSALS = 3   # replays refused for a moved input before the graph is dropped for good
SERIALS = itertools.count(1)   # names each GraphedCall: a backward's recordings are keyed by their forward's


def input_slots(first_ptrs, args, static=None):
    """Per argument: "address" (read in place), "copy" (copied in before each replay), or None (no tensor).
    `static`: the positions of parameters and buffers, or None where unknown; then an input at the same memory
    as on the first call is read in place."""
    slots = []
    for i, (first, a) in enumerate(zip(first_ptrs, args)):
        if not isinstance(a, torch.Tensor):
            slots.append(None)
        elif static is not None:
            slots.append("address" if i in static else "copy")
        else:
            slots.append("address" if first is not None and a.data_ptr() == first else "copy")
    return slots


def data_ptrs(args):
    return [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]


def input_views(inputs, outputs, slots):
    """{output position: input position} for outputs that share memory with an input read in place (slot
    "address"; a "consumed" input was freed inside the graph, and its memory may be an output's since)."""
    storages = {a.untyped_storage().data_ptr(): j for j, (a, slot) in enumerate(zip(inputs, slots))
                if slot == "address" and a.untyped_storage().nbytes() > 0}
    return {i: storages[o.untyped_storage().data_ptr()] for i, o in enumerate(outputs)
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in storages}


def view_of_current(captured_view, captured_input, current_input):
    """The view `captured_view` had of `captured_input`, taken of `current_input` (same address, maybe
    another tensor)."""
    offset = current_input.storage_offset() + captured_view.storage_offset() - captured_input.storage_offset()
    return current_input.as_strided(captured_view.size(), captured_view.stride(), offset)


class Loan:
    """Outputs of one replay handed to a backward without copies, and the marker that says whether it may still
    read them.

    `marker` is a tensor that only the backward's saved state holds (`ctx.save_for_backward(marker)`): autograd
    drops it when it frees the node's saved tensors (the backward ran without retain_graph) or the node itself,
    and the weak reference then reads None. `settle()` runs before the next replay: while the marker lives,
    the tensors are replaced by copies. (Asking the ctx for its saved tensors would tell the same, but once
    they are freed it raises, and a C++ error costs ~10-20 us of host time in every step.)"""

    def __init__(self, tensors, marker):
        self.tensors, self.marker = list(tensors), weakref.ref(marker)
        self.copied = False
        self.callers = frozenset()   # positions holding the caller's own memory (views of its inputs)

    def take(self):
        """The tensors, handed over to a backward that frees them (the loan holds them no more)."""
        tensors, self.tensors = self.tensors, []
        return tensors

    def settle(self):
        if self.copied or self.marker() is None:
            return
        self.tensors = [copy_keeping_layout(t) if isinstance(t, torch.Tensor) and i not in self.callers else t
                        for i, t in enumerate(self.tensors)]
        self.copied = True


def overlaps(t):
    """Whether elements of t share memory (an expanded tensor): `copy_` cannot write into such a tensor, and
    `clone` makes it dense."""
    return torch._debug_has_internal_overlap(t) == 1


def extent(t):
    """Elements from t's first to its last in its storage (0 for an empty t)."""
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0


def span(t):
    """The memory t's elements span, from its first element to its last, as one flat tensor."""
    return t.as_strided((extent(t),), (1,), t.storage_offset())


def copy_keeping_layout(t, device=None, pinned=False):
    """A copy of t with its exact sizes and strides (an expanded tensor stays expanded) on `device` (t's own by
    default): the memory t spans, copied, with t's view rebuilt over it. `pinned`: a copy of a GPU tensor to the
    host goes to page-locked memory, copied without waiting (stream-ordered, as a copy back from it is)."""
    flat = span(t)
    device = device if device is not None else t.device
    pinned = pinned and t.is_cuda and device.type == "cpu"
    try:
        copy = torch.empty(flat.shape, dtype=t.dtype, device=device, pin_memory=pinned)
    except RuntimeError:   # page-locked memory refused (a host short of it): pageable, copied in turn
        pinned = False
        copy = torch.empty(flat.shape, dtype=t.dtype, device=device)
    copy.copy_(flat, non_blocking=pinned or (flat.device.type == "cpu" and flat.is_pinned()))
    return torch.empty(0, dtype=t.dtype, device=copy.device).set_(copy.untyped_storage(), 0, t.size(), t.stride())


def alias(t):
    """t over the same memory, holding none of it (a storage at t's address that frees nothing): what a graph
    keeps of memory its pool owns, so that the allocator may hand it out again inside a capture into that pool."""
    storage = t.untyped_storage()
    memory = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(memory, t.storage_offset(), t.size(), t.stride())


class Given:
    """An output a replay gives out as the graph's memory: its position, a weak reference to its storage, and
    how many references the graph itself holds to that storage (more means the caller still holds it)."""

    __slots__ = ("position", "ref", "own", "data_ptr")

    def __init__(self, position, tensor):
        """Made while only the graph holds `tensor` (at capture)."""
        self.position, self.data_ptr = position, tensor.untyped_storage().data_ptr()
        self.ref = StorageWeakRef(tensor.untyped_storage())
        self.own = torch._C._storage_Use_Count(self.ref.cdata)

    def held(self):
        return torch._C._storage_Use_Count(self.ref.cdata) > self.own


class SharedPool:
    """The CUDA memory pool that several GraphedCalls capture into (one per shape of a symbolic graph), and the
    members whose loans any one's replay must settle first."""

    def __init__(self):
        self.handle = None    # the first member's pool, once it has captured
        self.members = []     # weak references to the GraphedCalls capturing into it

    def join(self, graphed):
        self.members.append(weakref.ref(graphed))

    def settle_loans(self):
        for ref in self.members:
            member = ref()
            if member is not None and member.loans:
                member._settle_loans()


class GraphedCall:
    """`graphed(args)` -> outputs replayed from a CUDA graph, or None when these args cannot use it.

    Outputs at the positions in `lend` are returned uncopied; the caller tracks them with `track(Loan)`.
    Inputs at the positions in `pin` are another graph's lent outputs (a backward reading what its forward
    saved): they are read where they are, and the graph is used only while `pinned_ready` says they are
    still the lent memory (no replay of the forward has copied them away since). `pool`: a SharedPool to capture
    into, shared with other GraphedCalls (else the graph's memory is its own). `after`: the GraphedCall whose
    replay this one's always follows (a backward's forward): with no SharedPool, it captures into that one's
    pool, if that one has captured. `static`: the positions of the parameters and buffers among the inputs,
    where known (input_slots). `give`: return the outputs that are not lent as the graph's memory instead of
    copies (a backward's gradients; see Given), with no SharedPool only. `host`: the call's host_copies.HostCopies
    (inputs on the host it copies to the device, staged into device memory before each replay; or why it
    cannot be captured). `first_ptrs`: the first call's input addresses, where that call freed its inputs.
    `placed`: the caller keys its graphs by the addresses of the `static` inputs (recordings.py), so they are
    not checked here. `failure` says why the graph could not capture, once it could not. `release()` gives its
    memory back."""

    def __init__(self, call, first_args, lend=(), pin=(), pool=None, after=None, static=None, give=False,
                 host=None, first_ptrs=None, consume=False, write_back=(), placed=False):
        self.call, self.serial, self.placed = call, next(SERIALS), placed and static is not None
        self.first_ptrs = first_ptrs if first_ptrs is not None else data_ptrs(first_args)
        self.static_positions = frozenset(static) if static is not None else None
        self.pool = pool
        self.after = weakref.ref(after) if after is not None else None
        if pool is not None:
            pool.join(self)
        self.graph, self.failed, self.refusals = None, False, 0
        self.lend, self.loans = frozenset(lend), []
        self.pin, self.pinned_ready = frozenset(pin), True
        self.views, self.rebuilt = {}, frozenset()   # outputs viewing inputs read in place; the last replay's
        self.give = give and pool is None
        self.given = ()     # Given records of the outputs the last replays gave out, until nothing holds them
        self.sharers = []   # weak references to the GraphedCalls captured into this one's pool (`after`)
        self.host, self.failure = host, None
        # a backward reading its forward's saved tensors in that forward's pool (`after`), handed over by the
        # caller: its capture frees each at its last use, so the step's pool holds them once (see `consume`)
        self.consume = consume and bool(pin) and pool is None and after is not None
        self.saved_kept = False   # set by the caller: the saved tensors are kept for another backward
        self.lent_at_capture = ()   # StorageWeakRefs of the real tensors the capture call lent (a forward) ...
        self.lent_ptrs = frozenset()   # ... and their addresses
        self.write_back = tuple(write_back)   # (output, input) per input the call updates (compiled.CompiledGraph)
        self.written = {}   # output -> input for those written inside the graph (the input read in place)

    def _after_pool(self):
        leader = self.after() if self.after is not None else None
        return leader.graph.pool() if leader is not None and leader.graph is not None else None

    def track(self, loan):
        rebuilt = self.rebuilt
        loan.callers = frozenset(i for i, t in enumerate(loan.tensors) if id(t) in rebuilt)
        self.loans.append(weakref.ref(loan))

    def _settle_loans(self):
        for ref in self.loans:
            loan = ref()
            if loan is not None:
                loan.settle()
        self.loans.clear()

    @property
    def usable(self):
        return not self.failed and self.refusals < MAX_REFUSALS

    def __call__(self, args):
        if self.pin and not self.pinned_ready:
            self.failure = "the saved tensors it reads were not lent by its forward's replay"
            return None
        if self.consume and self.saved_kept:
            self.failure = "the saved tensors are kept for another backward (retain_graph), which a replay consumes"
            return None
        if self.graph is None:
            if not self._capture(args):
                return None
            return self._replay_captured()
        for i, ptr in self.addressed:
            if args[i].data_ptr() != ptr:
                self.refusals += 1
                self.failure = (f"input {i} ({tuple(args[i].shape)}), read in place as a parameter or buffer, "
                                f"came at another address")
                return None
        if self._overwrites_held():
            self.failure = "a replay would overwrite memory it gave out that is still held"
            return None
        if self.pool is not None:
            self.pool.settle_loans()   # any member's memory may be this replay's
        elif self.loans:
            self._settle_loans()   # before anything overwrites the graph's memory
        for i, static in self.spanned_in:
            if args[i].stride() != static.stride():
                return None   # an expanded input, now laid out otherwise: launching does what it always does
        for i, static, ptr, flat in self.copied_in:
            a = args[i]
            if a.data_ptr() != ptr:
                if flat is not None:
                    flat.copy_(span(a), non_blocking=True)
                else:   # from the host (staged), the copy neither waits for the device nor leaves `a` read later
                    static.copy_(a, non_blocking=True)
        return self._replay(args)

    def _replay_captured(self):
        """The capture call's replay: its inputs are the graph's own (copied in just now, or handed over)."""
        if self.pool is not None:
            self.pool.settle_loans()
        out = self._replay(self.static)
        if self.lend and self.after is None and self.pool is None:
            # The capture call lends the real tensors; from now on the graph holds its lent outputs as aliases of
            # their memory, which a backward consuming them frees into this pool (`consume`)
            # (a view of an input read in place is the caller's memory, rebuilt on each replay: never aliased)
            pooled = [i for i, o in enumerate(self.static_out)
                      if i in self.lend and i not in self.views and isinstance(o, torch.Tensor)]
            self.lent_at_capture = tuple(StorageWeakRef(self.static_out[i].untyped_storage()) for i in pooled)
            self.lent_ptrs = frozenset(self.static_out[i].untyped_storage().data_ptr() for i in pooled)
            self.static_out = [alias(o) if i in pooled else o for i, o in enumerate(self.static_out)]
        return out

    def _replay(self, args):
        self.graph.replay()
        out = list(self.static_out)
        if self.give:
            for i in self.cloned:
                out[i] = out[i].detach()   # a tensor of its own: autograd's .grad takes it as it is
            self.given = self.gifts
        else:
            spanned = self.spanned_out
            for i in self.cloned:
                out[i] = copy_keeping_layout(out[i]) if i in spanned else out[i].clone()
        for i, j in self.written.items():
            out[i] = args[j]   # written inside the graph: the caller's input, updated
        views = self.views
        if views:
            for i, j in views.items():
                out[i] = view_of_current(out[i], self.static[j], args[j])
            self.rebuilt = frozenset(id(out[i]) for i in views)
        return tuple(out)

    def held_gifts(self):
        """The Given records of outputs a replay gave out that something besides the graph still holds."""
        held = [g for g in self.given if g.held()]
        if not held:
            self.given = ()
        return held

    def _overwrites_held(self):
        """Whether replaying now would overwrite outputs given out (by this graph, or by one captured into its
        pool) that something still holds. That graph then copies its outputs out from now on."""
        for member in (self, *(r() for r in self.sharers)):
            if member is not None and member.given and member.held_gifts():
                member.give = False
                return True
        return False

    def release(self):
        """Never replay again, and let go of the graph, its copies of the inputs and its outputs: their memory
        goes back once nothing else holds it (a loan's backward still reading what it lent, a .grad it gave).
        Lent memory that is the graph's pool's alone (aliases) goes with the pool: a loan whose backward may still
        read it gets copies first."""
        if self.lent_at_capture:
            self._settle_loans()
        self.failed, self.failure = True, self.failure or "released"
        self.graph, self.static, self.static_out, self.gifts, self.given = None, (), (), (), ()
        self.copied_in, self.addressed, self.views = (), (), {}
        self.loans.clear()

    def refused(self):
        """Why this graph can never be captured, known before trying (a call's host work), or None."""
        host = self.host
        if host is not None and host.blocker:   # a capture would fail, or replay host work done once
            self._fail(host.blocker)
            return host.blocker
        return None

    def _capture(self, args):
        if self.refused():
            return False
        host = self.host
        staged = frozenset(host.staged) if host is not None else ()
        try:
            self.slots = [("stage" if i in staged else "address" if i in self.pin else slot) for i, slot in
                          enumerate(input_slots(self.first_ptrs, args, self.static_positions))]
            self.static = [_static_input(a, slot, host) for slot, a in zip(self.slots, args)]
            self.static_ptrs = data_ptrs(self.static)
            pool = self.pool.handle if self.pool is not None else self._after_pool()
            if pool is not None and self.after is not None and self.pool is None:
                leader = self.after()
                if any(ref.expired() for ref in getattr(leader, "lent_at_capture", ())):
                    # their memory is free in the pool: this capture could hand it out before reading it
                    return self._fail("the saved tensors its forward's capture lent were freed before it captured")
            inputs = self.static
            # consumed only into the forward's pool: freed into any other, their memory could be handed to
            # another allocation before this call's replay reads it
            self.consume = self.consume and pool is not None
            if self.consume:   # handed over: the graph reads them at their addresses and holds none of them
                self.static = [alias(a) if i in self.pin else a for i, a in enumerate(inputs)]
                args.clear()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    # consumed, each is freed at its last use, and the pool hands its memory to what follows
                    self.static_out = self.call(inputs, True) if self.consume else self.call(inputs)
                    self.written = self._write_back_inside(inputs)
            except Exception:
                if self.consume:   # the launch that follows reads them where they still are
                    args[:] = self.static
                raise
            if self.pool is not None and pool is None:
                self.pool.handle = graph.pool()
            # a consumed input's memory may come back as an output's (the pool reused it): never a view of it
            self.views = input_views(self.static, self.static_out,
                                     [("consumed" if self.consume and i in self.pin else slot)
                                      for i, slot in enumerate(self.slots)])
            # per replay: the inputs that must not have moved, those copied in, the outputs copied out
            placed = self.static_positions if self.placed else ()
            self.addressed = [(i, ptr) for i, (slot, ptr) in enumerate(zip(self.slots, self.static_ptrs))
                              if slot == "address" and i not in placed]
            self.copied_in = [(i, s, ptr, span(s) if overlaps(s) else None) for i, (slot, s, ptr) in
                              enumerate(zip(self.slots, self.static, self.static_ptrs)) if slot in ("copy", "stage")]
            self.spanned_in = [(i, s) for i, s, _, flat in self.copied_in if flat is not None]
            self.cloned = [i for i, o in enumerate(self.static_out) if isinstance(o, torch.Tensor)
                           and i not in self.lend and i not in self.views and i not in self.written]
            self.spanned_out = frozenset(i for i in self.cloned if overlaps(self.static_out[i]))
            self.gifts = [Given(i, self.static_out[i]) for i in self.cloned] if self.give else ()
            leader = self.after() if self.after is not None else None
            if pool is not None and leader is not None and self.pool is None:
                leader.sharers.append(weakref.ref(self))
            self.graph = graph
            return True
        except Exception as e:
            return self._fail(f"CUDA graph capture failed ({type(e).__name__}: {str(e)[:120]})")

    def _write_back_inside(self, inputs):
        """Inside the capture: the new values of the inputs read in place (parameters and buffers), copied into
        them, so that every replay updates them with no copy on the host. An input copied in is the graph's own
        copy: the caller writes that one back after the replay."""
        written = {i: j for i, j in self.write_back if self.slots[j] == "address"}
        if written:
            write_back([inputs[j] for j in written.values()], [self.static_out[i] for i in written])
        return written

    def _fail(self, why):
        from brrr.compile.fallbacks import warn_once

        warn_once(f"{why}; launching kernels directly")
        self.failed, self.failure = True, why
        return False


def _static_input(a, slot, host):
    """The graph's own copy of input `a` (`a` itself where read in place). An expanded input keeps its strides,
    which the call holds its inputs to (compiled.layout); a host input is staged on the graph's device."""
    if slot == "stage":
        return copy_keeping_layout(a, host.device)
    if slot == "copy":
        return copy_keeping_layout(a) if overlaps(a) else a.clone()
    return a
