"""Print every model of the paper (and of the current params) with exact parameter counts and FLOPs per image.

Two FLOP conventions, both with 1 multiply-add = 2 FLOPs:
  paper  2 x MACs of the Linear / Conv layers only (the paper's 6.2B / 1.1B; attention sums not counted)
  full   every matmul / convolution in one forward pass, attention-weighted sums included
The paper's figures (Figure 5 / 9, and the exact counts of the authors' architecture) are shown alongside.
Reads params.yaml for the current (smoke) sizes; writes nothing.
"""

from __future__ import annotations

import argparse
import logging

from pipeline.config import ModelConfig, Params
from pipeline.measure.tables import format_table, model_size_rows
from stages._cli import main_for, make_parser

log = logging.getLogger("stages.describe")


def describe(args: argparse.Namespace, params: Params) -> int:
    paper_rows = model_size_rows(ModelConfig(), image_size=32, include_pruned=True)
    image_size = params.data.image_size
    current_rows = model_size_rows(params.model, image_size=image_size, variants=params.variants)
    print("The paper's models at the paper's size (CIFAR-10, 32x32x3):")
    print(format_table(paper_rows, with_paper=True))
    print(f"\nThe variants of {args.params} at its sizes ({image_size}x{image_size}x3, as prepared):")
    print(format_table(current_rows, with_paper=False))
    return 0


parser = make_parser(__doc__)
main = main_for(describe, parser)

if __name__ == "__main__":
    raise SystemExit(main())
