"""What compiling leaves behind (capture -> time -> regimes -> **predict**): the graphs Dynamo cuts a step into,
the breaks between them and the guards each call checks, from `torch._dynamo.explain` on the analyzed step.

A host-bound step pays per compiled graph, not per model: each graph call checks its guards and runs its
runtime wrapper, and a break hands control back to Python between graphs. predict.py prices those per graph;
without this, it assumed one graph (two in training). Explaining traces and runs the model's forward once more,
leaving no trace of it on the model (buffers put back, random generators as they were, no autograd graph). It
does reset Dynamo (torch's explain does, before and after): code compiled earlier in the process compiles again
on its next call, which costs time, never a result.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GraphStructure:
    graphs: int          # Dynamo graphs one call of the model runs
    breaks: int          # graph breaks between them
    guards: int          # guards checked over all graphs, per call
    reasons: tuple = ()  # the first break reasons, one line each

    def __str__(self):
        return f"{self.graphs} graph{'s' if self.graphs != 1 else ''} ({self.breaks} break" \
               f"{'s' if self.breaks != 1 else ''}, {self.guards} guards)"


def graph_structure(model, inputs, most_reasons=3):
    """The model's GraphStructure for `model(*inputs)`, or None where Dynamo cannot explain it (an already
    compiled model, or an error: the analysis goes on with its defaults)."""
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        return None
    # explaining runs the forward once more: it leaves no trace (buffers such as batch norm's statistics put
    # back, random generators as they were, no autograd graph)
    buffers = [(b, b.detach().clone()) for b in model.buffers()] if isinstance(model, torch.nn.Module) else []
    devices = sorted({t.device.index or 0 for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda})
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            explained = torch._dynamo.explain(model)(*inputs)
    except Exception:   # explaining is an estimate's input, never the analysis' failure
        return None
    finally:
        torch._dynamo.reset()   # explain's graphs are no one's: a later compile of the model starts clean
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    reasons = tuple(str(b.reason).splitlines()[0][:120] for b in explained.break_reasons[:most_reasons])
    return GraphStructure(explained.graph_count, explained.graph_break_count, len(explained.out_guards or ()),
                          reasons)
