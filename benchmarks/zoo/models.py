"""The zoo's configurations: 20+ real models, each built the way its users run it (random init, bf16).

A configuration is a name, a family (transformers, vision, changing-shapes, seed), whether it is a training
step, and a builder `build(device, dtype, quick) -> Workload`. `quick` builds a tiny model of the same code
path (layers, widths, vocabularies and images cut down) for the CPU smoke run; the full sizes are the ones the
zoo issue names. Training steps compute the model's own loss (Hugging Face `labels`, or cross-entropy on
random classes) with dropout at 0, so that backends can be compared for correctness. Vision models need
torchvision / timm, which the GPU machines have; where they are missing the builder raises `Unavailable`.
"""

from dataclasses import dataclass, field

import torch
from torch import nn


class Unavailable(Exception):
    """A configuration this machine cannot build (a package is missing)."""


@dataclass
class Workload:
    model: nn.Module
    inputs: tuple = ()
    train: bool = False
    shapes: list = field(default_factory=list)   # changing shapes: [(label, inputs), ...] in call order
    reference: object = None                     # dtype -> (model, inputs), where a cast copy would not do


@dataclass(frozen=True)
class Config:
    name: str
    family: str          # transformers | vision | changing-shapes | seed
    train: bool
    build: object        # (device, dtype, quick) -> Workload
    # seconds the whole configuration takes (4 backends, cold compiles): its time as one of four workers on an
    # H200 host (zoo/2026-11-26-h200-681c1f0.json), plus 15%; GPT-2 at three lengths had been costed at half
    cost: float = 60.0


BACKEND_WEIGHTS = {"eager": 0.25}   # a compiled backend counts 1: its cold compile dominates a configuration's time
COSTED_BACKENDS = ("eager", "brrr", "brrr-cudagraphs", "inductor")   # what `Config.cost` was measured with


def estimated_cost(config, backends):
    """Seconds `config` should take with these backends: its cost scaled by their share of the four it was
    measured with (a compiled backend weighs 1, eager a quarter)."""
    def weight(names):
        return sum(BACKEND_WEIGHTS.get(b, 1.0) for b in names)
    return config.cost * weight(backends) / weight(COSTED_BACKENDS)


class LossOf(nn.Module):
    """A Hugging Face model's training step: `model(input_ids, labels=labels).loss`, no cache.

    A training step never reads a generation cache; built anyway, it is per-layer state that Dynamo guards
    on, and where a model's Python breaks the graph between layers (OPT's LayerDrop draw in transformers
    5.17) every decoder layer recompiles until Dynamo's recompile limit, for every backend alike."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        if _takes_cache(self.model):
            return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss
        return self.model(input_ids=input_ids, labels=labels).loss


class LogitsOf(nn.Module):
    """A Hugging Face model's inference: logits (or the last hidden state), no cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids=input_ids, use_cache=False) if _takes_cache(self.model) else \
            self.model(input_ids=input_ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


class ClassifierLoss(nn.Module):
    """A vision model's training step: cross-entropy of its logits against labels (per pixel for a segmentation
    model's `out` map)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, images, labels):
        out = self.model(images)
        logits = out.logits if hasattr(out, "logits") else out["out"] if isinstance(out, dict) else \
            out[0] if isinstance(out, tuple) else out
        return nn.functional.cross_entropy(logits, labels)


def _takes_cache(model):
    return getattr(model.config, "use_cache", None) is not None


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise Unavailable("needs the transformers package") from e
    return transformers


def _ids(vocab, batch, seq, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def _mlm_labels(ids, seed=1):
    """Masked-LM labels: 15% of positions keep their id, the rest are ignored (-100)."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(ids.shape, generator=g).to(ids.device) < 0.15
    return torch.where(keep, ids, torch.full_like(ids, -100))


def _seeded(fn):
    torch.manual_seed(0)
    return fn()


# ------------------------------------------------------------------------------------ transformers configs

