"""The sweep's configurations, enumerated from the libraries users build models with.

Families and the rule that picks each one's models (no model is picked by hand for how brrr does on it):

- `timm`: one model per timm architecture module with at least 5 registered models, the first one registered
  whose name names no large, high-resolution or pretraining-only variant. Built as
  `timm.create_model` makes it (NCHW, random weights) at its `pretrained_cfg` image size, batch 32: inference
  in bf16 for every one, a training step for two in five (the precisions in turn).
- `torchvision`: the first model registered of each classification family (the letters its name starts
  with), and the segmentation models on MobileNet or ResNet-50 (`weights=None`, 21 classes, 512x512, batch 8);
  inference, and a training step for every other one.
- `transformers`: 34 architectures built from their configs with random weights (decoder-only language
  models scaled to 1024 wide and 8 layers, the others at their config's own base size): every one trained
  through `labels` (mostly amp), every other one run for inference, and five run padded batches (attention
  masks) at changing lengths.
- `others`: torchaudio's own models and torch_geometric's message-passing nets on a random graph.
- `zoo`: the zoo's 21 configurations, as the zoo builds them.

`pins.json` pins what the timm and torchvision rules picked, so the judge stays the same set when a library
changes; `python3 benchmarks/sweep/catalog.py --pin` rewrites it on a machine that has both libraries.

Precisions, as users run them: `bf16` (weights and inputs in bf16), `amp` (fp32 weights under
`torch.autocast(dtype=torch.bfloat16)`, a fused AdamW step after backward, outside the compiled model, as
nanoGPT does) and `fp32` (TF32 off, PyTorch's default). Training steps cycle through the three; inference
alternates bf16 and fp32. `quick` builds a tiny model of each family for the CPU smoke run.
"""

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "zoo")]

import models as zoo  # noqa: E402
from models import ClassifierLoss, TinyConvNet, Unavailable, Workload  # noqa: E402

PRECISIONS = ("bf16", "amp", "fp32")
FAMILIES = ("timm", "torchvision", "transformers", "others", "zoo")
PINS = HERE / "pins.json"
TIMM_MIN_MODELS = 5
# a variant too large or too fine for a batch-32 sweep: its name says large, huge, a high resolution, ...
TIMM_SKIP = re.compile(r"(large|huge|giant|gigantic|xlarge|xxlarge|_xl|_l_|_l$|_h_|_g_|_e_|_384|_448|_512|_518|_336|"
                       r"_320|_256|_288|_160|_96|_128|_192|_64|_3b|_1b|_7b|_so400m|_200m|_600m|_1k_|in22k|_224_in21|"
                       r"_plus|_pwr|_ls_|_l\d|b[5-8]\b|resnet(101|152|200|269)|eva02_l|dino)")


@dataclass(frozen=True)
class Config:
    name: str
    family: str
    train: bool
    build: object            # (device, quick) -> Workload, in this configuration's precision
    precision: str = "bf16"  # bf16 | amp | fp32
    cost: float = 60.0       # estimated seconds with eager and brrr (the peers cached); for shares and budgets

    @property
    def dtype(self):
        """The weights' dtype: bf16 for bf16, fp32 for amp and fp32."""
        return torch.bfloat16 if self.precision == "bf16" else torch.float32


def _precision_of(index, train):
    return PRECISIONS[index % 3] if train else ("bf16", "fp32")[index % 2]


def _seeded(fn):
    torch.manual_seed(0)
    return fn()


def _images(batch, size, device, dtype, classes, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, size, size, generator=g).to(device=device, dtype=dtype)
    return images, torch.randint(0, classes, (batch,), generator=g).to(device)


def _image_workload(make, batch, size, train, dtype, device, quick, classes=1000):
    """An image model as its user has it (NCHW): logits for inference, cross-entropy for a training step."""
    model = _seeded(TinyConvNet if quick else make)
    b, s, classes = (2, 16, 10) if quick else (batch, size, classes)
    images, labels = _images(b, s, device, dtype, classes)
    model = model.to(device=device, dtype=dtype)
    if not train:
        return Workload(model.eval(), (images,))
    return Workload(ClassifierLoss(model).train(), (images, labels), train=True)


