"""Built-in models for `--example NAME`: the seeds' memory-bound MLP and small transformer configs.

Every builder returns `(model, example_inputs)` on the requested device and dtype, the same contract as a
user's `FILE.py:FUNC`.
"""

import torch
from torch import nn

from brrr.errors import BrrrError


class SeedMLP(nn.Module):
    """Linear -> GELU -> Linear -> LayerNorm: the memory-bound block from the seeds."""

    def __init__(self, dim=1024):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.fc2(self.act(self.fc1(x))))


def mlp(device="cpu", dtype=torch.float32, batch=512, dim=1024):
    model = SeedMLP(dim).to(device=device, dtype=dtype)
    x = torch.randn(batch, dim, device=device, dtype=dtype)
    return model, (x,)


def _hf_model(kind, device, dtype, layers, hidden, heads, batch, seq):
    try:
        import transformers
    except ImportError as e:  # transformers is a test/bench extra
        raise BrrrError(f"--example {kind} needs the 'transformers' package: pip install transformers") from e
    if kind == "bert":
        cfg = transformers.BertConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            intermediate_size=4 * hidden, vocab_size=30522, max_position_embeddings=max(512, seq),
        )
        model = transformers.BertModel(cfg)
    else:
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=max(1024, seq))
        model = transformers.GPT2Model(cfg)
    model = model.to(device=device, dtype=dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    return model, (ids,)


def bert(device="cpu", dtype=torch.float32, layers=2, hidden=128, heads=2, batch=2, seq=32):
    """A small random-init BERT by default; BERT-base is layers=12, hidden=768, heads=12."""
    return _hf_model("bert", device, dtype, layers, hidden, heads, batch, seq)


def gpt2(device="cpu", dtype=torch.float32, layers=2, hidden=128, heads=2, batch=2, seq=32):
    """A small random-init GPT-2 by default; GPT-2 small is layers=12, hidden=768, heads=12."""
    return _hf_model("gpt2", device, dtype, layers, hidden, heads, batch, seq)


def bert_base(device="cpu", dtype=torch.float32, batch=8, seq=512):
    return bert(device, dtype, layers=12, hidden=768, heads=12, batch=batch, seq=seq)


def gpt2_small(device="cpu", dtype=torch.float32, batch=8, seq=512):
    return gpt2(device, dtype, layers=12, hidden=768, heads=12, batch=batch, seq=seq)


EXAMPLES = {"mlp": mlp, "bert": bert, "gpt2": gpt2, "bert-base": bert_base, "gpt2-small": gpt2_small}


def build_example(name, device="cpu", dtype=torch.float32, **sizes):
    if name not in EXAMPLES:
        raise BrrrError(f"unknown example {name!r}; choose one of: {', '.join(EXAMPLES)}")
    return EXAMPLES[name](device=device, dtype=dtype, **sizes)