def _hf(cls_name, config_name, full, tiny, quick, **fixed):
    t = _transformers()
    cfg = getattr(t, config_name)(**{**(tiny if quick else full), **fixed})
    return _seeded(lambda: getattr(t, cls_name)(cfg)), cfg


BERT = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=128)
NO_DROPOUT_BERT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
GPT2 = dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
TINY_GPT2 = dict(n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=128)
NO_DROPOUT_GPT2 = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
LLAMA = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
             intermediate_size=2816, vocab_size=32000, max_position_embeddings=2048)
TINY_LLAMA = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=64, vocab_size=128, max_position_embeddings=128)


def _sizes(quick, full, tiny):
    return tiny if quick else full


def _causal_train(cls_name, config_name, full, tiny, batch_seq, **fixed):
    def build(device, dtype, quick):
        model, cfg = _hf(cls_name, config_name, full, tiny, quick, **fixed)
        batch, seq = _sizes(quick, batch_seq, (2, 16))
        ids = _ids(cfg.vocab_size, batch, seq, device)
        return Workload(LossOf(model).to(device=device, dtype=dtype).train(), (ids, ids.clone()), train=True)
    return build


def _masked_train(cls_name, config_name, full, tiny, batch_seq, **fixed):
    def build(device, dtype, quick):
        model, cfg = _hf(cls_name, config_name, full, tiny, quick, **fixed)
        batch, seq = _sizes(quick, batch_seq, (2, 16))
        ids = _ids(cfg.vocab_size, batch, seq, device)
        return Workload(LossOf(model).to(device=device, dtype=dtype).train(), (ids, _mlm_labels(ids)), train=True)
    return build


def llama_prefill(device, dtype, quick):
    model, cfg = _hf("LlamaForCausalLM", "LlamaConfig", LLAMA, TINY_LLAMA, quick, attention_dropout=0.0)
    batch, seq = _sizes(quick, (8, 1024), (2, 16))
    return Workload(LogitsOf(model).to(device=device, dtype=dtype).eval(), (_ids(cfg.vocab_size, batch, seq, device),))


class DecodeStep(nn.Module):
    """One new token per sequence against a static KV cache already holding `prefix` tokens: what a server
    runs per generated token. Every call writes the same cache slot, so repeated calls compute the same."""

    def __init__(self, model, cache, prefix):
        super().__init__()
        self.model, self.cache, self.prefix = model, cache, prefix
        self.register_buffer("position", torch.tensor([prefix]), persistent=False)

    def forward(self, token):
        for layer in getattr(self.cache, "layers", ()):   # caches that count their own tokens: rewind them
            length = getattr(layer, "cumulative_length", None)
            if isinstance(length, torch.Tensor):
                length.fill_(self.prefix)
        out = self.model(input_ids=token, past_key_values=self.cache, cache_position=self.position,
                         use_cache=True)
        return out.logits


def _decode_step(device, dtype, quick):
    t = _transformers()
    model, cfg = _hf("LlamaForCausalLM", "LlamaConfig", LLAMA, TINY_LLAMA, quick, attention_dropout=0.0)
    model = model.to(device=device, dtype=dtype).eval()
    prefix = 16 if quick else 1024
    cache = t.StaticCache(config=cfg, max_cache_len=prefix + 1)
    ids = _ids(cfg.vocab_size, 1, prefix + 1, device)
    with torch.no_grad():   # fill the cache with the prompt
        model(input_ids=ids[:, :prefix], past_key_values=cache, cache_position=torch.arange(prefix, device=device),
              use_cache=True)
    return DecodeStep(model, cache, prefix).to(device), (ids[:, prefix:],)


def llama_decode(device, dtype, quick):
    step, inputs = _decode_step(device, dtype, quick)

    def reference(ref_dtype):   # the same weights and prompt in ref_dtype, with a cache of its own
        ref_step, ref_inputs = _decode_step(device, ref_dtype, quick)
        return ref_step, ref_inputs
    return Workload(step, inputs, reference=reference)


# ------------------------------------------------------------------------------------------------ vision

def _torchvision():
    try:
        import torchvision
    except ImportError as e:
        raise Unavailable("needs torchvision") from e
    return torchvision


