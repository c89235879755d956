"""Issue 42's four patterns ("Layouts chosen for the whole graph") as sweep configurations, and the sweep's
convolution nets: every model NCHW, as its user creates it (no channels_last conversion).

1. Depthwise 9x9 convolutions, inference, bf16, activation [32, 768, 32, 32]: the convolution alone (groups 768,
   padding 4), and four ConvMixer-768 blocks with kernel 9 (residual(depthwise -> GELU -> BN) -> 1x1 -> GELU ->
   BN; ConvMixer's patch-7 stem makes 32x32 of a 224 image).
2. Separable convolutions (depthwise 3x3 -> 1x1), inference, bf16: two of Xception's middle-flow blocks (three
   ReLU -> separable conv -> BN, and the residual) at 728 channels on [32, 728, 38, 38], 38x38 being where
   Xception's separable convolutions first reach 728 channels (37x37 at its 299-pixel input); and timm's
   xception41 as the sweep builds it (`timm-xception41-infer`: batch 32 at 299x299).
3. ResNet-18's training step, fp32: the sweep's `tv-resnet18-train-fp32` (torchvision's resnet18, batch 32 at
   224x224, cross-entropy).
4. EfficientNet and DeepLab, inference, bf16: timm's efficientnet_b0 as the sweep builds timm models (batch 32 at
   224x224), and torchvision's DeepLabV3-ResNet50 (dilated ResNet-50, output stride 8, ASPP head) as the sweep
   builds its segmentation models (21 classes, batch 8 at 512x512).

`sweep_convnets()`: the sweep's image configurations (timm, torchvision, and transformers' image and segmentation
models) as the catalog builds them; the zoo's are left out, its convolution nets being built channels_last. Which of
those are convolution nets is decided when each is built: a model with fewer than `CONV_NET_MIN` sliding 2-D
convolutions (a kernel over 1x1, a stride below it: a ViT's patch embedding does not slide) is left out, its entry
unavailable. Each pattern is a `catalog.Config` (family "layouts"; those taken from the sweep renamed, so that
the sweep's own can share their file); `quick` builds tiny shapes for the CPU smoke run (the catalog's tiny
convolution net for those the catalog builds).
"""

import dataclasses

import torch
from torch import nn

import catalog
from layout_report import NOT_CONV_NET, SWEEP
from models import Unavailable, Workload
from pattern_bench import sweep_config

FAMILY = "layouts"
CONV_NET_MIN = 3
IMAGE_KINDS = ("image", "segmentation")   # transformers' architectures that take images


class ConvMixerBlock(nn.Module):
    """ConvMixer's block (Trockman and Kolter): a residual depthwise convolution, then a pointwise one."""

    def __init__(self, dim, kernel):
        super().__init__()
        self.depthwise = nn.Sequential(nn.Conv2d(dim, dim, kernel, groups=dim, padding=kernel // 2), nn.GELU(),
                                       nn.BatchNorm2d(dim))
        self.pointwise = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), nn.BatchNorm2d(dim))

    def forward(self, x):
        return self.pointwise(x + self.depthwise(x))


class SeparableConv(nn.Sequential):
    """Xception's separable convolution: depthwise 3x3, then pointwise 1x1, neither with a bias."""

    def __init__(self, channels):
        super().__init__(nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
                         nn.Conv2d(channels, channels, 1, bias=False))


class XceptionBlock(nn.Module):
    """Xception's middle-flow block: three ReLU -> separable convolution -> BN, added to its input."""

    def __init__(self, channels):
        super().__init__()
        self.body = nn.Sequential(*(layer for _ in range(3)
                                    for layer in (nn.ReLU(), SeparableConv(channels), nn.BatchNorm2d(channels))))

    def forward(self, x):
        return x + self.body(x)


def _bf16_inference(make, shape, device):
    """`make()`'s model in bf16 for inference on a random activation of `shape`."""
    model = catalog._seeded(make).to(device=device, dtype=torch.bfloat16).eval()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=torch.bfloat16)
    return Workload(model, (x,))


def _depthwise_build(device, quick):
    n, c, s = (2, 8, 10) if quick else (32, 768, 32)
    return _bf16_inference(lambda: nn.Conv2d(c, c, 9, padding=4, groups=c), (n, c, s, s), device)


def _convmixer_build(device, quick):
    n, c, s = (2, 8, 10) if quick else (32, 768, 32)
    return _bf16_inference(lambda: nn.Sequential(*(ConvMixerBlock(c, 9) for _ in range(4))), (n, c, s, s), device)


def _xception_build(device, quick):
    n, c, s = (2, 8, 6) if quick else (32, 728, 38)
    return _bf16_inference(lambda: nn.Sequential(XceptionBlock(c), XceptionBlock(c)), (n, c, s, s), device)


def _from_sweep(sweep_name, name, cost):
    """The sweep's configuration under a name of its own: `--sweep-convnets` may measure the sweep's into the same
    file."""
    return dataclasses.replace(sweep_config(sweep_name), name=name, family=FAMILY, cost=cost)


def patterns():
    """[(pattern number, Config)] in the issue's order."""
    # costs: guesses (not yet measured), from the floor's patterns and the sweep's estimates
    own = [(1, "depthwise-conv9x9-infer-bf16", _depthwise_build, 35),
           (1, "convmixer-blocks-infer-bf16", _convmixer_build, 45),
           (2, "xception-middle-flow-infer-bf16", _xception_build, 45)]
    out = [(n, catalog.Config(name, FAMILY, False, build, "bf16", cost)) for n, name, build, cost in own]
    out += [(2, _from_sweep("timm-xception41-infer", "xception41-infer-bf16", 45)),
            (3, _from_sweep("tv-resnet18-train-fp32", "resnet18-train-fp32", 60)),
            (4, catalog.Config("efficientnet_b0-infer-bf16", FAMILY, False,
                               catalog._timm_build("efficientnet_b0", False, "bf16"), "bf16", 45)),
            (4, catalog.Config("deeplabv3_resnet50-infer-bf16", FAMILY, False,
                               catalog._torchvision_build("deeplabv3_resnet50", True, False, "bf16"), "bf16", 70))]
    return out


class NotConvNet(Unavailable):
    """A sweep configuration whose model is not a convolution net: left out of the issue's sweep criterion."""


def sliding_convolutions(model):
    """How many of `model`'s 2-D convolutions slide: a kernel over 1x1 with a stride below it somewhere."""
    return sum(isinstance(m, nn.Conv2d) and any(s < k for s, k in zip(m.stride, m.kernel_size) if k > 1)
               for m in model.modules())


def _convnet_only(build):
    def checked(device, quick):
        work = build(device, quick)
        found = sliding_convolutions(work.model)
        if found < CONV_NET_MIN:
            raise NotConvNet(f"{NOT_CONV_NET}: {found} sliding 2-D convolution(s)")
        return work
    return checked


def sweep_convnets():
    """[(SWEEP, Config)]: the sweep's image configurations, one family then another in turn (a run cut short has
    some of each), each built only to be measured when its model is a convolution net."""
    hf_images = tuple(f"hf-{arch}-" for arch, _, kind, _ in catalog.TRANSFORMERS if kind in IMAGE_KINDS)
    images = [c for c in catalog.all_configs() if c.family in ("timm", "torchvision") or c.name.startswith(hf_images)]
    return [(SWEEP, dataclasses.replace(c, build=_convnet_only(c.build))) for c in catalog.interleaved(images)]
