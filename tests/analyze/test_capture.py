"""The tracer's per-op shortcuts agree with pricing every op afresh."""

from brrr.analyze.capture import OpTracer, _cost
from brrr.analyze.step import Step


class CheckedTracer(OpTracer):
    """Keeps (memoized cost, fresh cost) of every op."""

    def __init__(self, model):
        super().__init__(model)
        self.pairs = []

    def _cost(self, func, args, kwargs, out):
        cost = super()._cost(func, args, kwargs, out)
        self.pairs.append((cost, _cost(func, args, kwargs, out)))
        return cost


def test_memoized_costs_match_fresh_ones(bert_target):
    model, inputs = bert_target
    step = Step(model, inputs, train=True)
    tracer = CheckedTracer(model)
    with tracer:
        step()
    assert all(memoized == fresh for memoized, fresh in tracer.pairs)
    assert 0 < len(tracer._costs) < sum(r.op_class == "contraction" for r in tracer.records)  # layers repeat
