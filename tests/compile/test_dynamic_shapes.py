"""Dynamic shapes (brrr/compile/ir/sizes.py, the default; `symbolic_sizes=False` compiles per shape): a graph Dynamo
captures with symbolic sizes is planned once at those sizes, its kernels take the sizes as arguments, and every
later shape runs brrr's kernels, equal to eager."""

import pytest
import torch
import torch.nn.functional as F

from brrr.compile import backend, fallbacks
from brrr.compile.backend import make_backend
from brrr.compile.runtime import launch


class Attention(torch.nn.Module):
    """BERT-style: qkv projection, softmax attention over the sequence, output projection, residual and
    layer norm."""

    def __init__(self, d=32, heads=2):
        super().__init__()
        self.qkv, self.out, self.norm, self.heads = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), \
            torch.nn.LayerNorm(d), heads

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        return self.norm(x + self.out(a.transpose(1, 2).reshape(b, s, d)))


def _last_fallback():
    return fallbacks.LOG[-1] if fallbacks.LOG else None


@pytest.fixture
def counted(monkeypatch):
    """Counts: brrr's plans (one per graph compiled), kernel launches, and graph-scope fallbacks."""
    seen = {"plans": 0, "launches": 0}
    real_plan, real_call = backend.plan_graph, launch.Launcher.__call__

    def plan(gm, *args, **kwargs):
        seen["plans"] += 1
        return real_plan(gm, *args, **kwargs)

    def call(self, *args, **kw):
        seen["launches"] += 1
        return real_call(self, *args, **kw)
    monkeypatch.setattr(backend, "plan_graph", plan)
    monkeypatch.setattr(launch.Launcher, "__call__", call)
    seen["last_fallback"] = _last_fallback()   # the log keeps the latest 1000: watch its tail
    torch._dynamo.reset()
    return seen


def test_one_compile_serves_every_sequence_length_with_brrrs_kernels(counted):
    torch.manual_seed(0)
    model = Attention().eval()
    compiled = torch.compile(model, backend=make_backend(symbolic_sizes=True))
    with torch.no_grad():
        for length in (1, 2, 17, 40):   # interpreted, each program costs its 2048-element tile
            x = torch.randn(2, length, 32)
            launches = counted["launches"]
            torch.testing.assert_close(compiled(x), model(x), atol=2e-5, rtol=2e-5)
            assert counted["launches"] > launches, f"length {length} ran no brrr kernel"
    # length 1 compiles as a static graph; the first change recompiles once at symbolic sizes, for all others
    assert counted["plans"] == 2
    assert _last_fallback() is counted["last_fallback"]


def test_a_training_step_at_changing_lengths_matches_eager(counted):
    torch.manual_seed(0)
    model = Attention()
    ours = Attention()
    ours.load_state_dict(model.state_dict())
    compiled = torch.compile(ours, backend=make_backend(symbolic_sizes=True))
    for length in (3, 9, 33):
        x = torch.randn(2, length, 32)
        y = compiled(x)
        y.square().sum().backward()
        want = model(x)
        want.square().sum().backward()
        torch.testing.assert_close(y, want, atol=2e-5, rtol=2e-5)
        for (name, p), q in zip(model.named_parameters(), ours.parameters()):
            torch.testing.assert_close(q.grad, p.grad, atol=2e-4, rtol=2e-4, msg=name)
            p.grad = q.grad = None
    assert counted["plans"] == 2 * 2   # forward and backward: static at 3, then symbolic for 9 and 33


def _row_sum(x):
    return x.sum(-1) * 2


def _column_sum(x):
    return (x * x).sum(0)


def _softmax_rows(x):
    return torch.softmax(x, dim=0)


def _cat(x):
    return torch.cat([x, x * 2, x[:1]], dim=0)


def _pad(x):
    return F.pad(x, (1, 2, 0, 3)) + 1


def _slice(x):
    return x[1:-1, ::2] * 3


def _reshape(x):
    return (x.reshape(-1) + 1).reshape(x.shape[0], 3, 2).sum(-1)


@pytest.mark.parametrize("fn", [_row_sum, _column_sum, _softmax_rows, _cat, _pad, _slice, _reshape],
                         ids=lambda f: f.__name__.strip("_"))
def test_ops_over_a_dynamic_dim_match_eager_at_every_size(fn, counted):
    compiled = torch.compile(fn, backend=make_backend(symbolic_sizes=True), dynamic=True)
    for rows in (5, 17, 1, 0, 2):
        x = torch.randn(rows, 6, dtype=torch.float64)
        if fn is _slice and rows < 2:
            continue   # x[1:-1] of fewer than 2 rows is empty: checked at 2
        torch.testing.assert_close(compiled(x), fn(x))
    # 5 and 17 share the symbolic compile; 0 and 1 are sizes Dynamo specializes on; 2 shares the first again
    assert counted["plans"] <= 3
    assert _last_fallback() is counted["last_fallback"]


