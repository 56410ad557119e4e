"""The paper's published figures (Figure 5 / Figure 9, CIFAR-10 test set) and the exact parameter counts of the
authors' architecture (their public code, epfml/attention-cnn), so tables show ours next to theirs and tests pin them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperFigure:
    label: str
    accuracy: float | None
    params: int  # exact count of the authors' architecture (the paper prints 12.1M etc.)
    flops: int | None  # paper convention: 2 x MACs of Linear/Conv layers, per 32x32 image


# Heads pruned per layer (layers 1..6) in the paper's generalized-quadratic 9-head model (App. A.1).
PAPER_PRUNED_HEADS = (2, 4, 1, 2, 6, 0)

PAPER_FIGURES: dict[str, PaperFigure] = {
    "resnet18": PaperFigure("ResNet18", 0.938, 11_173_962, 1_110_845_440),
    "sa_quadratic_9": PaperFigure("SA quadratic", 0.938, 12_086_844, 6_175_956_800),
    "sa_generalized_9": PaperFigure("SA quadratic generalized", 0.934, 12_087_006, 6_175_956_800),
    "sa_generalized_9_pruned": PaperFigure("SA quadratic generalized, pruned", 0.934, 9_686_916, 4_947_156_800),
    "sa_learned_9": PaperFigure("SA learned", 0.918, 12_278_682, 6_175_956_800),
    "sa_quadratic_16": PaperFigure("SA quadratic, 16 heads", None, 18_806_970, 9_616_596_800),
}


@dataclass(frozen=True)
class QuotedBaseline:
    """A public CIFAR-10 result quoted for context beside the study (never run by this project), with its source."""

    label: str
    accuracy: float
    epochs: int
    setting: str
    source: str


# Each number checked against its primary source (the authors' own publication of it), quoted as published.
QUOTED_BASELINES = (
    QuotedBaseline(
        "ConvMixer-256/8, kernel 5, patch 2",
        0.9260,
        25,
        "CIFAR-10 test set; one run of the authors' training script (AdamW, linear warm-up and decay, RandAugment), "
        "the final epoch of the log they publish (they state 'around 92.5%')",
        "Trockman & Kolter, 'Patches Are All You Need?': README of github.com/locuslab/convmixer-cifar10 "
        "(commit 2d3d9b7)",
    ),
)
