"""Bad input gets eager's answer or a clear error, never a wrong number.

- NaN and infinities through reductions: torch's max/min/argmax/argmin let NaN win (argmax/argmin pick the
  first NaN); brrr's kernels give the same numbers, in one-pass and looped reductions alike.
- Out-of-range index tensors passed in by the caller raise, as eager does, instead of reading outside the
  indexed tensor."""

import pytest
import torch

from tests.compile.helpers import compiled

OPS = {
    "amax": lambda t: t.amax(-1),
    "amin": lambda t: t.amin(-1),
    "max.dim": lambda t: t.max(-1),
    "min.dim": lambda t: t.min(-1),
    "argmax": lambda t: t.argmax(-1),
    "argmin": lambda t: t.argmin(-1),
    "amax over rows": lambda t: t.amax(0),
    "max of all": lambda t: t.max(),
    "softmax": lambda t: t.softmax(-1),
    "log_softmax": lambda t: t.log_softmax(-1),
}


def special(rows, cols, dtype):
    x = torch.randn(rows, cols)
    x[1, 3] = float("nan")
    x[1, 6] = float("inf")        # a NaN beats a larger-looking inf
    x[2, 0] = float("inf")
    x[3, 5] = float("-inf")
    x[4, :] = float("-inf")       # a row of -inf
    x[5, 2] = x[5, cols - 1] = float("nan")   # two NaNs: argmax/argmin take the first
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [8, 5000])   # one pass, and a looped reduction
@pytest.mark.parametrize("name", list(OPS))
def test_nan_and_inf_match_eager(name, cols, dtype):
    fn = OPS[name]
    x = special(6, cols, dtype)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(fn)(x), fn(x), equal_nan=True)


BAD_INDEX = {   # index tensors that come straight from the caller (input_ids, targets): checked per call
    "embedding": (lambda w, i: torch.nn.functional.embedding(i, w), (2, 2)),
    "index_select": (lambda w, i: w.index_select(0, i), (4,)),
    "gather": (lambda w, i: w.gather(0, i), (2, 4)),
    "index": (lambda w, i: w[i], (2, 2)),
}


@pytest.mark.parametrize("name", list(BAD_INDEX))
def test_out_of_range_index_inputs_raise_like_eager(name):
    fn, shape = BAD_INDEX[name]
    w = torch.randn(10, 4)
    good = torch.tensor([0, 9, 3, 1, 2, 5, 7, 8]).view(-1)[:torch.Size(shape).numel()].view(shape)
    torch._dynamo.reset()
    c = compiled(fn)
    torch.testing.assert_close(c(w, good), fn(w, good))
    for value in (10, -11):
        bad = good.clone()
        bad.view(-1)[0] = value
        with pytest.raises((RuntimeError, IndexError)):
            fn(w, bad)       # eager refuses it ...
        with pytest.raises(RuntimeError, match="out of range"):
            c(w, bad)        # ... and so does brrr, instead of reading outside w
    if name == "index":      # negative indices in range wrap, as in eager
        neg = good.clone()
        neg.view(-1)[0] = -10
        torch.testing.assert_close(c(w, neg), fn(w, neg))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp", "cross_entropy"])
def test_long_rows_one_pass_max_and_sum_with_nan_and_inf(name, dtype):
    """Rows too long for one block take the running max and sum of exp in one pass (online softmax): NaN,
    -inf and +inf rows still give eager's answer."""
    f = {"softmax": lambda x: torch.softmax(x, -1), "log_softmax": lambda x: torch.log_softmax(x, -1),
         "logsumexp": lambda x: torch.logsumexp(x, -1),
         "cross_entropy": lambda x: torch.nn.functional.cross_entropy(x.float(), torch.arange(x.shape[0]))}[name]
    x = torch.randn(5, 20000, dtype=dtype) * 5
    x[1, 7] = float("nan")
    x[2, :] = float("-inf")
    x[2, 5] = 3.0
    x[3, 11] = float("inf")
    x[4, :] = float("-inf")
    out, ref = compiled(f)(x), f(x)
    if name == "cross_entropy":   # a NaN or inf row makes the mean NaN in both: compare the finite rows
        xs = x[[0]]
        out, ref = compiled(f)(xs), f(xs)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(out.float(), ref.float(), equal_nan=True, **tol)
    if name in ("softmax", "log_softmax"):   # max and sum of exp in one pass, then the output pass
        from brrr.compile.explain import explain
        source = explain(f, x).kernels[0].source
        assert source.count("for roffset in range") == 2 and "_sum = " in source


def _call_sources(fn, args, monkeypatch):
    from brrr.compile.runtime import compiled as runtime
    sources, build = [], runtime.build

    def spy(plan, gm, **kw):
        out = build(plan, gm, **kw)
        sources.append(out[0].source)
        return out
    monkeypatch.setattr(runtime, "build", spy)
    torch._dynamo.reset()
    return compiled(fn)(*args), sources


def test_an_index_input_read_by_several_ops_is_checked_once_and_still_refused(monkeypatch):
    # an edge list indexing three times (gather, index, scatter): one check of it, which still refuses a bad value
    fn = lambda w, i: w[i] + w.index_select(0, i) + torch.zeros_like(w).index_add(0, i, w[i])[i]  # noqa: E731
    w, i = torch.randn(10, 4), torch.tensor([0, 9, 3, 3, 7])
    out, sources = _call_sources(fn, (w, i), monkeypatch)
    torch.testing.assert_close(out, fn(w, i))
    assert sum(s.count("check_index(") for s in sources) == 1
    bad = i.clone()
    bad[2] = 10
    with pytest.raises(RuntimeError, match="out of range"):
        compiled(fn)(w, bad)


def test_an_expanded_index_is_checked_over_its_distinct_elements(monkeypatch):
    from brrr.compile.runtime.compiled import check_index
    seen = []
    aminmax = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: seen.append(t.numel()) or aminmax(t))
    base = torch.tensor([0, 4, 2])
    check_index(base[:, None, None].expand(3, 5, 7), 0, 5, "scatter_add")
    assert seen == [3]
    bad = torch.tensor([0, 5, 2])[:, None].expand(3, 6)
    with pytest.raises(RuntimeError, match="out of range"):
        check_index(bad, 0, 5, "scatter_add")
    with pytest.raises(RuntimeError, match="out of range"):
        check_index(torch.tensor([[1, 2], [3, -1]]).t(), 0, 5, "gather")   # strided, no zero stride
