"""Which CUDA graph a compiled graph's call replays (codegen -> **runtime**): one per shape and per place.

A CUDA graph replays the sizes it captured, and reads parameters and buffers where they lived at its capture.
One compiled graph may be called at several of either:
- a graph planned at symbolic sizes, at each shape;
- a graph Dynamo compiled once for a loop body that a graph break cuts into iterations, at each iteration, with
  that iteration's parameters as inputs. Hugging Face's LayerDrop check before each encoder layer (wav2vec2,
  HuBERT, Whisper) does this: one layer graph serves every layer. With one CUDA graph, every layer after the
  first came "at another address", and the layer graphs launched in every step.

So a call's key is its sizes and its *place*: where its parameters and buffers live, or for a backward, the
forward recording whose saved tensors it reads. Each key gets a recording of its own, a GraphedCall and its
ReplayTrial, decided by that key's calls. A backward whose forward ran without a recording has no place: it
launches.

Memory:
- the shapes of one place share a pool (SharedPool), so a place holds its largest shape's memory, not the sum;
- places do not share one. A training forward lends its saved tensors out of its pool until its backward runs,
  and every layer's forward runs before the first backward, so each place's memory is its own, as each layer's
  activations are in a launched step. A backward captures into its own forward's pool.
- Each place's trial reads the whole step's peak. The places run their trials in step (each place is called
  once a step), so each verdict weighs the step's memory with every place replaying.

Past MAX_PLACES places, or MAX_GRAPH_SHAPES shapes of one place, a call launches.
"""

from brrr.compile.fallbacks import warn_once
from brrr.compile.runtime.cuda_graphs import SharedPool

MAX_GRAPH_SHAPES = 8   # CUDA graphs a graph planned at symbolic sizes keeps per place, one per shape
MAX_PLACES = 64        # places a graph keeps CUDA graphs for (each holds memory; a model's layers, in practice)


class Recording:
    """One key's CUDA graph (a GraphedCall, or None: the call launches) and its trial (None once decided)."""

    __slots__ = ("graphed", "trial")

    def __init__(self, graphed=None, trial=None):
        self.graphed, self.trial = graphed, trial


class Recordings:
    """The recordings of one compiled graph by key, and the current one. `shape_key(args)`: the call's sizes (a
    graph planned at symbolic sizes), or None. `static`: the positions of the tensor parameters and buffers
    among a forward's or an inference graph's inputs. `backward`: the graph reads a forward's lent tensors."""

    def __init__(self, shape_key=None, static=(), backward=False):
        self.shape_key, self.static, self.backward = shape_key, tuple(static), backward
        self.keyed = shape_key is not None or bool(self.static) or backward
        self.by_key, self.pools = {}, {}
        self.key, self.current = None, Recording()

    def key_of(self, args, lent_from=None):
        """(sizes or None, place or None) of a call; `lent_from`: a backward's forward GraphedCall."""
        shape = self.shape_key(args) if self.shape_key is not None else None
        if self.backward:
            return shape, getattr(lent_from, "serial", None)
        return shape, tuple([args[i].data_ptr() for i in self.static]) if self.static else None

    def select(self, key):
        """Make `key`'s recording the current one. True when the key is new and may record (the caller then
        makes its GraphedCall, and this call launches, as a graph's first call does); False otherwise."""
        self.key = key
        known = self.by_key.get(key)
        if known is not None:
            self.current = known
            return False
        self.current = Recording()
        shape, place = key
        if self.backward and place is None:
            return False
        if shape is not None and sum(k[1] == place for k in self.by_key) >= MAX_GRAPH_SHAPES:
            warn_once(f"changing shapes: {MAX_GRAPH_SHAPES} shapes of this graph already have CUDA graphs; calls "
                      f"at other shapes launch their kernels")
            return False
        if len({k[1] for k in self.by_key} | {place}) > MAX_PLACES:
            warn_once(f"one graph called with its parameters at {MAX_PLACES} places already has a CUDA graph for "
                      f"each; calls at other places launch their kernels")
            return False
        return True

    def keep(self, graphed, trial):
        """The current key's new recording."""
        self.current = self.by_key[self.key] = Recording(graphed, trial)

    def pool(self):
        """The SharedPool of the current key's place (a graph planned at symbolic sizes), else None."""
        if self.shape_key is None:
            return None
        return self.pools.setdefault(self.key[1], SharedPool())

    def trial_of(self, graphed):
        """The undecided trial of the recording whose CUDA graph is `graphed`, or None."""
        for recording in self.by_key.values():
            if recording.graphed is graphed:
                return recording.trial
        return None

    def drop(self, key):
        """`key`'s CUDA graph goes (its memory once no loan holds it); its calls launch from now on."""
        recording = self.by_key.get(key)
        if recording is not None and recording.graphed is not None:
            recording.graphed.release()   # the trial's frames still hold the GraphedCall itself
            recording.graphed = None
