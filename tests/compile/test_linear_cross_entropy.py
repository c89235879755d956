"""Linear + cross-entropy without logits: the chunked op (matmul/linear_cross_entropy.py) against a float64
reference, and the pass (passes/linear_cross_entropy.py) on compiled models against eager."""

import copy
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import brrr
from brrr.compile.matmul import linear_cross_entropy as op
from brrr.compile.passes import linear_cross_entropy as fuse

ROWS, HIDDEN, VOCAB = 37, 8, 101   # 101: a vocabulary whose rows are not 16-byte aligned (logits transposed)


def _inputs(dtype, bias=True, seed=0, vocab=VOCAB, rows=ROWS):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, HIDDEN, generator=g, dtype=torch.float64).to(dtype)
    w = (torch.randn(vocab, HIDDEN, generator=g, dtype=torch.float64) / 2).to(dtype)
    b = torch.randn(vocab, generator=g, dtype=torch.float64).to(dtype) if bias else None
    t = torch.randint(0, vocab, (rows,), generator=g)
    t[[3, 10, 11]] = -100
    return x, w, b, t


def _reference(x, w, b, t, dtype=torch.float64, **kwargs):
    """loss and gradients of cross_entropy(linear(x)) computed by eager in `dtype`."""
    x, w = x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()
    b = b.to(dtype).requires_grad_() if b is not None else None
    loss = F.cross_entropy(F.linear(x, w, b), t, **kwargs)
    loss.backward()
    return [loss.detach(), x.grad, w.grad] + ([b.grad] if b is not None else [])


def _fused(x, w, b, t, reduction="mean", label_smoothing=0.0, ignore_index=-100):
    """The forward op's loss, then the backward op's gradients for a loss gradient of 1."""
    loss, lse = torch.ops.brrr.fused_linear_cross_entropy(x, w, b, t, ignore_index, reduction, label_smoothing,
                                                          x.dtype)
    gx, gw, gb = torch.ops.brrr.fused_linear_cross_entropy_backward(
        torch.ones((), dtype=x.dtype), x, w, b, t, lse, ignore_index, reduction, label_smoothing, True, True,
        b is not None)
    return [loss, gx, gw] + ([gb] if b is not None else [])


def _fused_with_grads(x, w, b, t, reduction="mean", label_smoothing=0.0, ignore_index=-100):
    """The training op: loss and gradients (for a loss gradient of 1) from one forward."""
    out = torch.ops.brrr.fused_linear_cross_entropy_with_grads(x, w, b, t, ignore_index, reduction,
                                                               label_smoothing, True, True, b is not None, x.dtype)
    return list(out[:3]) + ([out[3]] if b is not None else [])


@pytest.fixture(params=["triton", "torch"])
def row_math(request, monkeypatch):
    """The per-row math as the Triton kernel (interpreted) or as torch ops; chunks of 8 rows either way."""
    monkeypatch.setenv("TRITON_INTERPRET", "1" if request.param == "triton" else "0")
    monkeypatch.setattr(op, "CHUNK_BYTES", 8 * VOCAB * 4)
    monkeypatch.setattr(op, "ROWS_PER_HIDDEN", 0)
    return request.param


@pytest.mark.parametrize("reduction,smoothing", [("mean", 0.0), ("sum", 0.0), ("mean", 0.1), ("sum", 0.2)])
@pytest.mark.parametrize("way", [_fused, _fused_with_grads])
def test_fp32_loss_and_gradients_equal_a_float64_reference(row_math, reduction, smoothing, way):
    x, w, b, t = _inputs(torch.float32)
    ours = way(x, w, b, t, reduction, smoothing)
    ref = _reference(x, w, b, t, reduction=reduction, label_smoothing=smoothing)
    for got, want in zip(ours, ref):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert not ours[1][[3, 10, 11]].any()   # ignored rows get no gradient


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("way", [_fused, _fused_with_grads])
def test_low_precision_is_no_less_accurate_than_eager_against_float64(row_math, dtype, way):
    x, w, b, t = _inputs(dtype)
    ref = _reference(x, w, b, t)
    eager = _reference(x, w, b, t, dtype=dtype)
    ours = way(x, w, b, t)
    for got, mine, want in zip(ours, eager, ref):
        assert got.dtype == dtype
        ours_err = (got.double() - want).abs().max().item()
        eager_err = (mine.double() - want).abs().max().item()
        assert ours_err <= 2 * eager_err + 1e-3 * want.abs().max().item()


