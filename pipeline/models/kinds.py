"""Builds the attention layer a registry entry (``pipeline.encodings``) names, with the config fields it declares.

The one place a model learns which class implements its ``model.encoding``: the paper's plain attention given the
encoding (``pipeline.models.positional``), the same with content scores added when ``model.content`` is true
(``pipeline.models.content``), or an attention kind that is a whole layer of its own (ConViT's gated heads).
"""

from __future__ import annotations

from pipeline.encodings import spec_for
from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.content import ContentPositionSelfAttention
from pipeline.models.positional import build_encoding


def build_attention(
    name: str,
    num_heads: int,
    *,
    in_dim: int,
    max_grid: int,
    attention_dropout: float = 0.0,
    content: bool = False,
    **fields: object,
) -> MultiHeadSelfAttention:
    """The attention layer of the encoding (or attention kind) called ``name`` in params.yaml, with ``num_heads``
    heads on ``in_dim`` features: its registry entry (``pipeline.encodings``) names the class and the config
    ``fields`` it takes. ``content`` adds content scores to a positional encoding's (``pipeline.models.content``)."""
    spec = spec_for(name)
    if not spec.attention:
        encoding = build_encoding(name, num_heads, max_grid=max_grid, **fields)
        layer = ContentPositionSelfAttention if content else MultiHeadSelfAttention
        return layer(encoding, in_dim, attention_dropout=attention_dropout)
    if content:
        raise ValueError(f"content: {name!r} computes content scores of its own")
    own = spec.own_fields(fields)
    return spec.load()(num_heads, in_dim=in_dim, max_grid=max_grid, attention_dropout=attention_dropout, **own)


__all__ = ["build_attention"]
