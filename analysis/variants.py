"""What the analysis shows for each variant a study ran: its display name, colour, place in the tables and the paper's
figures when the paper has them.

The study decides which variants exist (the manifests' runs); the paper is a lookup beside them
(``pipeline.measure.reference.PAPER_FIGURES``), never the list that decides. Display names come from the variant's
model config as its runs logged it (``model.*`` params), not from a hand-written dict: ``SA learned, 4 heads`` or
``SA quadratic, 9 heads, hidden 64``, naming the fields where the variant differs from most variants of its
architecture; the paper's models keep the paper's own labels.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from analysis.palette import Style, variant_style
from pipeline.encodings import ENCODINGS
from pipeline.measure.reference import PAPER_FIGURES, PaperFigure

PRUNED_SUFFIX = "_pruned"  # the prune stage's models: <source variant>_pruned
NAMED_FIELDS = ("arch", "encoding", "heads")  # always part of a derived name, so never listed as a difference


@dataclass(frozen=True)
class Variant:
    """A variant of the study as the analysis presents it."""

    name: str
    label: str
    style: Style
    config: Mapping[str, Any] = field(default_factory=dict)  # model fields, as the runs logged them
    pruned_from: str | None = None

    @property
    def paper(self) -> PaperFigure | None:
        return PAPER_FIGURES.get(self.name)

    @property
    def is_attention(self) -> bool:
        return self.config.get("arch") == "sa"

    @property
    def has_centres(self) -> bool:
        """Its heads have a centre and ``Sigma^-1`` (its encoding's registry entry says ``gaussian``)."""
        encoding = self.config.get("encoding")
        return self.is_attention and encoding in ENCODINGS and ENCODINGS[encoding].gaussian

    @property
    def is_its_gaussian(self) -> bool:
        """Each head's attention *is* its Gaussian: centres, and no content scores beside them (the paper's
        position-only heads), so the Gaussian's own numbers describe what the head attends to."""
        encoding = self.config.get("encoding")
        content = self.config.get("content") in (True, "True", "true") or ENCODINGS[encoding].reads_content
        return self.has_centres and not content


def _label(name: str, config: Mapping[str, Any], usual: Mapping[str, Any]) -> str:
    if name in PAPER_FIGURES:
        return PAPER_FIGURES[name].label
    if not config:
        return name  # no run logged its config (all missing): the name is all there is
    if config.get("arch") == "resnet18":
        parts = ["ResNet18"]
        fields = ["resnet_width"]
    else:
        encoding = config.get("encoding", "?")
        heads = config.get("heads", "?")
        label = ENCODINGS[encoding].label if encoding in ENCODINGS else encoding  # its registry entry's label
        parts = [f"SA {label}", f"{heads} head{'' if heads == 1 else 's'}"]
        fields = [f for f in config if f not in NAMED_FIELDS and f != "resnet_width"]
    parts += [f"{f.replace('_', ' ')} {config[f]}" for f in fields if f in usual and config[f] != usual[f]]
    return ", ".join(parts)


def _usual(configs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per model field, the value most of ``configs`` have (the first met on a tie)."""
    usual = {}
    for key in dict.fromkeys(k for config in configs for k in config):
        values = [config[key] for config in configs if key in config]
        usual[key] = max(values, key=lambda v: sum(w == v for w in values))
    return usual


def _natural(name: str) -> list[Any]:
    """Sort key reading the digits of a name as numbers: ``sa_heads2`` < ``sa_heads16``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def describe_variants(configs: Mapping[str, Mapping[str, Any]]) -> list[Variant]:
    """The study's variants, ordered as the paper's table for the paper's models, then the others in the natural order
    of their names (``heads2`` before ``heads16``: the same order whatever order the manifests list them in), a pruned
    model right after its source. ``configs``: variant name -> model fields (``{}`` when unknown). Display names are
    unique: a derived name two variants share gets the variant's name added."""
    sources = {n: n.removesuffix(PRUNED_SUFFIX) for n in configs if n.endswith(PRUNED_SUFFIX)}
    by_arch: dict[str, list[Mapping[str, Any]]] = {}
    for name, config in configs.items():
        if name not in sources and config:
            by_arch.setdefault(str(config.get("arch")), []).append(config)
    usual = {arch: _usual(group) for arch, group in by_arch.items()}

    def label(name: str) -> str:
        if name in sources and name not in PAPER_FIGURES:
            source = sources[name]
            return f"{label(source) if source in configs else source}, pruned"
        config = configs.get(name, {})
        return _label(name, config, usual.get(str(config.get("arch")), {}))

    paper = [n for n in PAPER_FIGURES if n in configs]
    others = sorted((n for n in configs if n not in PAPER_FIGURES and n not in sources), key=_natural)
    order = paper + [n for source in others for n in (source, f"{source}{PRUNED_SUFFIX}") if n in configs]
    order += sorted((n for n in configs if n not in order), key=_natural)  # pruned, without its source
    labels = {name: label(name) for name in order}
    shared = {text for text, count in Counter(labels.values()).items() if count > 1}
    return [
        Variant(
            name,
            f"{labels[name]} ({name})" if labels[name] in shared else labels[name],
            variant_style(name),
            dict(configs.get(name, {})),
            sources.get(name),
        )
        for name in order
    ]
