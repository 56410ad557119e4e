"""The registry of encodings and attention kinds: one entry per kind, the only place the rest of the code learns of it.

An entry declares what every other part reads instead of naming the kind:

- ``target``: the one class that implements it, as ``module:Class``. A ``PositionalEncoding`` (scores from positions,
  given to the plain attention layer) or, with ``attention=True``, a whole attention layer (a
  ``MultiHeadSelfAttention`` subclass whose classmethod ``build_encoding`` makes the encoding it starts from: ConViT's
  gated heads, which mix content and position their own way). ``pipeline.models.kinds`` builds either.
- ``fields``: its ``model.<field>`` config fields, with type, bounds and default. ``pipeline.config.ModelConfig``
  gains exactly these (two kinds may share a field if they declare it identically), a run logs only the fields of
  its own kind, and the model is built with them as keyword arguments.
- ``gaussian``: its heads have a centre ``Delta`` and a precision ``Sigma^-1`` (``head_geometry``). Pruning, the
  centre figures and the finding's numbers read them.
- ``head_reports``: per-head quantities, beyond the locality every attention layer is measured by, that the layer
  reports each epoch (``head_report()``), e.g. ConViT's gate.
- ``reads_content``: its scores already depend on the pixels, so ``model.content`` cannot add content a second time.

This module imports neither torch nor the models, so the config can read it without a cycle.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field


@dataclass(frozen=True)
class EncodingSpec:
    """The declaration of one encoding (or attention kind); see the module docstring for each field."""

    target: str
    label: str  # how tables, figures and the report name it: "quadratic", "GPSA"
    summary: str  # one line for the report: what its heads compute
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # name -> (annotation, default)
    gaussian: bool = False
    head_reports: tuple[str, ...] = ()
    reads_content: bool = False
    attention: bool = False
    # The prune stage's default (``prune.variants: null``): the model the paper pruned (App. A.1).
    pruned_by_default: bool = False

    def own_fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Of ``fields`` (any encodings' config fields, e.g. a whole model config's), the ones this entry declares,
        with its declared defaults for those not given."""
        if unknown := sorted(set(fields) - set(encoding_fields())):
            raise ValueError(f"{unknown[0]!r} is no encoding's field; fields: {sorted(encoding_fields())}")
        return {key: fields.get(key, default) for key, (_, default) in self.fields.items()}

    def load(self) -> type:
        """The implementing class (imported only when a model is built)."""
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)


NonNegative = Annotated[float, Field(ge=0.0)]
_GAUSSIAN_INIT = {
    # centres ~ N(0, centre_init_std^2); spreads ~ 1 + N(0, spread_init_std^2) (authors' code)
    "centre_init_std": (NonNegative, 2.0),
    "spread_init_std": (NonNegative, 0.01),
}

ENCODINGS: dict[str, EncodingSpec] = {
    "quadratic": EncodingSpec(
        target="pipeline.models.quadratic:QuadraticEncoding",
        label="quadratic",
        summary="isotropic Gaussian scores around a learned centre per head (Eq. 9)",
        fields=_GAUSSIAN_INIT,
        gaussian=True,
    ),
    "generalized_quadratic": EncodingSpec(
        target="pipeline.models.generalized_quadratic:GeneralizedQuadraticEncoding",
        label="quadratic generalized",
        summary="Gaussian scores with a full learned Sigma^-1 per head (App. A.1)",
        fields=_GAUSSIAN_INIT,
        gaussian=True,
        pruned_by_default=True,
    ),
    "learned": EncodingSpec(
        target="pipeline.models.learned:LearnedRelativeEncoding",
        label="learned",
        summary="learned row and column shift embeddings dotted with a vector per head (Sec. 4.3)",
        # width of each of the row and column shift embeddings (authors' code: 400 each)
        fields={"learned_dim": (Annotated[int, Field(gt=0, le=65536)], 400)},
    ),
    "gpsa": EncodingSpec(
        target="pipeline.models.gpsa:GatedPositionalSelfAttention",
        label="GPSA",
        summary=(
            "ConViT's gated positional self-attention: a quadratic head started on a grid of shifts, mixed per head "
            "with content attention by a learned gate sigma(lambda)"
        ),
        # locality strength alpha of ConViT's local init (its default 1.0): positional scores -alpha ||delta - Delta||^2
        # (heads beyond the sqrt(H) x sqrt(H) grid keep random centres, drawn with centre_init_std)
        fields={
            "centre_init_std": _GAUSSIAN_INIT["centre_init_std"],
            "locality_strength": (Annotated[float, Field(gt=0.0, le=1000.0)], 1.0),
        },
        gaussian=True,
        head_reports=("gate", "centre_distance"),
        reads_content=True,
        attention=True,
    ),
}

DEFAULT_ENCODING = "quadratic"  # model.encoding when params.yaml sets none: the paper's Eq. 9

# The paper's five models (Figure 5 / Figure 9) as variant fields: ``pipeline.config.PAPER_VARIANTS``, the variants of
# a params file that defines none.
PAPER_VARIANT_FIELDS: dict[str, dict[str, Any]] = {
    "sa_quadratic_9": {"arch": "sa", "encoding": "quadratic", "heads": 9},
    "sa_quadratic_16": {"arch": "sa", "encoding": "quadratic", "heads": 16},
    "sa_generalized_9": {"arch": "sa", "encoding": "generalized_quadratic", "heads": 9},
    "sa_learned_9": {"arch": "sa", "encoding": "learned", "heads": 9},
    "resnet18": {"arch": "resnet18"},
}


def encoding_fields() -> dict[str, tuple[Any, Any]]:
    """Every encoding's config fields, once each; a field two kinds declare must be declared the same."""
    merged: dict[str, tuple[Any, Any]] = {}
    for name, spec in ENCODINGS.items():
        for key, declared in spec.fields.items():
            assert merged.setdefault(key, declared) == declared, f"{name} declares model.{key} differently"
    return merged


def gaussian_encodings() -> list[str]:
    """The encodings whose heads have a centre and a ``Sigma^-1``."""
    return [name for name, spec in ENCODINGS.items() if spec.gaussian]


def positional_encodings() -> list[str]:
    """The entries that are positional encodings (scores for the plain attention layer), not whole attention kinds."""
    return [name for name, spec in ENCODINGS.items() if not spec.attention]


def spec_for(name: str) -> EncodingSpec:
    """The declaration of ``name``, or a ``ValueError`` listing the valid names."""
    if name not in ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}; valid: {sorted(ENCODINGS)}")
    return ENCODINGS[name]


__all__ = [
    "DEFAULT_ENCODING",
    "ENCODINGS",
    "PAPER_VARIANT_FIELDS",
    "EncodingSpec",
    "encoding_fields",
    "gaussian_encodings",
    "positional_encodings",
    "spec_for",
]
