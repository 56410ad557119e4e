"""Builds the attention layer a registry entry (``pipeline.encodings``) names, with the config fields it declares.

The one place a model learns which classes implement its ``model.encoding``. Every layer is built the same way, as
``attention_class(name, content)(layer_encoding(name, ...), in_dim, attention_dropout=...)``:

- a positional encoding (``pipeline.models.positional``) is given to the paper's attention layer, or to the same
  with content scores added when ``model.content`` is true (``pipeline.models.content``);
- an attention kind (``attention=True`` in its entry, e.g. ConViT's gated heads) is its own layer class, and builds
  the positional encoding it starts from with its classmethod ``build_encoding(num_heads, max_grid=..., **fields)``.

Building all encodings first and the layers after (``pipeline.models.build_model``) keeps the paper's order of
random draws, so a paper variant initialises exactly as before attention kinds existed.
"""

from __future__ import annotations

from pipeline.encodings import spec_for
from pipeline.models.attention import MultiHeadSelfAttention
from pipeline.models.content import ContentPositionSelfAttention
from pipeline.models.positional import PositionalEncoding, build_encoding


def layer_encoding(name: str, num_heads: int, *, max_grid: int, **fields: object) -> PositionalEncoding:
    """The positional encoding one layer of kind ``name`` starts from. ``fields``: any encodings' config fields;
    those the entry declares are used (its defaults for the others)."""
    spec = spec_for(name)
    if not spec.attention:
        return build_encoding(name, num_heads, max_grid=max_grid, **fields)
    return spec.load().build_encoding(num_heads, max_grid=max_grid, **spec.own_fields(fields))


def attention_class(name: str, *, content: bool = False) -> type[MultiHeadSelfAttention]:
    """The attention layer class of kind ``name``; ``content`` adds content scores to a positional encoding's."""
    spec = spec_for(name)
    if spec.attention:
        if content:
            raise ValueError(f"content: {name!r} computes content scores of its own")
        return spec.load()
    return ContentPositionSelfAttention if content else MultiHeadSelfAttention


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
    """One attention layer of kind ``name`` (as written in params.yaml) with ``num_heads`` heads on ``in_dim``
    features."""
    encoding = layer_encoding(name, num_heads, max_grid=max_grid, **fields)
    return attention_class(name, content=content)(encoding, in_dim, attention_dropout=attention_dropout)


__all__ = ["attention_class", "build_attention", "layer_encoding"]