@pytest.mark.parametrize("way", [_fused, _fused_with_grads])
def test_a_weight_gradient_summed_over_many_chunks_is_rounded_once(monkeypatch, way):
    """32 chunks of 16 rows: summed in bf16, each chunk's sum would add a rounding to eager's one."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(op, "CHUNK_BYTES", 16 * VOCAB * 2)
    monkeypatch.setattr(op, "ROWS_PER_HIDDEN", 0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, HIDDEN, generator=g).bfloat16()
    w = (torch.randn(VOCAB, HIDDEN, generator=g) / 2).bfloat16()
    t = torch.randint(0, VOCAB, (512,), generator=g)
    assert op.chunk_rows(512, VOCAB, HIDDEN, 2) == 16
    ref = _reference(x, w, None, t)[2]
    eager = _reference(x, w, None, t, dtype=torch.bfloat16)[2]
    gw = way(x, w, None, t)[2]
    assert gw.dtype == torch.bfloat16 and gw.shape == w.shape
    monkeypatch.setattr(op, "CHUNK_BYTES", 1 << 30)
    assert op.chunk_rows(512, VOCAB, HIDDEN, 2) == 512
    one_chunk = way(x, w, None, t)[2]
    err = lambda a: ((a.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    assert err(gw) <= 1.05 * err(one_chunk) and err(gw) <= 2 * err(eager)   # summed in bf16: 3.3x one chunk's


def test_without_bias_and_a_chunk_per_call_matches(row_math, monkeypatch):
    monkeypatch.setattr(op, "CHUNK_BYTES", 1 << 30)   # one chunk holds every row
    x, w, _, t = _inputs(torch.float32, bias=False)
    for got, want in zip(_fused(x, w, None, t), _reference(x, w, None, t)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_every_row_ignored_gives_nan_loss_and_zero_gradients_as_eager(row_math):
    x, w, b, t = _inputs(torch.float32)
    t[:] = -100
    loss, gx, gw, gb = _fused(x, w, b, t)
    eager = _reference(x, w, b, t, dtype=torch.float32)
    assert torch.isnan(loss) and torch.isnan(eager[0])
    assert not gx.any() and not gw.any() and not gb.any() and not eager[1].any()


def test_logits_are_transposed_exactly_where_a_row_is_not_16_byte_aligned():
    assert op.transposed_logits(50257, 2) and op.transposed_logits(30522, 2) and op.transposed_logits(101, 4)
    assert not any(op.transposed_logits(v, 2) for v in (32000, 151936, 50272, 50304, 30000))
    assert not op.transposed_logits(1004, 4) and op.transposed_logits(1004, 2)
    # the row kernels' offsets: what Triton may assume of a row stride (it proves 16 itself, not 8)
    assert [op._stride_align(s) for s in (50264, 32000, 1004, 101, 0)] == [8, 16, 4, 1, 16]


def test_chunk_rows_fit_the_budget_but_hold_two_rows_per_hidden_unit(monkeypatch):
    monkeypatch.setattr(op, "CHUNK_BYTES", 256 << 20)
    monkeypatch.setattr(op, "ROWS_PER_HIDDEN", 2)
    assert op.chunk_rows(8192, 50257, 768, 2) == 2048    # 2048 rows x 50257 x 2 bytes: 196 MiB <= 256 MiB
    assert op.chunk_rows(8192, 32000, 1024, 2) == 4096
    assert op.chunk_rows(4096, 151936, 896, 2) == 2048   # the budget's 512 rows would accumulate 8 times
    assert op.chunk_rows(10, 151936, 896, 4) == 10       # fewer rows than a chunk
    assert op.chunk_rows(0, 151936, 896, 4) == 1
    assert op.chunk_rows(100_000, 10**9, 4, 4) == 16     # never fewer than 16 rows


class TinyLM(torch.nn.Module):
    """A causal LM's head and loss as Hugging Face writes them: tied embedding, upcast, flatten, shifted labels."""

    def __init__(self, vocab=VOCAB, hidden=HIDDEN, bias=False, smoothing=0.0):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=bias)
        self.head.weight = self.embed.weight
        self.smoothing = smoothing

    def forward(self, ids, labels):
        h = torch.tanh(self.norm(self.embed(ids)))
        logits = self.head(h).float()
        labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100,
                               label_smoothing=self.smoothing)


