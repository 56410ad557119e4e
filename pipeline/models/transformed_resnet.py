"""Theorem 1 on a whole trained network: ResNet18 with every 3x3 convolution rebuilt as Theorem 1's attention.

``attention_from_conv`` (``conv_to_attention.py``) turns one convolution into a 9-head quadratic self-attention layer
with the same output; here it is applied to every 3x3 convolution of ``ResNet18``: the stem and both convolutions of
every ``BasicBlock``. A stride-2 convolution becomes attention on the padded grid followed by fixed subsampling, as the
paper's remark on strides says. The rest is kept as it is, because it is not a convolution with a kernel larger than
one tap: batch norms, ReLUs, residual additions, the 1x1 stride-2 shortcut convolutions (a 1x1 convolution is a
per-token linear map, one head attending to its own token, so converting it would add nothing), the average pool and
the classifier.

Exactness. The heads attend to their tap with probability ``1 - O(exp(-alpha))`` (``DEFAULT_ALPHA`` = 50), so the
network's logits equal ResNet18's to float64 rounding (tests: <= 1e-9 on a trained ResNet) and, in float32, to the
rounding of a different summation order (the value projection sums the 9 taps x channels in another order than the
convolution). What cannot be exact is training the heads' positions: at that alpha the softmax is saturated and a
centre's or spread's gradient is ``O(exp(-alpha))``, so fine-tuning moves the heads only as far as that allows.

``TransformedResNet18`` builds the architecture (random weights, as ``build_model`` does for any variant) so that a
checkpoint of a converted network loads into it; ``transform_resnet`` converts a trained ResNet18 with its weights.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from pipeline.models.conv_to_attention import DEFAULT_ALPHA, ConvAsAttention, attention_from_conv
from pipeline.models.resnet import ResNet18


def _is_spatial(module: nn.Module) -> bool:
    """A convolution with a kernel larger than one tap: what Theorem 1 turns into attention."""
    return isinstance(module, nn.Conv2d) and module.kernel_size != (1, 1)


def convert_convolutions(model: nn.Module, alpha: float = DEFAULT_ALPHA) -> list[str]:
    """Replace, in place, every spatial convolution of ``model`` by its ``ConvAsAttention``; the converted names."""
    names = [name for name, module in model.named_modules() if _is_spatial(module)]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, attention_from_conv(getattr(parent, child), alpha))
    return names


class TransformedResNet18(ResNet18):
    """ResNet18 whose 3x3 convolutions are 9-head quadratic attention layers (Theorem 1), the rest unchanged."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 64) -> None:
        super().__init__(num_classes=num_classes, in_channels=in_channels, width=width)
        self.converted = convert_convolutions(self)

    def attention_layers(self) -> list[ConvAsAttention]:
        """The converted layers in forward order (stem, then each block's conv1 and conv2)."""
        return [self.get_submodule(name) for name in self.converted]

    def head_geometry(self) -> list[dict[str, Tensor]]:
        """Per converted layer, each head's centre and ``Sigma^-1`` (the trial's head history, as for SA models)."""
        return [layer.attention.head_geometry() for layer in self.attention_layers()]

    def no_weight_decay(self) -> set[str]:
        """The heads' centres and spreads: trained without weight decay, at ``positional_lr_factor``, as in SA."""
        return {name for name, _ in self.named_parameters() if ".encoding." in name}

    def layer_grids(self, image_shape: tuple[int, int, int]) -> list[tuple[int, int]]:
        """The padded token grid each converted layer attends over, for images of ``image_shape`` (C, H, W)."""
        grids: list[tuple[int, int]] = []
        hooks = [
            layer.attention.register_forward_pre_hook(lambda _, args: grids.append(tuple(args[1])))
            for layer in self.attention_layers()
        ]
        try:
            with torch.no_grad():
                self.eval()(torch.zeros(1, *image_shape, dtype=self.classifier.weight.dtype))
        finally:
            for hook in hooks:
                hook.remove()
        return grids


def transform_resnet(resnet: ResNet18, alpha: float = DEFAULT_ALPHA) -> TransformedResNet18:
    """The trained ``resnet`` rebuilt as attention: the same function (see the module docstring), with its own copy of
    every kept weight and buffer (``resnet`` is not changed), in eval mode, on ``resnet``'s device and dtype."""
    stem: nn.Conv2d = resnet.stem[0]
    converted = copy.deepcopy(resnet)
    convert_convolutions(converted, alpha)  # the same modules, in the same places, as the class builds
    model = TransformedResNet18(resnet.classifier.out_features, stem.in_channels, stem.out_channels)
    model.to(device=stem.weight.device, dtype=stem.weight.dtype)
    model.load_state_dict(converted.state_dict())
    return model.eval()


__all__ = ["TransformedResNet18", "convert_convolutions", "transform_resnet"]
