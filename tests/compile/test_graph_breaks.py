"""Graph breaks (brrr/compile/passes/graph_breaks.py): `brrr explain` says where Dynamo split the program and why, in
Dynamo's own words with its hint; the benchmarks' switch that has Dynamo skip logging calls leaves one graph
and eager's values."""

import inspect
import logging

import pytest
import torch

import brrr
from brrr.bench.backends import ignored_logging_setting, skip_logging_in_graphs
from brrr.compile.backend import brrr_backend
from brrr.compile.passes import graph_breaks

LOGGER = logging.getLogger("brrr.tests.graph_breaks")


class LogsBetweenOps(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x) * 2
        LOGGER.warning("halfway")
        return torch.sigmoid(y) + 1


def _ignored_set_name():
    name = ignored_logging_setting()
    if name is None:
        pytest.skip("this torch has no setting for logging calls Dynamo skips")
    return name


def test_explain_names_the_break_its_place_and_dynamos_hint():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**{_ignored_set_name(): set()}):   # logging breaks the graph, as by default
        ex = brrr.explain(LogsBetweenOps(), torch.randn(8, 16))
    assert ex.graphs == ["inference", "inference"]   # the break splits the forward in two
    [brk] = ex.graph_breaks
    line = next(i for i, text in enumerate(inspect.getsource(LogsBetweenOps).splitlines())
                if "LOGGER.warning" in text) + inspect.getsourcelines(LogsBetweenOps)[1]
    assert brk.where == f"test_graph_breaks.py:{line} in forward"
    assert "logging" in brk.reason.lower() and "\n" not in brk.reason
    text = str(ex)
    assert "graph breaks" in text and str(brk) in text
    if brk.hint:   # torch versions whose messages carry one name the setting
        assert "ignore_log" in brk.hint


def test_no_break_reported_for_a_whole_graph():
    torch._dynamo.reset()
    ex = brrr.explain(lambda x: torch.relu(x) * 2, torch.randn(4, 4))
    assert ex.graph_breaks == [] and "graph breaks" not in str(ex)


def test_skipping_logging_keeps_one_graph_with_eagers_values():
    name = _ignored_set_name()
    graphs = []

    def counting(gm, inputs):
        graphs.append(gm)
        return brrr_backend(gm, inputs)

    model, x = LogsBetweenOps(), torch.randn(8, 16)
    import torch._dynamo.config as config

    before_set = set(getattr(config, name))
    with skip_logging_in_graphs() as added:
        assert "warning" in added
        torch._dynamo.reset()
        before = len(graph_breaks.LOG)
        out = torch.compile(model, backend=counting)(x)
    assert len(graphs) == 1 and graph_breaks.LOG[before:] == []
    torch.testing.assert_close(out, model(x))
    assert getattr(config, name) == before_set   # the setting is the context's alone
    with skip_logging_in_graphs(enabled=False) as added:   # --keep-logging-breaks: nothing skipped
        assert added == [] and getattr(config, name) == before_set


def test_split_message_keeps_first_line_and_hints():
    message = ("logging.Logger method not supported\n  Explanation: not supported.\n"
               "  Hint: Add the method to `ignore_logging_functions`.\n\n  Developer debug context: x")
    assert graph_breaks.split_message(message) == ("logging.Logger method not supported",
                                                   "Add the method to `ignore_logging_functions`.")
    assert graph_breaks.split_message("call_function in skip_files") == ("call_function in skip_files", "")
