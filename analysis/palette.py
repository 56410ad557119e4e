"""Colours that belong to a variant's name: the same in every figure, every run of the analysis and ``dvc plots``,
whatever else the study holds, so adding a variant recolours none of the others.

The paper's models have Okabe-Ito colours (colour-blind-safe) and solid lines, fixed here once: the two quadratic
models in blues, the generalized one and its pruned copy in vermillion and orange, the learned one in green, ResNet18
in black; ConViT's GPSA (``sa_gpsa_9``, in the default study) in purple. Any other name gets one of
``OTHER_COLOURS`` (24: twelve evenly spaced hues, dark and light) and one of ``OTHER_DASHES`` from a stable hash of
the name (sha256; Python's ``hash`` is salted per process), so it is never drawn as one of those models and two
names rarely share both (1 in 72 per pair). An order-based palette would
be collision-free within a study but recolour every variant after the one added; a stable name-based choice cannot be
both, so a legend always names each line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import matplotlib.colors
import seaborn as sns

# Okabe & Ito (2008), "Color Universal Design": orange, sky blue, bluish green, yellow, blue, vermillion, purple, black.
OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000"]
PAPER_COLOURS = {
    "resnet18": "#000000",
    "sa_quadratic_9": "#0072B2",
    "sa_quadratic_16": "#56B4E9",
    "sa_generalized_9": "#D55E00",
    "sa_generalized_9_pruned": "#E69F00",
    "sa_learned_9": "#009E73",
}
# The default study's model beyond the paper (ConViT's GPSA), in the one Okabe-Ito colour left that reads on white:
# a hashed colour put it in a light blue beside the quadratic models' blues.
FIXED_COLOURS = {**PAPER_COLOURS, "sa_gpsa_9": "#CC79A7"}
_DARK = sns.husl_palette(12, s=0.9, l=0.42).as_hex()
_LIGHT = sns.husl_palette(12, s=0.9, l=0.62, h=0.01 + 1 / 24).as_hex()  # half a hue step on: between the dark ones
OTHER_COLOURS = [colour for dark, light in zip(_DARK, _LIGHT, strict=True) for colour in (dark, light)]
OTHER_DASHES = ["--", "-.", ":"]
DASHES = ["-", *OTHER_DASHES]
# Paul Tol's "muted" scheme for heads (9 per layer in the paper; beyond 9 the colours repeat with another dash).
TOL_MUTED = ["#CC6677", "#332288", "#DDCC77", "#117733", "#88CCEE", "#882255", "#44AA99", "#999933", "#AA4499"]


@dataclass(frozen=True)
class Style:
    """How a variant is drawn: a colour (hex) and a matplotlib line style."""

    colour: str
    dash: str = "-"


def variant_style(name: str) -> Style:
    """The variant's colour and line style: fixed for the default study's names, a stable hash of the name otherwise."""
    if name in FIXED_COLOURS:
        return Style(FIXED_COLOURS[name])
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    colour, dash = divmod(digest, len(OTHER_DASHES))
    return Style(OTHER_COLOURS[colour % len(OTHER_COLOURS)], OTHER_DASHES[dash])


def head_style(head: int) -> tuple[str, str]:
    """Colour and line style of head ``head`` (numbered from 1, as in every figure and CSV)."""
    index = head - 1
    return TOL_MUTED[index % len(TOL_MUTED)], DASHES[(index // len(TOL_MUTED)) % len(DASHES)]


HEAD_MARKERS = ("o", "^", "s")  # a head's centre in the contour figures: one shape per pass through the colours


def head_marker(head: int) -> str:
    """The centre marker of head ``head`` (from 1): heads 1-9 circles, 10-18 triangles, ..., so that two heads that
    share a colour (16 heads, 9 colours) never share a marker too."""
    return HEAD_MARKERS[((head - 1) // len(TOL_MUTED)) % len(HEAD_MARKERS)]


def layer_colours(layers: int) -> list[str]:
    """One colour per layer along viridis, from its dark end (layer 1) to green (the last; its yellow end is left out,
    it fades on white): depth reads as a sequence, and two layers are far apart."""
    cmap = sns.color_palette("viridis", as_cmap=True)
    steps = max(layers, 1)
    return [matplotlib.colors.to_hex(cmap(0.05 + 0.7 * i / max(steps - 1, 1))) for i in range(steps)]