# ------------------------------------------------------------------------------------------------------ timm

def _timm():
    try:
        import timm
    except ImportError as e:
        raise Unavailable("needs timm") from e
    return timm


def timm_rule(modules):
    """{module: model} from {module: [model names in registration order]}: the modules with at least
    TIMM_MIN_MODELS models, each's first model that TIMM_SKIP lets through."""
    picked = {}
    for module in sorted(modules):
        names = modules[module]
        good = [n for n in names if not TIMM_SKIP.search(n) and not n.startswith("test_")]
        if len(names) >= TIMM_MIN_MODELS and good:
            picked[module] = good[0]
    return picked


def timm_modules(timm):
    """{module: [model names in registration order]} of the installed timm."""
    from timm.models import _registry

    order = getattr(_registry, "_model_to_module", None)
    out = {}
    if order:
        for name, module in order.items():
            out.setdefault(module.split(".")[-1], []).append(name)
        return out
    for module in timm.list_modules():
        out[module] = timm.list_models(module=module)
    return out


def pins():
    return json.loads(PINS.read_text())


def _timm_build(name, train, precision):
    def build(device, quick):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        if quick:
            return _image_workload(None, 0, 0, train, dtype, device, quick=True)
        timm = _timm()
        if not timm.is_model(name):
            raise Unavailable(f"timm {timm.__version__} has no model {name}")
        model = _seeded(lambda: timm.create_model(name, pretrained=False))
        size = model.pretrained_cfg.get("input_size", (3, 224, 224))[-1]
        return _image_workload(lambda: model, 32, size, train, dtype, device, quick=False,
                               classes=model.num_classes or 1000)
    return build


def timm_configs():
    out = []
    for i, (module, name) in enumerate(sorted(pins()["timm"]["models"].items())):
        out.append(Config(f"timm-{name}-infer", "timm", False, _timm_build(name, False, "bf16"), "bf16", cost=35))
        if i % 5 in (0, 2):
            precision = _precision_of(len([c for c in out if c.train]), True)
            out.append(Config(f"timm-{name}-train-{precision}", "timm", True, _timm_build(name, True, precision),
                              precision, cost=60))
    return out


# ----------------------------------------------------------------------------------------------- torchvision

def _torchvision():
    try:
        import torchvision
    except ImportError as e:
        raise Unavailable("needs torchvision") from e
    return torchvision


def torchvision_rule(classifiers, segmenters):
    """(classifiers, segmenters) picked from torchvision's model names in registration order: the first of each
    classification family (its name's leading letters: resnet, regnet, vit), and every segmentation model on
    a MobileNet or a ResNet-50."""
    picked = {}
    for name in classifiers:
        picked.setdefault(re.sub(r"\d.*", "", name.split("_")[0]), name)
    return list(picked.values()), [n for n in segmenters if re.search(r"mobilenet|resnet50", n)]


def torchvision_names(tv):
    """(classification, segmentation) model names of the installed torchvision, in registration order."""
    from torchvision.models import _api

    registered = list(getattr(_api, "BUILTIN_MODELS", {}))
    segmenters = set(tv.models.list_models(module=tv.models.segmentation))
    classifiers = set(tv.models.list_models(module=tv.models))
    return [n for n in registered if n in classifiers], [n for n in registered if n in segmenters]


def _segmentation_logits(model):
    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, images):
            return self.model(images)["out"]
    return Logits()


def _torchvision_build(name, segmentation, train, precision):
    def build(device, quick):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        if quick or not segmentation:
            make = None if quick else lambda: getattr(_torchvision().models, name)(weights=None)
            return _image_workload(make, 32, 224, train, dtype, device, quick)
        tv = _torchvision()
        model = _seeded(lambda: getattr(tv.models.segmentation, name)(weights=None, weights_backbone=None,
                                                                     num_classes=21, aux_loss=False))
        model = model.to(device=device, dtype=dtype)
        g = torch.Generator().manual_seed(0)
        images = torch.randn(8, 3, 512, 512, generator=g).to(device=device, dtype=dtype)
        if not train:
            return Workload(_segmentation_logits(model).eval(), (images,))
        labels = torch.randint(0, 21, (8, 512, 512), generator=g).to(device)
        return Workload(ClassifierLoss(model).train(), (images, labels), train=True)
    return build


