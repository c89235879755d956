"""The "floor" issue's five patterns as sweep configurations: each a model and its inputs at the issue's shapes.

1. Batch norm + ReLU, training, fp32, NCHW [128, 64, 112, 112]: the block alone (its input requiring grad), and
   ResNet-18's stem (conv 7x7/2 -> BN -> ReLU on [128, 3, 224, 224]), which makes that activation.
2. PoolFormer's token mixer (timm's `Pooling`: avg_pool2d(3, 1, 1, count_include_pad=False)(y) - y) between two
   one-group GroupNorms, inference, bf16 [32, 64, 56, 56].
3. F.fold (col2im) as T2T uses it: unfold -> Linear over each patch -> fold, four times, inference, bf16
   [32, 64, 56, 56] (columns [32, 576, 3136], kernel 3, padding 1).
4. A two-layer graph-attention net (GATConv's message passing in plain torch: gather by edge, attention logits,
   softmax over incoming edges by scatter_reduce(amax) + scatter_add, weighted scatter_add), training step,
   bf16, 50k nodes, 500k edges (+ self loops), 128 features, 64 hidden x 4 heads, 40 classes.
5. Host-bound speech training: the sweep's Whisper (`hf-whisper-train-fp32`: tiny config, 80 x 3000 log-mels,
   loss through labels) and its wav2vec2 (`hf-wav2vec2-train-amp`'s model) under a CTC loss given host (CPU)
   length tensors, as training scripts pass them.

Each is a `catalog.Config` (family "floor"), so the sweep's `run_config` measures it; `quick` builds tiny
shapes for the CPU smoke run. `patterns()` pairs each with the issue's pattern number.
"""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

import catalog
from models import Workload
from pattern_bench import sweep_config

FAMILY = "floor"


def _randn(shape, device, dtype, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


class BatchNormReLU(nn.Module):
    """BatchNorm2d -> ReLU: the block whose backward the issue measured (BN backward fused with ReLU's)."""

    def __init__(self, channels):
        super().__init__()
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(self.norm(x))


class Stem(nn.Module):
    """ResNet-18's stem up to its ReLU: conv 7x7 stride 2 -> BatchNorm2d -> ReLU."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 7, stride=2, padding=3, bias=False)
        self.block = BatchNormReLU(channels)

    def forward(self, images):
        return self.block(self.conv(images))


class PoolMixer(nn.Module):
    """PoolFormer's token mixing between its norms: x + (pool(norm1(x)) - norm1(x)), then norm2."""

    def __init__(self, channels):
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(1, channels), nn.GroupNorm(1, channels)
        self.pool = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)

    def forward(self, x):
        y = self.norm1(x)
        return self.norm2(x + (self.pool(y) - y))