@pytest.fixture
def always(monkeypatch):
    monkeypatch.setattr(fuse, "MIN_LOGITS_BYTES", 0)
    monkeypatch.setattr(op, "CHUNK_BYTES", 8 * VOCAB * 4)
    monkeypatch.setattr(op, "ROWS_PER_HIDDEN", 0)


def _ids(batch=2, length=17, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, length), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100
    return ids, labels


@pytest.mark.parametrize("bias,smoothing", [(False, 0.0), (True, 0.1)])
def test_a_compiled_lm_head_trains_as_eager_through_the_fused_op(always, bias, smoothing):
    torch.manual_seed(0)
    model = TinyLM(bias=bias, smoothing=smoothing)
    ours = copy.deepcopy(model)
    ids, labels = _ids()
    model(ids, labels).backward()
    loss = brrr.compile(ours)(ids, labels)
    loss.backward()
    torch.testing.assert_close(loss, model(ids, labels))
    for (name, p), q in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_explain_lists_the_rewrite_and_no_tensor_of_vocabulary_rows_is_planned(always):
    ids, labels = _ids()
    ex = brrr.explain(TinyLM(), ids, labels, train=True)
    (rewrite,) = ex.linear_losses
    # 8 rows fit the budget the fixture sets; a chunk holds at least 16: three chunks, the last of 2 rows
    assert (rewrite.rows, rewrite.hidden, rewrite.vocab, rewrite.chunk_rows) == (34, HIDDEN, VOCAB, 16)
    assert rewrite.transposed and f"logits made [{VOCAB}, rows]" in str(rewrite)   # 101 x 4 bytes: not aligned
    text = str(ex)
    assert "without logits" in text and "brrr.fused_linear_cross_entropy" in text
    # every tensor the plans hold: none has the vocabulary as its last dim (the weight is [101, 16])
    shapes = [s for k in ex.kernels for s in k.reads + k.writes] + [e.shapes for e in ex.externs + ex.fallbacks]
    assert not any(re.search(rf"\[[^\]]*, {VOCAB}\]", s) for s in shapes), shapes


def test_training_computes_gradients_in_the_forward_and_inference_the_loss_alone(always):
    ids, labels = _ids()
    assert "fused_linear_cross_entropy_with_grads" in str(brrr.explain(TinyLM(), ids, labels, train=True))
    text = str(brrr.explain(TinyLM(), ids, labels))
    assert "brrr.fused_linear_cross_entropy.default" in text and "with_grads" not in text


def test_inference_computes_the_loss_alone(always):
    torch.manual_seed(0)
    model = TinyLM()
    ids, labels = _ids()
    compiled = brrr.compile(copy.deepcopy(model))
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids, labels), model(ids, labels))
    ex = brrr.explain(model, ids, labels)
    assert len(ex.linear_losses) == 1 and ex.graphs == ["inference"]