def torchvision_configs():
    out = []
    tv = pins()["torchvision"]
    named = [(n, False) for n in tv["classification"]] + [(n, True) for n in tv["segmentation"]]
    for i, (name, segmentation) in enumerate(named):
        precision = _precision_of(i, False)
        out.append(Config(f"tv-{name}-infer-{precision}", "torchvision", False,
                          _torchvision_build(name, segmentation, False, precision), precision, cost=35))
        if i % 2 == 0:
            precision = _precision_of(i // 2, True)
            out.append(Config(f"tv-{name}-train-{precision}", "torchvision", True,
                              _torchvision_build(name, segmentation, True, precision), precision, cost=60))
    return out


# ------------------------------------------------------------------------------------------------ transformers

def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise Unavailable("needs the transformers package") from e
    return transformers


# decoder-only language models at one size: their default configs are 1-7B models
DECODER = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, intermediate_size=2816,
               max_position_embeddings=2048)
BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
SEQ2SEQ_BASE = dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                    decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072)

# (architecture, model class, kind, sizes over the config's defaults); kind picks the inputs and the loss
TRANSFORMERS = (
    ("bert", "BertForMaskedLM", "masked", {}),
    # RoBERTa-style positions start after the padding index: the published checkpoints' 514 positions hold 512 tokens
    ("roberta", "RobertaForMaskedLM", "masked", dict(max_position_embeddings=514)),
    ("distilbert", "DistilBertForMaskedLM", "masked", {}),
    ("albert", "AlbertForMaskedLM", "masked", dict(BASE, embedding_size=128)),
    ("electra", "ElectraForMaskedLM", "masked", {}),
    ("deberta-v2", "DebertaV2ForMaskedLM", "masked", dict(BASE)),
    ("mpnet", "MPNetForMaskedLM", "masked", dict(max_position_embeddings=514)),   # positions as RoBERTa's
    ("xlm-roberta", "XLMRobertaForMaskedLM", "masked", dict(max_position_embeddings=514)),
    ("gpt2", "GPT2LMHeadModel", "causal", {}),
    ("gpt-neo", "GPTNeoForCausalLM", "causal", dict(hidden_size=768, num_layers=12, num_heads=12,
                                                  attention_types=[[["global", "local"], 6]])),
    ("gpt-neox", "GPTNeoXForCausalLM", "causal", dict(DECODER, rotary_pct=0.25)),
    ("opt", "OPTForCausalLM", "causal", {}),
    ("bloom", "BloomForCausalLM", "causal", dict(hidden_size=1024, n_layer=8, n_head=16, vocab_size=65536)),
    ("llama", "LlamaForCausalLM", "causal", dict(DECODER, num_key_value_heads=8)),
    ("mistral", "MistralForCausalLM", "causal", dict(DECODER, num_key_value_heads=8, sliding_window=512)),
    ("qwen2", "Qwen2ForCausalLM", "causal", dict(DECODER, num_key_value_heads=4)),
    ("gemma", "GemmaForCausalLM", "causal", dict(DECODER, num_key_value_heads=1, head_dim=64, vocab_size=65536)),
    ("phi", "PhiForCausalLM", "causal", dict(DECODER)),
    ("falcon", "FalconForCausalLM", "causal", dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16)),
    ("gptj", "GPTJForCausalLM", "causal", dict(n_embd=1024, n_layer=8, n_head=16, rotary_dim=32)),
    ("stablelm", "StableLmForCausalLM", "causal", dict(DECODER, num_key_value_heads=16)),
    ("olmo", "OlmoForCausalLM", "causal", dict(DECODER)),
    ("t5", "T5ForConditionalGeneration", "seq2seq", {}),
    ("bart", "BartForConditionalGeneration", "seq2seq", dict(SEQ2SEQ_BASE)),
    ("marian", "MarianMTModel", "seq2seq", dict(SEQ2SEQ_BASE)),
    ("pegasus", "PegasusForConditionalGeneration", "seq2seq", dict(SEQ2SEQ_BASE)),
    ("mbart", "MBartForConditionalGeneration", "seq2seq", dict(SEQ2SEQ_BASE)),
    ("whisper", "WhisperForConditionalGeneration", "speech-seq2seq", {}),
    ("wav2vec2", "Wav2Vec2ForCTC", "ctc", {}),
    ("hubert", "HubertForCTC", "ctc", {}),
    ("vit", "ViTForImageClassification", "image", {}),
    ("swin", "SwinForImageClassification", "image", {}),
    ("convnext", "ConvNextForImageClassification", "image", {}),
    ("segformer", "SegformerForSemanticSegmentation", "segmentation", {}),
)
# dropout off, so that backends compute the same function
NO_DROPOUT = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
              "activation_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout", "dropout_rate",
              "classifier_dropout_prob", "embed_dropout", "resid_dropout", "attention_dropout_prob",
              "feat_proj_dropout", "final_dropout", "layerdrop", "encoder_layerdrop", "decoder_layerdrop",
              "mask_time_prob", "drop_path_rate", "classifier_dropout", "hidden_dropout_rate", "seq_classif_dropout")
