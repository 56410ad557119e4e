"""The paper's fully-attentional image classifier (Cordonnier et al., Sec. 4.1 and App. A.4).

    image (B, 3, 32, 32) -> 2x2 invertible downsampling -> (B, 16*16, 12) -> Linear(12, 400)
    -> 6 x [post-LN BERT layer: MHSA + Dense, residual, LN; FFN 400-512-400 (exact GELU), residual, LN]
    -> mean over the 16 x 16 tokens -> Linear(400, 10)

No positional embedding is added to the input and there is no CLS token: positions enter only through the
attention scores. PyTorch's default initialisation everywhere, as in the authors' code.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.positional import PositionalEncoding


def space_to_depth(images: Tensor, block: int = 2) -> Tensor:
    """Invertible downsampling (Jacobsen et al. 2018): (B, C, H, W) -> (B, H/b * W/b, b*b*C) tokens.

    Channel order follows the authors' code: token (0, 0) holds the C channels of pixel (0, 0), then (0, 1),
    (1, 0), (1, 1). That is a fixed permutation of ``pixel_unshuffle``'s order (tested).
    """
    B, C, H, W = images.shape  # noqa: N806
    if H % block or W % block:
        raise ValueError(f"image {H}x{W} is not divisible by the downsampling block {block}")
    x = images.reshape(B, C, H // block, block, W // block, block)  # (B, C, h, di, w, dj)
    x = x.permute(0, 2, 4, 3, 5, 1)  # (B, h, w, di, dj, C)
    return x.reshape(B, (H // block) * (W // block), block * block * C)


class TransformerLayer(nn.Module):
    """Post-LayerNorm BERT layer with position-only attention (the authors' ``BertLayer``)."""

    def __init__(
        self,
        encoding: PositionalEncoding,
        hidden: int,
        ffn: int,
        dropout: float,
        attention_dropout: float,
        layer_norm_eps: float,
        attention: type[MultiHeadSelfAttention] = MultiHeadSelfAttention,
    ) -> None:
        super().__init__()
        self.attention = attention(encoding, hidden, attention_dropout=attention_dropout)
        self.attention_dense = nn.Linear(hidden, hidden)  # BertSelfOutput.dense, after the heads' Linear
        self.attention_norm = nn.LayerNorm(hidden, eps=layer_norm_eps)
        self.ffn_in = nn.Linear(hidden, ffn)
        self.ffn_out = nn.Linear(ffn, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)
        self.activation = nn.GELU()  # exact (erf) GELU

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:  # (B, N, hidden) -> (B, N, hidden)
        x = self.attention_norm(x + self.dropout(self.attention_dense(self.attention(x, grid))))
        return self.ffn_norm(x + self.dropout(self.ffn_out(self.activation(self.ffn_in(x)))))


class SelfAttentionNet(nn.Module):
    """Fully-attentional classifier. ``encodings`` gives one positional encoding per layer (its head count);
    ``attention`` is the layer built on each (the paper's, or one of ``pipeline.models.kinds``: content scores added,
    ConViT's gated heads), constructed as ``attention(encoding, hidden, attention_dropout=...)``.

    Layers may have different head counts, which is what a pruned model is, down to none (the layer's attention
    branch is then its value bias, then Dense, residual and LayerNorm, then the FFN as usual).
    """

    def __init__(
        self,
        encodings: Sequence[PositionalEncoding],
        *,
        image_size: int,
        in_channels: int = 3,
        num_classes: int = 10,
        hidden: int = 400,
        ffn: int = 512,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        layer_norm_eps: float = 1e-12,
        downsample: int = 2,
        attention: type[MultiHeadSelfAttention] = MultiHeadSelfAttention,
    ) -> None:
        super().__init__()
        if image_size % downsample:
            raise ValueError(f"image_size {image_size} is not divisible by downsample {downsample}")
        self.downsample = downsample
        self.grid = (image_size // downsample, image_size // downsample)
        self.embedding = nn.Linear(downsample * downsample * in_channels, hidden)
        self.layers = nn.ModuleList(
            TransformerLayer(enc, hidden, ffn, dropout, attention_dropout, layer_norm_eps, attention)
            for enc in encodings
        )
        self.classifier = nn.Linear(hidden, num_classes)

    @property
    def heads_per_layer(self) -> list[int]:
        return [layer.attention.num_heads for layer in self.layers]

    def forward(self, images: Tensor) -> Tensor:  # (B, C, H, W) -> (B, num_classes)
        x = self.embedding(space_to_depth(images, self.downsample))  # (B, N, hidden)
        for layer in self.layers:
            x = layer(x, self.grid)
        return self.classifier(x.mean(dim=1))  # average pooling over the tokens

    def attention_maps(self, query: tuple[int, int]) -> list[Tensor]:
        """Per layer, (H, rows, cols) attention probabilities of every head for one query token (Fig. 6)."""
        return [layer.attention.attention_map(query, self.grid) for layer in self.layers]

    def head_geometry(self) -> list[dict[str, Tensor]] | None:
        """Per layer, each head's centre and ``Sigma^-1`` (Figs. 2, 3, 7); None for the learned encoding."""
        per_layer = [layer.attention.head_geometry() for layer in self.layers]
        return None if any(g is None for g in per_layer) else per_layer

    def no_weight_decay(self) -> set[str]:
        """Names of parameters trained without weight decay: the encodings' centres and spreads (authors' code)."""
        return {
            name
            for name, _ in self.named_parameters()
            if ".encoding." in name and not any(part in name for part in ("embedding", "_heads"))
        }

    @torch.no_grad()
    def prune_heads(self, keep_per_layer: Sequence[Sequence[int]]) -> None:
        """Remove every head not listed for its layer (see ``MultiHeadSelfAttention.prune_heads``)."""
        if len(keep_per_layer) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} lists of heads to keep, got {len(keep_per_layer)}")
        for layer, keep in zip(self.layers, keep_per_layer, strict=True):
            layer.attention.prune_heads(list(keep))
