"""Models of the paper: the self-attention classifier, its positional encodings, ResNet18, and Theorem 1.

- ``positional``         the interface of the relative positional encodings that are the attention scores
- ``gaussian``           Gaussian heads (a centre and a ``Sigma^-1`` each), shared by the two quadratic encodings
- ``quadratic``          the paper's quadratic encoding (Eq. 9)
- ``generalized_quadratic`` the quadratic encoding with a full ``Sigma^-1`` per head (App. A.1)
- ``learned``            the learned relative encoding (Sec. 4.3)
- ``attention``          multi-head self-attention with position-only scores (Eq. 9-11), heads at full width
- ``content``            beyond the paper: content (query-key) scores added to any encoding's (``model.content``)
- ``gpsa``               beyond the paper: ConViT's gated positional self-attention, started as a convolution
- ``kinds``              the attention layer a registry entry (``pipeline.encodings``) names, with its fields
- ``local_attention``    the locality-truncated fast path of the same attention
- ``sa_net``             the fully-attentional classifier (2x2 invertible downsampling, 6 layers, pooling, linear)
- ``resnet``             the ResNet18 baseline
- ``conv_to_attention``  Theorem 1: a convolution rebuilt as an exactly equal multi-head self-attention layer
- ``transformed_resnet`` Theorem 1 on a whole ResNet18: every 3x3 convolution as attention
- ``pruning``            which Gaussian heads are degenerate, and removing them

``build_model(cfg)`` below builds the model a ``ModelConfig`` describes. Each encoding is the registry's
(``pipeline.encodings``) and each architecture beside the self-attention net is ``ARCHITECTURES``'s: both are named,
imported only when built, so a trial's code identity (``pipeline.trial.code_version``) counts only the modules of the
model it builds.
"""

from __future__ import annotations

import importlib
from numbers import Integral

from torch import nn

from pipeline.config import ModelConfig
from pipeline.encodings import spec_for
from pipeline.models.kinds import attention_class, layer_encoding
from pipeline.models.local_attention import localise_attention
from pipeline.models.sa_net import SelfAttentionNet

# The model class of each architecture but the self-attention net, as ``module:Class``: imported only when one is built
# (torchvision costs ~1.3 s to import). A literal: the trial code identity reads it without importing this package.
# t_resnet18's weights come from a converted ResNet18's checkpoint (pipeline.models.transformed_resnet).
ARCHITECTURES = {
    "resnet18": "pipeline.models.resnet:ResNet18",
    "t_resnet18": "pipeline.models.transformed_resnet:TransformedResNet18",
}


def build_model(
    cfg: ModelConfig,
    *,
    image_size: int = 32,
    in_channels: int = 3,
    num_classes: int = 10,
    heads_per_layer: list[int] | None = None,
) -> nn.Module:
    """The model described by ``cfg`` for images of ``in_channels x image_size x image_size``.

    ``heads_per_layer`` overrides ``cfg.heads`` layer by layer (a pruned model); its length must be ``cfg.layers``,
    and a layer may have 0 heads (pruned to its value bias, see ``pipeline.models.attention``).
    """
    if cfg.arch in ARCHITECTURES:
        module, name = ARCHITECTURES[cfg.arch].split(":")
        network = getattr(importlib.import_module(module), name)
        return network(num_classes=num_classes, in_channels=in_channels, width=cfg.resnet_width)
    heads = heads_per_layer if heads_per_layer is not None else [cfg.heads] * cfg.layers
    if len(heads) != cfg.layers:
        raise ValueError(f"heads_per_layer has {len(heads)} entries for {cfg.layers} layers")
    if any(isinstance(h, bool) or not isinstance(h, Integral) or h < 0 for h in heads):
        raise ValueError(f"heads_per_layer must hold integers >= 0 (0: a layer without heads), got {heads}")
    grid = image_size // cfg.downsample
    fields = {key: getattr(cfg, key) for key in spec_for(cfg.encoding).fields}  # those its registry entry declares
    # Every layer's encoding first, then the network (the paper's order of random draws, kept for every encoding).
    encodings = [layer_encoding(cfg.encoding, h, max_grid=grid, **fields) for h in heads]
    model = SelfAttentionNet(
        encodings,
        attention=attention_class(cfg.encoding, content=cfg.content),
        image_size=image_size,
        in_channels=in_channels,
        num_classes=num_classes,
        hidden=cfg.hidden,
        ffn=cfg.ffn,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        layer_norm_eps=cfg.layer_norm_eps,
        downsample=cfg.downsample,
    )
    if cfg.attention_window_eps is not None:  # beyond the paper: locality-truncated attention
        localise_attention(model, cfg.attention_window_eps)
    return model


__all__ = ["ARCHITECTURES", "SelfAttentionNet", "build_model"]