# the tiny sizes of the CPU smoke run, by whichever field name an architecture uses
TINY = {"hidden_size": 32, "d_model": 32, "n_embd": 32, "dim": 32, "num_hidden_layers": 2, "n_layer": 2,
        "num_layers": 2, "n_layers": 2, "encoder_layers": 2, "decoder_layers": 2, "num_decoder_layers": 2,
        "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "ffn_dim": 64,
        "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "hidden_dim": 64, "d_ff": 64, "d_kv": 8, "head_dim": 8,
        "vocab_size": 128, "embedding_size": 16, "max_position_embeddings": 256, "rotary_dim": 4,
        "attention_types": [[["global", "local"], 1]], "sliding_window": 8, "image_size": 32, "patch_size": 8,
        "num_mel_bins": 16, "max_source_positions": 32, "max_target_positions": 64, "conv_dim": (16, 16),
        "conv_kernel": (10, 3), "conv_stride": (5, 2), "num_conv_pos_embeddings": 16, "hidden_sizes": [8, 16, 32, 64],
        "depths": [1, 1, 1, 1], "embed_dim": 16, "decoder_hidden_size": 32}
TINY_BATCH_SEQ = (2, 16)


def _hf_config(t, cls_name, sizes, quick):
    config_cls = getattr(t, cls_name).config_class
    defaults = config_cls().to_dict()
    fields = dict(sizes)
    if quick:
        fields.update({k: v for k, v in TINY.items() if k in defaults})
        if "depths" in defaults:
            fields["depths"] = TINY["depths"][:len(defaults["depths"])]
        if "num_heads" in defaults and isinstance(defaults["num_heads"], list):
            fields["num_heads"] = [2] * len(defaults["num_heads"])
        if "vocab_size" in defaults:   # special tokens inside the tiny vocabulary (Whisper's pad is an embedding's)
            fields.update({k: TINY["vocab_size"] - 1 for k, v in defaults.items()
                           if k.endswith("token_id") and isinstance(v, int) and v >= TINY["vocab_size"]})
    fields.update({k: 0.0 for k in NO_DROPOUT if isinstance(defaults.get(k), float)})
    return config_cls(**fields)