def test_mark_dynamic_batch_of_an_mlp_compiles_once(counted):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).eval()
    compiled = torch.compile(model, backend=make_backend(symbolic_sizes=True))
    with torch.no_grad():
        for batch in (3, 64, 1000):
            x = torch.randn(batch, 16)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert counted["plans"] == 1


def test_a_kernels_sizes_are_arguments_never_specialized(monkeypatch):
    """The generated source names the size symbols as parameters that Triton must not specialize on (a size
    of 1, or one divisible by 16, would otherwise pick a variant another size breaks)."""
    import brrr

    ex = brrr.explain(lambda x: torch.relu(x) * 2, torch.randn(6, 8), dynamic=True)
    (kernel,) = ex.kernels
    assert "do_not_specialize=" in kernel.source and "xnumel = " in kernel.source
    line = next(ln for ln in kernel.source.splitlines() if ln.strip().startswith("xnumel = "))
    assert not line.split("=")[1].strip().isdigit()   # the element count is an expression of the sizes


def test_by_default_one_plan_serves_every_shape_and_the_option_plans_per_shape(counted):
    """Planning at symbolic sizes is the default; `symbolic_sizes=False` compiles each shape on its own."""
    for options, plans in (({}, 1), ({"symbolic_sizes": False}, 2)):
        torch._dynamo.reset()
        before = counted["plans"]
        compiled = torch.compile(_row_sum, backend=make_backend(**options), dynamic=True)
        for rows in (5, 17):
            x = torch.randn(rows, 6, dtype=torch.float64)
            torch.testing.assert_close(compiled(x), _row_sum(x))
        assert counted["plans"] - before == plans, options


def test_explain_lists_the_guards_brrrs_plan_adds(monkeypatch):
    """Every guard planning at symbolic sizes adds is listed: here the int32 index bound of each kernel, and none
    that pins a size to the value it was traced at."""
    import brrr

    torch._dynamo.reset()
    ex = brrr.explain(lambda x: torch.softmax(x, -1) * 2, torch.randn(6, 10), dynamic=True)
    assert ex.kernels and ex.guards and "guards brrr added" in str(ex)
    assert any("1073741823" in guard for _, guard in ex.guards)
    assert not any(guard.startswith("Eq(") and guard.endswith(", 6)") for _, guard in ex.guards)


def test_a_hugging_face_encoder_compiles_once_for_every_later_length(counted):
    """A BERT layer at lengths whose sizes cross the widths of its weights: the planner's heuristics (which load
    decides a kernel's order, bytes priced for recomputing or storing) compare sizes at their hints, so none of
    them pins a length or a range of lengths with a guard (each such guard was a recompile per length)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    compiled = torch.compile(model, backend=make_backend(symbolic_sizes=True))
    with torch.no_grad():
        for length in (8, 12, 3, 16, 5, 40):
            x = torch.randint(0, 100, (2, length))
            torch.testing.assert_close(compiled(x).last_hidden_state, model(x).last_hidden_state,
                                       atol=2e-5, rtol=2e-5)
    assert counted["plans"] == 2   # length 8 static; 12 at symbolic sizes, serving every later one
    assert _last_fallback() is counted["last_fallback"]


@pytest.mark.parametrize("shape_of, dim, first", [(lambda n: (n, 64), 0, 16400), (lambda n: (3, n), 1, 40000)],
                         ids=["columns", "rows"])
def test_long_reductions_over_a_dynamic_dim_split_at_every_length(shape_of, dim, first, counted):
    """Long columns (a bias gradient over the tokens) and a few long rows reduce in two kernels, chunks and then
    their partials, at symbolic sizes too: the number of chunks is fixed at the hint sizes, the chunk length
    follows each call's sizes, and chunks past a short reduction's end add nothing."""
    def total(x):
        return (x * 2).sum(dim)
    compiled = torch.compile(total, backend=make_backend(symbolic_sizes=True), dynamic=True)
    for n in (first, 5001, 3, 2):   # the first at the split's thresholds (its hint sizes)
        x = torch.randn(shape_of(n), dtype=torch.float64)
        launches = counted["launches"]
        torch.testing.assert_close(compiled(x), total(x))
        assert counted["launches"] - launches == 2, f"length {n}: not split in two kernels"
    assert counted["plans"] == 1   # one plan for every length: no guard pinned the chunk length
