"""What ConViT's gated heads cost to train: CPU seconds per epoch of SA GPSA against SA quadratic, one thread, paired.

Each variant of the params file (default: ``sa_quadratic_9`` and ``sa_gpsa_9`` of ``params.yaml``) is built as the
sweep builds it and trained through the trial's own ``train_one_epoch`` on synthetic images of the params' image
size (``--images`` per epoch; the default is the embedded digits' training set, 1437 images), on the CPU with one
thread (``torch.set_num_threads(1)``, as a Ray trial with one CPU runs). The variants alternate epoch by epoch
(quadratic, GPSA, quadratic, GPSA, ...), so that a change of machine load hits both; after one warm-up epoch each,
``--pairs`` epochs each are timed by the process's CPU time (``time.process_time``). Prints, per variant, the median
and the range of CPU seconds per epoch and its ratio to the first variant's median. Nothing is asserted.

    python -m benchmarks.gpsa_cost                       # params.yaml, sa_quadratic_9 vs sa_gpsa_9, 5 pairs
    python -m benchmarks.gpsa_cost --pairs 3 --images 500
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import (
    bad_input_is_a_usage_error,
    make_parser,
    positive_int,
    progress,
    synthetic_device_data,
    text_table,
)
from pipeline.config import Params, load_params
from pipeline.models import build_model
from pipeline.trial.checkpoint import Trial
from pipeline.trial.device import flush_subnormals
from pipeline.trial.loop import build_optimizer, build_scheduler, train_one_epoch

DEFAULT_VARIANTS = ["sa_quadratic_9", "sa_gpsa_9"]
DIGITS_TRAIN_IMAGES = 1437  # the embedded digits (1797 images) less data.test_fraction 0.2
NUMERIC = {"median CPU s/epoch", "min", "max", "x first"}


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("gpsa_cost", __doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: %(default)s)")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help="variants (default: %(default)s)")
    parser.add_argument("--pairs", type=positive_int, default=5, help="timed epochs per variant (default: 5)")
    parser.add_argument("--images", type=positive_int, default=DIGITS_TRAIN_IMAGES, help="training images per epoch")
    return parser


def check_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Params:
    with bad_input_is_a_usage_error(parser):
        params = load_params(args.params)
    unknown = [v for v in args.variants if v not in params.variants]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; defined: {sorted(params.variants)}")
    if len(set(args.variants)) != len(args.variants) or len(args.variants) < 2:
        parser.error("--variants: name at least two distinct variants to pair")
    return params


def timed_epochs(params: Params, variants: list[str], pairs: int, images: int) -> dict[str, list[float]]:
    """CPU seconds of each timed epoch per variant, the variants alternating epoch by epoch."""
    torch.set_num_threads(1)
    device = torch.device("cpu")
    flush_subnormals(device)  # as a trial on the CPU does
    cfg = params.train.model_copy(update={"device": "cpu", "epochs": pairs + 1, "compile": False})
    generator = torch.Generator().manual_seed(0)
    size = params.data.image_size
    data = synthetic_device_data(device, images, cfg.eval_batch_size, generator, image_size=size)
    trials = {}
    for variant in variants:
        torch.manual_seed(cfg.seed)
        model = build_model(params.model_for(variant), image_size=size)
        optimizer = build_optimizer(model, cfg)
        steps = -(-images // cfg.batch_size) * cfg.epochs
        trials[variant] = Trial(model, optimizer, build_scheduler(optimizer, cfg, steps), generator)
    seconds: dict[str, list[float]] = {variant: [] for variant in variants}
    for epoch in range(pairs + 1):  # epoch 0 warms up each model (allocator, first calls), untimed
        for variant in variants:
            started = time.process_time()
            train_one_epoch(trials[variant], data, cfg, None)
            spent = time.process_time() - started
            if epoch:
                seconds[variant].append(spent)
                progress(f"{variant} epoch {epoch}/{pairs}: {spent:.2f} CPU s")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    params = check_inputs(parser, args)
    seconds = timed_epochs(params, args.variants, args.pairs, args.images)
    first = statistics.median(seconds[args.variants[0]])
    rows = [
        {
            "variant": variant,
            "median CPU s/epoch": f"{statistics.median(values):.2f}",
            "min": f"{min(values):.2f}",
            "max": f"{max(values):.2f}",
            "x first": f"{statistics.median(values) / first:.2f}",
        }
        for variant, values in seconds.items()
    ]
    print(f"{args.images} training images per epoch, one thread, {args.pairs} paired epochs per variant")
    print(text_table(rows, NUMERIC))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