class FoldMixer(nn.Module):
    """unfold -> Linear over each k x k patch -> fold back to the image, `depth` times (T2T's soft split and its
    way back); each fold sums k*k overlapping patches, hence the division."""

    def __init__(self, channels, size, kernel=3, depth=4):
        super().__init__()
        self.size, self.kernel = (size, size), kernel
        patch = channels * kernel * kernel
        self.proj = nn.ModuleList(nn.Linear(patch, patch) for _ in range(depth))

    def forward(self, x):
        k = self.kernel
        for proj in self.proj:
            cols = F.unfold(x, k, padding=k // 2)                       # [B, C*k*k, H*W]
            cols = proj(cols.transpose(1, 2)).transpose(1, 2)
            x = F.fold(cols, self.size, k, padding=k // 2) / (k * k)
        return x


class GATLayer(nn.Module):
    """GATConv (Velickovic et al.) as PyG computes it, in plain torch ops: self loops added, softmax over each
    node's incoming edges with the maximum taken off first (detached, as PyG's softmax does)."""

    def __init__(self, features, out, heads, concat=True):
        super().__init__()
        self.heads, self.out, self.concat = heads, out, concat
        self.lin = nn.Linear(features, heads * out, bias=False)
        self.att_src = nn.Parameter(torch.randn(heads, out) * out ** -0.5)
        self.att_dst = nn.Parameter(torch.randn(heads, out) * out ** -0.5)
        self.bias = nn.Parameter(torch.zeros(heads * out if concat else out))

    def forward(self, x, edge_index):
        n = x.shape[0]
        loops = torch.arange(n, device=x.device)
        src, dst = torch.cat([edge_index[0], loops]), torch.cat([edge_index[1], loops])
        h = self.lin(x).unflatten(1, (self.heads, self.out))                               # [N, H, C]
        logits = F.leaky_relu((h * self.att_src).sum(-1)[src] + (h * self.att_dst).sum(-1)[dst], 0.2)  # [E, H]
        index = dst[:, None].expand_as(logits)
        peak = logits.new_full((n, self.heads), float("-inf")).scatter_reduce(0, index, logits.detach(), "amax")
        weight = (logits - peak[dst]).exp()
        total = weight.new_zeros(n, self.heads).scatter_add(0, index, weight)
        messages = h[src] * (weight / total[dst])[..., None]                               # [E, H, C]
        out = messages.new_zeros(n, self.heads, self.out).scatter_add(
            0, dst[:, None, None].expand_as(messages), messages)
        return (out.flatten(1) if self.concat else out.mean(1)) + self.bias


class GAT(nn.Module):
    """Two GAT layers, as PyG's `GAT(features, hidden, num_layers=2, out_channels=classes, heads=heads)`."""

    def __init__(self, features, hidden, classes, heads):
        super().__init__()
        self.first = GATLayer(features, hidden, heads)
        self.second = GATLayer(hidden * heads, classes, 1, concat=False)

    def forward(self, x, edge_index):
        return self.second(F.elu(self.first(x, edge_index)), edge_index)


def _block_build(device, quick):
    n, c, s = (2, 8, 6) if quick else (128, 64, 112)
    model = catalog._seeded(lambda: BatchNormReLU(c)).to(device).train()
    return Workload(model, (_randn((n, c, s, s), device, torch.float32).requires_grad_(),), train=True)


def _stem_build(device, quick):
    n, c, s = (2, 8, 16) if quick else (128, 64, 224)
    model = catalog._seeded(lambda: Stem(c)).to(device).train()
    return Workload(model, (catalog._images(n, s, device, torch.float32, classes=2)[0],), train=True)


def _pool_build(device, quick):
    n, c, s = (2, 8, 6) if quick else (32, 64, 56)
    model = catalog._seeded(lambda: PoolMixer(c)).to(device=device, dtype=torch.bfloat16).eval()
    return Workload(model, (_randn((n, c, s, s), device, torch.bfloat16),))


def _fold_build(device, quick):
    n, c, s = (2, 4, 6) if quick else (32, 64, 56)
    model = catalog._seeded(lambda: FoldMixer(c, s)).to(device=device, dtype=torch.bfloat16).eval()
    return Workload(model, (_randn((n, c, s, s), device, torch.bfloat16),))


def _gat_build(device, quick):
    nodes, edges, features, hidden, heads, classes = (32, 96, 8, 4, 2, 4) if quick else \
        (50_000, 500_000, 128, 64, 4, 40)
    model = catalog._seeded(lambda: GAT(features, hidden, classes, heads))
    return catalog.graph_workload(model, nodes, edges, features, classes, True, device, torch.bfloat16)


WAV2VEC2 = "hf-wav2vec2-train-amp"


def _ctc_host_lengths_build(device, quick):
    """The sweep's wav2vec2 (Wav2Vec2ForCTC, its config's base size, 4 s of 16 kHz audio, batch 8) under the
    catalog's CTC step, its frame and target lengths int64 tensors on the host."""
    work = sweep_config(WAV2VEC2).build(device, quick)
    audio, targets = work.inputs
    audio = audio[:, :400] if quick else audio   # 39 frames: each interpreted kernel's grid halves
    model = work.model.model
    frames = int(model._get_feat_extract_output_lengths(torch.tensor(audio.shape[1])))
    batch = audio.shape[0]
    lengths = (torch.full((batch,), frames, dtype=torch.long), torch.full((batch,), targets.shape[1], dtype=torch.long))
    return Workload(catalog.CTCStep(model, catalog._wav2vec2_scores).train(), (audio, targets) + lengths, train=True)


def patterns():
    """[(pattern number, Config)] in the issue's order."""
    # costs: seconds each took with the four backends on an H100 at 1aca9d1, rounded up
    own = [(1, "bn-relu-block-train-fp32", True, _block_build, "fp32", 45),
           (1, "resnet18-stem-train-fp32", True, _stem_build, "fp32", 30),
           (2, "poolformer-mixer-infer-bf16", False, _pool_build, "bf16", 30),
           (3, "fold-mixer-infer-bf16", False, _fold_build, "bf16", 35),
           (4, "gat-train-bf16", True, _gat_build, "bf16", 40)]
    out = [(n, catalog.Config(name, FAMILY, train, build, precision, cost))
           for n, name, train, build, precision, cost in own]
    out.append((5, dataclasses.replace(sweep_config("hf-whisper-train-fp32"), family=FAMILY, cost=90)))
    out.append((5, catalog.Config("wav2vec2-ctc-host-lengths-train-amp", FAMILY, True, _ctc_host_lengths_build,
                                  "amp", cost=85)))
    return out

