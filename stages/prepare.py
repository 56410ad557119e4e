"""Prepare the dataset as tensors for every later stage.

Reads:  params.yaml, section `data` (dataset, cifar10_path, verify_checksum, image_size, test_fraction,
        validation_fraction, prepared_dir); for cifar10 the archive cifar-10-python.tar.gz or its extracted
        cifar-10-batches-py/ folder at data.cifar10_path (never downloaded).
Writes: data.prepared_dir (default data/prepared/): train.pt and test.pt (uint8 images (N, C, H, W), int64 labels),
        val.pt when data.validation_fraction > 0 (a class-stratified share of the training images, seed 0), and
        manifest.json (dataset, counts, image shape, classes, mean/std, split seeds, sha256 of the tensors).

Relative paths resolve against the current directory (dvc runs stages from the repository root). The output is
replaced atomically and only once complete; re-running with the same params leaves it untouched.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pipeline.config import Params
from pipeline.data.prepared import check_output_dir, save_prepared
from pipeline.data.sources import prepare_dataset, provenance
from stages._cli import main_for, make_parser

log = logging.getLogger("stages.prepare")


def stage(args: argparse.Namespace, params: Params) -> int:
    """Build the configured dataset and write it to data.prepared_dir."""
    cfg = params.data
    root = Path.cwd()
    out_dir = root / cfg.prepared_dir
    try:
        check_output_dir(out_dir)  # before the dataset is built: replacing the wrong folder would delete it
    except ValueError as err:
        raise ValueError(f"data.prepared_dir: {err}") from None
    log.info("preparing %s (params: %s)", cfg.dataset, args.params)
    data = prepare_dataset(cfg, root)
    log.info(
        "%d train / %d validation / %d test examples, images %s, %d classes, mean %s, std %s",
        len(data.train_labels),
        0 if data.val_labels is None else len(data.val_labels),
        len(data.test_labels),
        data.image_shape,
        data.num_classes,
        data.mean,
        data.std,
    )
    manifest = save_prepared(data, out_dir, provenance(cfg))
    log.info("manifest %s (content sha256 %s)", out_dir / "manifest.json", manifest["content_sha256"][:12])
    return 0


main = main_for(stage, make_parser(__doc__))

if __name__ == "__main__":
    sys.exit(main())
