"""Where Dynamo split the program (**capture**, before brrr's backend sees a graph; read by explain and the zoo).

A graph break ends one captured graph and starts another; the Python between them runs as plain PyTorch, and
nothing fuses across the break. That can cost more than any kernel: GPT-2's loss behind a logging call in
Hugging Face's `loss_function` leaves the head's logits as the first graph's output, so brrr can neither fuse
them into the loss nor avoid storing them.

Dynamo tells a backend why a graph ended (`gm.compile_subgraph_reason`, with the user's stack) but keeps the
message of the unsupported construct, with its hint, in its `graph_break` counter. `note_graph(gm)`, called as
each graph reaches brrr's backend, joins the two: the break's place in the user's code and Dynamo's own words.
Every break is logged here, process-wide, like fallbacks.LOG.
"""

import os
from dataclasses import dataclass

LOG = []        # GraphBreak records of every graph brrr was handed, in order
_counted = {}   # Dynamo's graph_break counter as of the last graph: what is new since belongs to the next


@dataclass(frozen=True)
class GraphBreak:
    where: str      # "modeling_gpt2.py:703 in forward", or "" where Dynamo gave no user frame
    reason: str     # Dynamo's first line
    hint: str = ""  # Dynamo's hint lines, joined

    def __str__(self):
        text = f"{self.where or 'somewhere in the compiled function'}: {self.reason}"
        return text + (f" (hint: {self.hint})" if self.hint else "")


def _counter():
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return dict(counters.get("graph_break", {}))


def _messages_since_last():
    global _counted
    now = _counter()
    new = [msg for msg, n in now.items() if n > _counted.get(msg, 0)]
    _counted = now
    return new


def resync():
    """Forget the counter's messages so far: breaks logged by other backends before now are not brrr's."""
    global _counted
    _counted = _counter()


def split_message(message):
    """(first line, hint) of a Dynamo graph-break message; the hint is '' where the message has none."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    hints = [line[len("Hint:"):].strip() for line in lines if line.startswith("Hint:")]
    return (lines[0] if lines else str(message)), " ".join(hints)


def _place(frame):
    return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"


def note_graph(gm):
    """Log the graph break that ended `gm`, if one did; returns the GraphBreak records added."""
    messages = _messages_since_last()
    why = getattr(gm, "compile_subgraph_reason", None)
    if why is None or not getattr(why, "graph_break", False):
        return []
    stack = getattr(why, "user_stack", None) or []
    where = _place(stack[-1]) if stack else ""
    parts = [split_message(m) for m in messages] or [(str(getattr(why, "reason", "graph break")), "")]
    added = [GraphBreak(where, reason, hint) for reason, hint in parts]
    LOG.extend(added)
    del LOG[:-1000]   # a long-lived process keeps the latest
    return added