class Returned(TinyLM):
    def forward(self, ids, labels):
        logits = self.head(self.embed(ids))
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1)), logits


class Weighted(TinyLM):
    def forward(self, ids, labels):
        weights = torch.linspace(0.5, 1.5, VOCAB)
        return F.cross_entropy(self.head(self.embed(ids)).view(-1, VOCAB), labels.view(-1), weight=weights)


class Unreduced(TinyLM):
    def forward(self, ids, labels):
        return F.cross_entropy(self.head(self.embed(ids)).view(-1, VOCAB), labels.view(-1), reduction="none")


class Transposed(TinyLM):
    def forward(self, ids, labels):   # class dim 1 of a 3-D input: rows are not the linear's rows
        return F.cross_entropy(self.head(self.embed(ids)).transpose(1, 2), labels)


@pytest.mark.parametrize("model", [Returned, Weighted, Unreduced, Transposed])
def test_a_chain_the_op_cannot_compute_is_left_alone_and_still_equals_eager(always, model):
    torch.manual_seed(0)
    m = model()
    ids, labels = _ids()
    assert brrr.explain(m, ids, labels, train=True).linear_losses == []
    got, want = brrr.compile(copy.deepcopy(m))(ids, labels), m(ids, labels)
    torch.testing.assert_close(got, want)


def test_small_logits_stay_with_the_fused_softmax_kernels():
    ids, labels = _ids()   # 34 x 101 fp32 logits: far below MIN_LOGITS_BYTES
    assert brrr.explain(TinyLM(), ids, labels, train=True).linear_losses == []


def test_the_ops_are_priced_as_their_matmuls():
    from torch.utils.flop_counter import FlopCounterMode

    from brrr.cost.ops import op_cost

    x, w, b, t = _inputs(torch.float32)
    forward = torch.ops.brrr.fused_linear_cross_entropy.default
    backward = torch.ops.brrr.fused_linear_cross_entropy_backward.default
    one_matmul = 2 * ROWS * HIDDEN * VOCAB
    args = (x, w, b, t, -100, "mean", 0.0, torch.float32)
    with FlopCounterMode(display=False) as counter:
        loss, lse = forward(*args)
    assert counter.get_total_flops() == one_matmul   # a forward alone costs what eager's linear does
    assert op_cost(forward, args, {}, (loss, lse)).op_class == "contraction"
    for grads, matmuls in (((True, True, True), 3), ((False, True, False), 2), ((False, False, False), 0)):
        args = (torch.ones(()), x, w, b, t, lse, -100, "mean", 0.0, *grads)
        with FlopCounterMode(display=False) as counter:
            out = backward(*args)
        assert counter.get_total_flops() == one_matmul * matmuls
        assert op_cost(backward, args, {}, out).flops == one_matmul * matmuls
    training = torch.ops.brrr.fused_linear_cross_entropy_with_grads.default
    for grads, matmuls in (((True, True, True), 3), ((False, True, False), 2)):   # a training step: eager's count
        args = (x, w, b, t, -100, "mean", 0.0, *grads, torch.float32)
        with FlopCounterMode(display=False) as counter:
            out = training(*args)
        assert counter.get_total_flops() == op_cost(training, args, {}, out).flops == one_matmul * matmuls


class ShiftedLogits(TinyLM):
    """Next-token loss written the older way: the logits shifted, then the labels."""

    def forward(self, ids, labels):
        logits = self.head(torch.tanh(self.embed(ids)))
        shifted = logits[..., :-1, :].contiguous()
        return F.cross_entropy(shifted.view(-1, VOCAB).float(), labels[..., 1:].contiguous().view(-1))


class AtenStyle(TinyLM):
    def forward(self, ids, labels):
        logits = self.head(self.embed(ids))
        return torch._C._nn.cross_entropy_loss(logits.view(-1, VOCAB), labels.view(-1), None, 2, -100, 0.0)


