"""Training speed of every model of the sweep at the sizes of a params file: seconds per epoch and images/s.

Runs ``pipeline.train.run_trial`` as the sweep does (same data, model and schedule code; only ``train.epochs``
and ``train.device`` are overridden), on the CPU and, when present, on CUDA (bf16 autocast if ``train.amp`` is
``auto``). The first epoch pays one-off costs (allocator, kernel selection, caches), so the table gives the
median of the later epochs when there are any. Nothing is asserted: speed is measured here, not in tests.

    python benchmarks/train_speed.py                      # smoke sizes of params.yaml, 2 epochs
    python benchmarks/train_speed.py --epochs 3 --variants sa_quadratic_9 resnet18
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path

import torch

from pipeline.config import Params, load_params
from pipeline.counting import count_parameters
from pipeline.data import PreparedData
from pipeline.datasets import prepare_dataset
from pipeline.device import describe_device
from pipeline.models import build_model
from pipeline.train import run_trial

COLUMNS = ("model", "device", "precision", "params", "s/epoch", "images/s", "test_acc")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per model (default: %(default)s)")
    parser.add_argument("--variants", nargs="+", help="variants to time (default: the params' sweep.variants)")
    parser.add_argument(
        "--devices",
        nargs="+",
        choices=["cpu", "cuda"],
        help="devices to time (default: cpu, plus cuda when present)",
    )
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    parser.add_argument("--verbose", action="store_true", help="log every epoch")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    return args


def time_variant(params: Params, variant: str, device: str, epochs: int, data: PreparedData) -> dict[str, str]:
    """One trial of ``variant`` on ``device``; returns the table row."""
    model_cfg = params.model_for(variant)
    train_cfg = params.train.model_copy(update={"epochs": epochs, "device": device})
    history: list[dict[str, float]] = []
    final = run_trial(model_cfg, train_cfg, data, lambda metrics, _: history.append(metrics))
    steady = history[1:] or history  # the first epoch pays one-off costs
    seconds = statistics.median(m["epoch_time_s"] for m in steady)
    channels, size, _ = data.image_shape
    model = build_model(model_cfg, image_size=size, in_channels=channels, num_classes=data.num_classes)
    return {
        "model": variant,
        "device": describe_device(train_cfg)["device_name"] if device == "cuda" else "cpu",
        "precision": describe_device(train_cfg)["precision"],
        "params": f"{count_parameters(model):,}",
        "s/epoch": f"{seconds:.2f}",
        "images/s": f"{len(data.train_labels) / seconds:,.0f}",
        "test_acc": f"{final['test_acc']:.3f}",
    }


def format_table(rows: list[dict[str, str]]) -> str:
    """Aligned plain-text table: text columns left-aligned, numbers right-aligned."""
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in COLUMNS}
    numeric = {"params", "s/epoch", "images/s", "test_acc"}

    def line(cells: dict[str, str]) -> str:
        return "  ".join(cells[c].rjust(widths[c]) if c in numeric else cells[c].ljust(widths[c]) for c in COLUMNS)

    rule = "  ".join("-" * widths[c] for c in COLUMNS)
    return "\n".join([line({c: c for c in COLUMNS}), rule, *(line(r) for r in rows)])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    params = load_params(args.params)
    variants = args.variants or params.sweep.variants
    for name in variants:
        params.model_for(name)  # fail on an unknown name before any training
    devices = args.devices or ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    data = prepare_dataset(params.data, args.params.resolve().parent)
    rows = [time_variant(params, name, device, args.epochs, data) for device in devices for name in variants]
    epochs_note = "median of epochs 2.." if args.epochs > 1 else "single epoch, includes warm-up"
    print(
        f"{params.data.dataset} {data.image_shape}, {len(data.train_labels)} train images, "
        f"batch {params.train.batch_size}, {args.epochs} epochs ({epochs_note}), torch threads "
        f"{torch.get_num_threads()}"
    )
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