class HFStep(nn.Module):
    """A Hugging Face model called with its inputs by keyword (the compiled module takes them positionally):
    for training the model's own loss through `labels`, for inference its logits (or last hidden state). No
    generation cache: a step never reads one."""

    def __init__(self, model, names, train):
        super().__init__()
        self.model, self.names, self.is_step = model, tuple(names), train

    def forward(self, *args):
        kwargs = dict(zip(self.names, args))
        if getattr(self.model.config, "use_cache", None) is not None:
            kwargs["use_cache"] = False
        out = self.model(**kwargs)
        if self.is_step:
            return out.loss
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _names(kind, train):
    """The keyword names of a kind's inputs, in the order `_hf_inputs` makes them."""
    data = {"masked": "input_ids", "causal": "input_ids", "seq2seq": "input_ids", "speech-seq2seq": "input_features",
            "ctc": "input_values", "image": "pixel_values", "segmentation": "pixel_values"}[kind]
    names = [data] + (["attention_mask"] if kind in ("masked", "causal", "seq2seq") else [])
    if train:
        return names + ["labels"]
    return names + (["decoder_input_ids"] if kind in ("seq2seq", "speech-seq2seq") else [])


def _hf_inputs(kind, cfg, train, device, dtype, quick, seq=None, batch=None, seed=0):
    """The tensors of one step of `kind`, positionally (see `_names`)."""
    g = torch.Generator().manual_seed(seed)
    b, s = TINY_BATCH_SEQ if quick else (batch or 8, seq or 512)
    vocab = cfg.vocab_size if hasattr(cfg, "vocab_size") else 0

    def ids(n, length):
        return torch.randint(0, vocab, (n, length), generator=g).to(device)

    if kind in ("masked", "causal", "seq2seq"):
        data = ids(b, s)
        mask = torch.ones(b, s, dtype=torch.long, device=device)
        if not train:
            return (data, mask) + ((ids(b, s // 4),) if kind == "seq2seq" else ())
        if kind == "masked":
            keep = torch.rand(data.shape, generator=g).to(device) < 0.15
            labels = torch.where(keep, data, torch.full_like(data, -100))
        else:
            labels = ids(b, s // 4) if kind == "seq2seq" else data.clone()
        return data, mask, labels
    if kind == "speech-seq2seq":
        frames = 2 * cfg.max_source_positions
        features = torch.randn(b, cfg.num_mel_bins, frames, generator=g).to(device=device, dtype=dtype)
        return features, ids(b, 16 if quick else 128)
    if kind == "ctc":
        samples = 800 if quick else 16000 * 4
        audio = torch.randn(b, samples, generator=g).to(device=device, dtype=dtype)
        return (audio,) + ((torch.randint(1, vocab, (b, 8 if quick else 48), generator=g).to(device),) if train else ())
    size = cfg.image_size if isinstance(getattr(cfg, "image_size", None), int) else 224
    size = 32 if quick else (512 if kind == "segmentation" else size)
    images = torch.randn(b if quick else 32 if kind == "image" else 8, 3, size, size, generator=g).to(
        device=device, dtype=dtype)
    if not train:
        return (images,)
    n = images.shape[0]
    if kind == "segmentation":
        return images, torch.randint(0, cfg.num_labels, (n, size, size), generator=g).to(device)
    return images, torch.randint(0, cfg.num_labels, (n,), generator=g).to(device)


def _hf_batch_seq(kind):
    return {"causal": (8, 1024), "masked": (8, 512), "seq2seq": (8, 512), "speech-seq2seq": (8, None),
            "ctc": (8, None)}.get(kind, (None, None))


def _hf_build(arch, cls_name, kind, sizes, train, precision, lengths=None):
    def build(device, quick):
        t = _transformers()
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        cfg = _hf_config(t, cls_name, sizes, quick)
        model = _seeded(lambda: getattr(t, cls_name)(cfg))
        names = _names(kind, train)
        wrapper = HFStep(model, names, train).to(device=device, dtype=dtype)
        wrapper = wrapper.train() if train else wrapper.eval()
        batch, seq = _hf_batch_seq(kind)
        if lengths is None:
            return Workload(wrapper, _hf_inputs(kind, cfg, train, device, dtype, quick, seq, batch), train=train)
        shapes = []
        for n in (lengths[:3] if quick else lengths):
            inputs = _hf_inputs(kind, cfg, train, device, dtype, quick, seq=n, batch=batch, seed=n)
            inputs = _padded(inputs, seed=n)
            shapes.append((f"len {inputs[0].shape[1]}", inputs))
        return Workload(wrapper, shapes=shapes, train=train)
    return build


def _padded(inputs, seed):
    """A padded batch: each row's mask keeps a random length (at least half), zeros after it."""
    ids, mask = inputs[0], inputs[1].clone()
    g = torch.Generator().manual_seed(seed)
    length = mask.shape[1]
    keep = torch.randint(length // 2, length + 1, (mask.shape[0],), generator=g).to(mask.device)
    mask = (torch.arange(length, device=mask.device)[None, :] < keep[:, None]).long()
    return (ids, mask) + tuple(inputs[2:])


PADDED = ("bert", "roberta", "distilbert", "gpt2", "t5")   # padded batches at changing lengths
LENGTHS = (128, 256, 384, 512, 200)


def transformers_configs():
    out = []
    for i, (arch, cls_name, kind, sizes) in enumerate(TRANSFORMERS):
        train_precision = ("amp", "bf16", "amp", "fp32")[i % 4]
        out.append(Config(f"hf-{arch}-train-{train_precision}", "transformers", True,
                          _hf_build(arch, cls_name, kind, sizes, True, train_precision), train_precision, cost=60))
        if i % 2:
            continue
        infer_precision = _precision_of(i // 2, False)
        out.append(Config(f"hf-{arch}-infer-{infer_precision}", "transformers", False,
                          _hf_build(arch, cls_name, kind, sizes, False, infer_precision), infer_precision, cost=35))
    by_arch = {t[0]: t for t in TRANSFORMERS}
    for arch in PADDED:
        _, cls_name, kind, sizes = by_arch[arch]
        out.append(Config(f"hf-{arch}-padded-lengths-infer", "transformers", False,
                          _hf_build(arch, cls_name, kind, sizes, False, "bf16", LENGTHS), "bf16", cost=70))
    return out


# ------------------------------------------------------------------------------------ torchaudio, torch_geometric

def _package(name):
    try:
        return __import__(name)
    except ImportError as e:
        raise Unavailable(f"needs {name}") from e


class CTCStep(nn.Module):
    """An acoustic model's training step: CTC loss of its per-frame class scores against random targets. The
    frame and target lengths are made on the device unless passed (a training script's host tensors)."""

    def __init__(self, model, scores):
        super().__init__()
        self.model, self.scores = model, scores

    def forward(self, audio, targets, frames=None, lengths=None):
        logits = self.scores(self.model, audio)                      # [batch, frames, classes]
        log_probs = logits.float().log_softmax(-1).transpose(0, 1)  # [frames, batch, classes]
        if frames is None:
            frames = torch.full((audio.shape[0],), log_probs.shape[0], dtype=torch.long, device=audio.device)
        if lengths is None:
            lengths = torch.full((audio.shape[0],), targets.shape[1], dtype=torch.long, device=audio.device)
        return nn.functional.ctc_loss(log_probs, targets, frames, lengths)


class Scores(nn.Module):
    """An acoustic model's inference: its per-frame class scores."""

    def __init__(self, model, scores):
        super().__init__()
        self.model, self.scores = model, scores

    def forward(self, audio):
        return self.scores(self.model, audio)


class TinyAudioNet(nn.Module):
    """The quick run's stand-in for the audio models: a strided 1-D convolution stack and a projection."""

    def __init__(self, classes=16):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(1, 16, 10, stride=5), nn.GELU(), nn.Conv1d(16, 16, 3, stride=2),
                                  nn.GELU())
        self.norm, self.proj = nn.LayerNorm(16), nn.Linear(16, classes)

    def forward(self, audio):
        return self.proj(self.norm(self.conv(audio[:, None]).transpose(1, 2)))


def _wav2vec2_scores(model, audio):
    return model(audio)[0]


def _conformer_scores(model, audio):
    features = audio.unflatten(1, (-1, 80))
    lengths = torch.full((audio.shape[0],), features.shape[1], dtype=torch.long, device=audio.device)
    return model(features, lengths)[0]


def _deepspeech_scores(model, audio):
    return model(audio.unflatten(1, (-1, 80))[:, None])


def _plain_scores(model, audio):
    return model(audio)


class ConformerHead(nn.Module):
    """torchaudio's Conformer encoder over 80-band features, with a linear head to 32 classes."""

    def __init__(self, ta):
        super().__init__()
        self.encoder = ta.models.Conformer(input_dim=80, num_heads=4, ffn_dim=1024, num_layers=8,
                                           depthwise_conv_kernel_size=31)
        self.head = nn.Linear(80, 32)

    def forward(self, features, lengths):
        out, lengths = self.encoder(features, lengths)
        return self.head(out), lengths


AUDIO = {   # name -> (make(torchaudio), scores, samples per row, classes)
    "wav2vec2-base": (lambda ta: ta.models.wav2vec2_base(aux_num_out=32), _wav2vec2_scores, 16000 * 4, 32),
    "conformer": (ConformerHead, _conformer_scores, 400 * 80, 32),
    "deepspeech": (lambda ta: ta.models.DeepSpeech(n_feature=80, n_hidden=1024, n_class=32), _deepspeech_scores,
                   400 * 80, 32),
}


def _audio_build(name, train, precision):
    def build(device, quick):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        make, scores, samples, classes = AUDIO[name]
        if quick:
            make, scores, samples, classes = (lambda ta: TinyAudioNet(), _plain_scores, 400, 16)
            ta, batch = None, 2
        else:
            ta, batch = _package("torchaudio"), 16
        model = _seeded(lambda: make(ta)).to(device=device, dtype=dtype)
        g = torch.Generator().manual_seed(0)
        audio = torch.randn(batch, samples, generator=g).to(device=device, dtype=dtype)
        if not train:
            return Workload(Scores(model, scores).eval(), (audio,))
        targets = torch.randint(1, classes, (batch, 8 if quick else 40), generator=g).to(device)
        return Workload(CTCStep(model, scores).train(), (audio, targets), train=True)
    return build


def scatter_mean(values, index, count):
    """Mean of `values` rows grouped by `index` into `count` rows (what message passing aggregates)."""
    total = torch.zeros(count, values.shape[1], device=values.device, dtype=values.dtype)
    total = total.index_add(0, index, values)
    ones = torch.ones_like(index, dtype=values.dtype)
    degree = torch.zeros(count, device=values.device, dtype=values.dtype).index_add(0, index, ones)
    return total / degree.clamp(min=1)[:, None]


class TinyGraphNet(nn.Module):
    """The quick run's stand-in for the graph nets: two mean-aggregation message-passing layers."""

    def __init__(self, features=8, hidden=16, classes=4):
        super().__init__()
        self.first, self.second = nn.Linear(2 * features, hidden), nn.Linear(2 * hidden, classes)

    def forward(self, x, edge_index):
        for i, layer in enumerate((self.first, self.second)):
            x = layer(torch.cat([x, scatter_mean(x[edge_index[0]], edge_index[1], x.shape[0])], 1))
            x = x.relu() if i == 0 else x
        return x


class NodeLoss(nn.Module):
    """A graph net's training step: cross-entropy of its node classes."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, edge_index, labels):
        return nn.functional.cross_entropy(self.model(x, edge_index).float(), labels)


GRAPHS = {   # name -> make(torch_geometric.nn.models)
    "gcn": lambda m: m.GCN(128, 256, num_layers=3, out_channels=40),
    "gat": lambda m: m.GAT(128, 64, num_layers=2, out_channels=40, heads=4),
    "graphsage": lambda m: m.GraphSAGE(128, 256, num_layers=3, out_channels=40),
    "gin": lambda m: m.GIN(128, 256, num_layers=3, out_channels=40),
}


def _graph_build(name, train, precision):
    def build(device, quick):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        if quick:
            model, nodes, edges, features, classes = TinyGraphNet(), 32, 96, 8, 4
        else:
            models = _package("torch_geometric").nn.models
            model, nodes, edges, features, classes = _seeded(lambda: GRAPHS[name](models)), 50_000, 500_000, 128, 40
        return graph_workload(model, nodes, edges, features, classes, train, device, dtype)
    return build


def graph_workload(model, nodes, edges, features, classes, train, device, dtype):
    """A node-classification net on a random graph: random features and edges (no self loops added), its
    node classes for inference, cross-entropy against random labels for a training step."""
    model = model.to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, features, generator=g).to(device=device, dtype=dtype)
    edge_index = torch.randint(0, nodes, (2, edges), generator=g).to(device)
    if not train:
        return Workload(model.eval(), (x, edge_index))
    labels = torch.randint(0, classes, (nodes,), generator=g).to(device)
    return Workload(NodeLoss(model).train(), (x, edge_index, labels), train=True)


def others_configs():
    out = []
    for i, name in enumerate(AUDIO):
        out.append(Config(f"audio-{name}-train-{PRECISIONS[(i + 1) % 3]}", "others", True,
                          _audio_build(name, True, PRECISIONS[(i + 1) % 3]), PRECISIONS[(i + 1) % 3], cost=60))
        out.append(Config(f"audio-{name}-infer-{_precision_of(i, False)}", "others", False,
                          _audio_build(name, False, _precision_of(i, False)), _precision_of(i, False), cost=35))
    for i, name in enumerate(GRAPHS):
        out.append(Config(f"pyg-{name}-train-{PRECISIONS[(i + 2) % 3]}", "others", True,
                          _graph_build(name, True, PRECISIONS[(i + 2) % 3]), PRECISIONS[(i + 2) % 3], cost=40))
        out.append(Config(f"pyg-{name}-infer-{_precision_of(i + 1, False)}", "others", False,
                          _graph_build(name, False, _precision_of(i + 1, False)), _precision_of(i + 1, False),
                          cost=30))
    return out


# ------------------------------------------------------------------------------------------------------- zoo

def _zoo_build(config):
    return lambda device, quick: config.build(device, torch.bfloat16, quick)


def zoo_configs():
    return [Config(f"zoo-{c.name}", "zoo", c.train, _zoo_build(c), "bf16", cost=c.cost / 2) for c in zoo.CONFIGS]


# ------------------------------------------------------------------------------------------------ the catalog

def all_configs():
    return timm_configs() + torchvision_configs() + transformers_configs() + others_configs() + zoo_configs()


def interleaved(configs):
    """`configs` taking one of each family in turn (each family in its own order): a run cut short by its
    time budget has measured some of every family, not all of the first."""
    queues = {}
    for c in configs:
        queues.setdefault(c.family, []).append(c)
    out = []
    while any(queues.values()):
        for family in list(queues):
            if queues[family]:
                out.append(queues[family].pop(0))
    return out


def select(configs, only=None, family=None):
    """The configurations named in the comma-separated `only` and those of the families in `family`; every
    one when both are None."""
    if not only and not family:
        return list(configs)
    names = {w.strip() for w in (only or "").split(",") if w.strip()}
    families = {w.strip() for w in (family or "").split(",") if w.strip()}
    unknown = sorted(names - {c.name for c in configs}) + sorted(families - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown configuration(s) or families {unknown}")
    return [c for c in configs if c.name in names or c.family in families]


def pin():
    """Rewrite pins.json from the installed timm and torchvision by the rules above."""
    timm, tv = _timm(), _torchvision()
    classifiers, segmenters = torchvision_rule(*torchvision_names(tv))
    PINS.write_text(json.dumps({"timm": {"version": timm.__version__, "models": timm_rule(timm_modules(timm))},
                                "torchvision": {"version": tv.__version__, "classification": classifiers,
                                                "segmentation": segmenters}}, indent=1) + "\n")


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pin", action="store_true", help="rewrite pins.json from the installed timm and torchvision")
    args = p.parse_args(argv)
    if args.pin:
        pin()
    configs = all_configs()
    for family in FAMILIES:
        mine = [c for c in configs if c.family == family]
        print(f"{family}: {len(mine)} ({sum(c.train for c in mine)} training)")
    print(f"all: {len(configs)} ({sum(c.train for c in configs)} training); precisions "
          f"{ {p: sum(c.precision == p for c in configs) for p in PRECISIONS} }")


if __name__ == "__main__":
    main()