@pytest.mark.parametrize("model", [ShiftedLogits, AtenStyle])
def test_shifted_logits_and_the_aten_style_call_are_rewritten_and_train_as_eager(always, model):
    torch.manual_seed(0)
    m = model()
    ours = copy.deepcopy(m)
    ids, labels = _ids()
    (rewrite,) = brrr.explain(copy.deepcopy(m), ids, labels, train=True).linear_losses
    assert rewrite.rows == (2 * 16 if model is ShiftedLogits else 2 * 17)
    m(ids, labels).backward()
    loss = brrr.compile(ours)(ids, labels)
    loss.backward()
    torch.testing.assert_close(loss, m(ids, labels))
    for (name, p), q in zip(m.named_parameters(), ours.parameters()):   # a summed loss: gradients ~4, fp32
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=2e-5, msg=name)


class SlicedVocab(TinyLM):
    def forward(self, ids, labels):   # a slice of the vocabulary is not a slice of rows
        logits = self.head(self.embed(ids))[..., :50]
        return F.cross_entropy(logits.reshape(-1, 50), labels.view(-1).clamp(max=49))


def test_a_slice_of_the_vocabulary_is_left_alone(always):
    torch.manual_seed(0)
    m = SlicedVocab()
    ids, labels = _ids()
    assert brrr.explain(m, ids, labels, train=True).linear_losses == []
    torch.testing.assert_close(brrr.compile(copy.deepcopy(m))(ids, labels), m(ids, labels))


def test_a_target_outside_the_vocabulary_gives_nan_never_a_number(row_math):
    x, w, b, t = _inputs(torch.float32)
    t[5] = VOCAB
    with pytest.raises((IndexError, RuntimeError)):   # eager on the CPU; on CUDA a device-side assert
        _reference(x, w, b, t)
    loss, gx, gw, gb = _fused(x, w, b, t)
    assert torch.isnan(loss) and torch.isnan(gx[5]).all() and torch.isnan(gw).any() and torch.isnan(gb).any()
    assert not torch.isnan(gx[6]).any()   # other rows keep their gradients