def _timm():
    try:
        import timm
    except ImportError as e:
        raise Unavailable("needs timm") from e
    return timm


class TinyConvNet(nn.Module):
    """The quick run's stand-in for the vision models: a ResNet-style block and a classifier head."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        return self.head(x.mean((2, 3)))


def _vision(make, batch, size=224, train=False, channels_last=True):
    def build(device, dtype, quick):
        model = _seeded(TinyConvNet if quick else make)
        b, s = (2, 16) if quick else (batch, size)
        g = torch.Generator().manual_seed(0)
        images = torch.randn(b, 3, s, s, generator=g).to(device=device, dtype=dtype)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        images = images.contiguous(memory_format=memory_format)
        model = model.to(device=device, dtype=dtype, memory_format=memory_format)
        if not train:
            return Workload(model.eval(), (images,))
        labels = torch.randint(0, 10 if quick else 1000, (b,), generator=g).to(device)
        return Workload(ClassifierLoss(model).train(), (images, labels), train=True)
    return build


def _torchvision_model(name, **kw):
    return lambda: getattr(_torchvision().models, name)(weights=None, **kw)


def _timm_model(name, **kw):
    return lambda: _timm().create_model(name, pretrained=False, **kw)


# ---------------------------------------------------------------------------------------- changing shapes

def bert_lengths(device, dtype, quick):
    model, cfg = _hf("BertModel", "BertConfig", BERT, TINY_BERT, quick, **NO_DROPOUT_BERT)
    lengths = (8, 16, 24, 32, 12) if quick else (128, 256, 384, 512, 200)
    batch = 2 if quick else 8
    shapes = [(f"len {n}", (_ids(cfg.vocab_size, batch, n, device, seed=n),)) for n in lengths]
    return Workload(LogitsOf(model).to(device=device, dtype=dtype).eval(), shapes=shapes)


def gpt2_lengths(device, dtype, quick):
    model, cfg = _hf("GPT2LMHeadModel", "GPT2Config", GPT2, TINY_GPT2, quick, **NO_DROPOUT_GPT2)
    lengths = (8, 16, 32) if quick else (256, 512, 1024)
    batch = 2 if quick else 8
    shapes = []
    for n in lengths:
        ids = _ids(cfg.vocab_size, batch, n, device, seed=n)
        shapes.append((f"len {n}", (ids, ids.clone())))
    return Workload(LossOf(model).to(device=device, dtype=dtype).train(), shapes=shapes, train=True)


# ------------------------------------------------------------------------------------------------ seed MLP

def seed_mlp(device, dtype, quick):
    from brrr.examples import mlp

    model, (x,) = _seeded(lambda: mlp(device=device, dtype=dtype, batch=8 if quick else 16384,
                                      dim=32 if quick else 1024))
    return Workload(model.train(), (x,), train=True)


CONFIGS = [
    # transformers, training
    Config("bert-mlm-train", "transformers", True, _masked_train(
        "BertForMaskedLM", "BertConfig", BERT, TINY_BERT, (8, 512), **NO_DROPOUT_BERT), cost=85),
    Config("gpt2-lm-train", "transformers", True, _causal_train(
        "GPT2LMHeadModel", "GPT2Config", GPT2, TINY_GPT2, (8, 1024), **NO_DROPOUT_GPT2), cost=90),
    Config("llama-train", "transformers", True, _causal_train(
        "LlamaForCausalLM", "LlamaConfig", LLAMA, TINY_LLAMA, (8, 1024), attention_dropout=0.0), cost=50),
    Config("albert-mlm-train", "transformers", True, _masked_train(
        "AlbertForMaskedLM", "AlbertConfig",
        dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, embedding_size=128),
        dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, embedding_size=16, vocab_size=128,
             num_hidden_layers=2), (8, 512),
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0), cost=85),
    Config("distilbert-mlm-train", "transformers", True, _masked_train(
        "DistilBertForMaskedLM", "DistilBertConfig", dict(),
        dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=128), (16, 512),
        dropout=0.0, attention_dropout=0.0), cost=40),
    Config("opt-125m-train", "transformers", True, _causal_train(
        "OPTForCausalLM", "OPTConfig",
        dict(hidden_size=768, num_hidden_layers=12, ffn_dim=3072, num_attention_heads=12, vocab_size=50272,
             max_position_embeddings=2048, word_embed_proj_dim=768),
        dict(hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2, vocab_size=128,
             max_position_embeddings=64, word_embed_proj_dim=32), (8, 1024),
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0), cost=25),
    Config("qwen2-0.5b-train", "transformers", True, _causal_train(
        "Qwen2ForCausalLM", "Qwen2Config",
        dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
             num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
             rope_theta=1000000.0),
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, tie_word_embeddings=True),
        (4, 1024), attention_dropout=0.0), cost=140),
    Config("gpt-neox-160m-train", "transformers", True, _causal_train(
        "GPTNeoXForCausalLM", "GPTNeoXConfig",
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
             vocab_size=50304, max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True),
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=128,
             max_position_embeddings=64, rotary_pct=0.25, use_parallel_residual=True), (8, 1024),
        hidden_dropout=0.0, attention_dropout=0.0), cost=70),
    # transformers, inference
    Config("llama-prefill", "transformers", False, llama_prefill, cost=45),
    Config("llama-decode", "transformers", False, llama_decode, cost=25),
    # vision
    Config("resnet50-infer", "vision", False, _vision(_torchvision_model("resnet50"), 64), cost=25),
    Config("resnet50-train", "vision", True, _vision(_torchvision_model("resnet50"), 64, train=True), cost=80),
    Config("mobilenet-v3-infer", "vision", False, _vision(_torchvision_model("mobilenet_v3_large"), 128),
           cost=40),
    Config("densenet121-train", "vision", True, _vision(_torchvision_model("densenet121"), 64, train=True),
           cost=235),
    Config("inception-v3-infer", "vision", False,
           _vision(_torchvision_model("inception_v3", aux_logits=False, init_weights=False), 64, size=299),
           cost=45),
    Config("vit-base-train", "vision", True, _vision(_timm_model("vit_base_patch16_224"), 64, train=True,
                                                     channels_last=False), cost=55),
    Config("deit-small-infer", "vision", False, _vision(_timm_model("deit_small_patch16_224"), 128,
                                                        channels_last=False), cost=25),
    Config("mixer-b16-train", "vision", True, _vision(_timm_model("mixer_b16_224"), 64, train=True,
                                                      channels_last=False), cost=65),
    # changing shapes
    Config("bert-lengths-infer", "changing-shapes", False, bert_lengths, cost=90),
    Config("gpt2-lengths-train", "changing-shapes", True, gpt2_lengths, cost=245),
    # the seeds' MLP
    Config("seed-mlp-train", "seed", True, seed_mlp, cost=10),
]
BY_NAME = {c.name: c for c in CONFIGS}


def select(only=None):
    """The configurations named (or whose family is named) in the comma-separated `only`; all when None."""
    if not only:
        return list(CONFIGS)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in BY_NAME and w not in {c.family for c in CONFIGS}]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; choose from {sorted(BY_NAME)} or a family")
    return [c for c in CONFIGS if c.name in wanted or c.family in wanted]


def parts(configs, count):
    """`configs` in `count` parts of about equal estimated cost, for separate calls or for GPUs that run at
    once: the costliest first, each into the part with the least cost so far (the lower part on a tie), so no
    part exceeds an even share by more than one configuration's cost. Deterministic; each part keeps the zoo's
    order, and a part can be empty when there are fewer configurations than parts."""
    out, loads = [[] for _ in range(count)], [0.0] * count
    for c in sorted(configs, key=lambda c: -c.cost):   # stable: equal costs in the zoo's order
        i = min(range(count), key=lambda j: (loads[j], j))
        out[i].append(c)
        loads[i] += c.cost
    order = {c.name: i for i, c in enumerate(configs)}
    return [sorted(part, key=lambda c: order[c.name]) for part in out]