@pytest.mark.parametrize("vocab,transposed", [(1007, True), (1008, False)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("way", [_fused, _fused_with_grads])
def test_aligned_and_unaligned_vocabularies_in_bf16_are_no_less_accurate_than_eager(monkeypatch, vocab, transposed,
                                                                                    smoothing, way):
    """1007 entries a row (2014 bytes): logits made transposed, the statistics split over 8 segments of the
    vocabulary (the column kernels' combine), chunks of 16 rows, the last of 11 padded to 16; 1008: rows."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(op, "CHUNK_BYTES", 16 * vocab * 2)
    monkeypatch.setattr(op, "ROWS_PER_HIDDEN", 0)
    x, w, b, t = _inputs(torch.bfloat16, vocab=vocab, rows=43)
    head = op._Head(x, w, b)
    assert head.transposed == transposed and head.step == 16 and head.weight is w
    padded = []
    real_pad = F.pad
    monkeypatch.setattr(F, "pad", lambda a, *args, **kw: padded.append(tuple(a.shape)) or real_pad(a, *args, **kw))
    ref = _reference(x, w, b, t, label_smoothing=smoothing)
    eager = _reference(x, w, b, t, dtype=torch.bfloat16, label_smoothing=smoothing)
    padded.clear()
    ours = way(x, w, b, t, label_smoothing=smoothing)
    # the weight is read where it is; only the last chunk of x (11 rows) gets zero rows, and only when transposed
    assert set(padded) <= ({(11, HIDDEN)} if transposed else set()) and (not transposed or padded)
    for got, mine, want in zip(ours, eager, ref):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        ours_err = (got.double() - want).abs().max().item()
        assert ours_err <= 2 * (mine.double() - want).abs().max().item() + 1e-3 * want.abs().max().item()
    assert not ours[1][[3, 10, 11]].any()


def test_transposed_statistics_combine_more_segments_than_one_step_reads(monkeypatch):
    """9001 entries: 36 segments of the vocabulary, so the combine kernel reads its partials in two steps."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x, w, b, t = _inputs(torch.float32, vocab=9001, rows=20)
    head = op._Head(x, w, b)
    assert head.transposed
    segments = []
    real = op._kernel(3)
    monkeypatch.setattr(op, "_KERNELS", [k if k is not real else _Recorded(real, segments) for k in op._KERNELS])
    for got, want in zip(_fused_with_grads(x, w, b, t, label_smoothing=0.1),
                         _reference(x, w, b, t, label_smoothing=0.1)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert segments and all(n > 32 for n in segments), segments


class _Recorded:
    """A kernel whose launches record their `segments` argument (the combine kernel's sixth)."""

    def __init__(self, kernel, seen):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append(args[5])
            return self.kernel[grid](*args, **kwargs)
        return launch


def test_a_150k_vocabulary_in_bf16_is_no_less_accurate_than_eager(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = torch.Generator().manual_seed(0)
    vocab = 151936   # Qwen2's
    x = torch.randn(6, 8, generator=g).bfloat16()
    w = torch.randn(vocab, 8, generator=g).bfloat16()
    t = torch.tensor([0, vocab - 1, 12345, -100, 99999, 7])
    ref = _reference(x, w, None, t)
    eager = _reference(x, w, None, t, dtype=torch.bfloat16)
    for got, mine, want in zip(_fused(x, w, None, t), eager, ref):
        ours_err = (got.double() - want).abs().max().item()
        assert ours_err <= 2 * (mine.double() - want).abs().max().item() + 1e-3 * want.abs().max().item()


def _hf_families():
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    return {
        "bert-mlm": lambda: transformers.BertForMaskedLM(transformers.BertConfig(
            **small, intermediate_size=64, hidden_dropout_prob=0, attention_probs_dropout_prob=0)),
        "opt": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
            **small, ffn_dim=64, word_embed_proj_dim=32, dropout=0, layerdrop=0)),
        "gpt-neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
            **small, intermediate_size=64, hidden_dropout=0, attention_dropout=0)),
        "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(   # tied: the head is the embedding
            **small, num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=True)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **small, num_key_value_heads=1, intermediate_size=64)),
    }


@pytest.mark.parametrize("family", ["bert-mlm", "opt", "gpt-neox", "qwen2", "llama"])
def test_hugging_face_heads_and_losses_are_rewritten_and_train_as_eager(always, family):
    torch.manual_seed(0)
    model = _hf_families()[family]()
    ours = copy.deepcopy(model)
    causal = family != "bert-mlm"

    def step(m, ids, labels):
        return m(input_ids=ids, labels=labels, **({"use_cache": False} if causal else {})).loss

    ids, labels = _ids(length=16)
    step(model, ids, labels).backward()
    assert len(brrr.explain(lambda i, l: step(copy.deepcopy(model), i, l), ids, labels, train=True)
               .linear_losses) == 1
    loss = brrr.compile(lambda i, l: step(ours, i, l))(ids, labels)
    loss.backward()
    torch.testing.assert_close(loss, step(model, ids, labels))
    for (name, p), q in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("way", [_fused, _fused_with_grads])
def test_the_weight_gradient_sum_is_written_by_its_first_chunk_not_zero_filled(row_math, monkeypatch, way):
    """The sum over chunks starts from whatever memory holds (NaN here): the first chunk's product overwrites it."""
    made = op._gradient_buffers

    def garbage(*args):
        gx, gw, gb = made(*args)
        gw.fill_(float("nan"))
        return gx, gw, gb
    monkeypatch.setattr(op, "_gradient_buffers", garbage)
    x, w, b, t = _inputs(torch.float32)
    assert op.chunk_rows(x.shape[0], VOCAB, HIDDEN, 4) < x.shape[0]   # several chunks
    for got, want in zip(way(x, w, b, t), _reference(x, w, b, t)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_a_loss_compiled_inside_the_callers_autocast_is_rewritten_with_autocasts_casts(always, monkeypatch):
    """Autocast around the compiled call (an amp training loop) runs the linear in bf16 and the loss in float32:
    the rewrite casts the operands as autocast does, and the loss and every gradient are no less accurate than
    eager's under the same autocast, against float64. The op's rows run as torch ops here: Triton's interpreter
    truncates float32 to bf16 (a GPU rounds to nearest), and the bias that leaves in the bf16 logit gradients
    adds up over rows (the norm's weight gradient 2-4x eager's error interpreted, 1.0x with rounding)."""
    monkeypatch.setattr(op, "_triton_runs", lambda t: False)
    torch.manual_seed(0)
    model = TinyLM(bias=True)
    ours, precise = copy.deepcopy(model), copy.deepcopy(model).double()
    ids, labels = _ids()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (rewrite,) = brrr.explain(TinyLM(bias=True), ids, labels, train=True).linear_losses
        want = model(ids, labels)
        got = brrr.compile(ours)(ids, labels)
    assert rewrite.autocast == torch.bfloat16 and "operands cast to bfloat16" in str(rewrite)
    exact = precise(ids, labels)
    for loss in (want, got, exact):
        loss.backward()
    assert got.dtype == want.dtype == torch.float32

    def error(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()
    assert error(got, exact) <= 2 * error(want, exact) + 1e-6
    for (name, p), q, r in zip(model.named_parameters(), ours.parameters(), precise.parameters()):
        assert error(q.grad, r.grad) <= 2 * error(p.grad, r.grad) + 1e-6, name


def test_a_graph_entering_autocast_itself_is_left_alone(always):
    class Amp(TinyLM):
        def forward(self, ids, labels):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return super().forward(ids, labels)

    torch.manual_seed(0)
    model = Amp()
    ids, labels = _ids()
    assert brrr.explain(model, ids, labels, train=True).linear_losses == []
    torch.testing.assert_close(brrr.compile(copy.deepcopy(model))(ids, labels), model(ids, labels),
                               rtol=2e-2, atol=2e-2)


def test_the_graph_as_captured_keeps_dynamos_code_after_the_rewrite(always, monkeypatch):
    """The floor's captured trial runs Dynamo's graph as captured: the original linear and cross_entropy, not
    the rewritten graph (Dynamo's lazy GraphModule would run whatever the passes made of it)."""
    from brrr.compile.runtime import captured_choice

    monkeypatch.setattr(captured_choice, "CLOCK", SimpleNamespace(now=lambda: 0.0, sync=lambda: None))
    made = []
    monkeypatch.setattr(captured_choice, "CompiledOrCaptured",
                        lambda compiled, captured, *a, **k: made.append(captured) or compiled)
    heads, head = [], op._Head
    monkeypatch.setattr(op, "_Head", lambda *a: heads.append(1) or head(*a))
    torch.manual_seed(0)
    model = TinyLM()
    ids, labels = _ids()
    torch._dynamo.reset()
    loss = brrr.compile(copy.deepcopy(model))(ids, labels)
    assert heads and len(made) == 1   # the compiled graph computes the loss through the fused op
    heads.clear()
    params = {f"modules_{k.replace('.', '_parameters_')}_": p for k, p in model.named_parameters()}
    args = [ids if "ids" in n.name else labels if "labels" in n.name else
            next(p for k, p in params.items() if n.name.endswith(k))
            for n in made[0].__self__.graph.nodes if n.op == "placeholder"]
    torch.testing.assert_close(made[0](*args)[0], model(ids, labels))
    torch.testing.assert_close(loss, model(ids, labels))
    assert not heads   # as captured: eager's ops, no fused op
