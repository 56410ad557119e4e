"""Training speed of every model of the sweep at the sizes of a params file: seconds per epoch and images/s.

Runs ``pipeline.trial.loop.run_trial`` as the sweep does (same data, model and schedule code; only ``train.epochs``
and ``train.device`` are overridden), on the CPU and, when present, on CUDA (bf16 autocast if ``train.amp`` is
``auto``). The first epoch pays one-off costs (allocator, kernel selection, caches), so the table gives the
median of the later epochs when there are any. Nothing is asserted: speed is measured here, not in tests.

``--history DIR`` also keeps every epoch's metrics (``history.csv``) and draws the loss and accuracy curves
(``curves.png``): a short real run, e.g. 15 epochs of the paper's cosine schedule on CIFAR-10 on a GPU.

    python -m benchmarks.train_speed                      # smoke sizes of params.yaml, 2 epochs
    python -m benchmarks.train_speed --epochs 3 --variants sa_quadratic_9 resnet18
    python -m benchmarks.train_speed --params params/paper.yaml --epochs 15 --devices cuda \
        --variants sa_quadratic_9 resnet18 --history results/short_run
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.common import (
    bad_input_is_a_usage_error,
    epoch_reporter,
    make_parser,
    positive_int,
    progress,
    text_table,
)
from pipeline.config import Params, load_params
from pipeline.data.prepared import PreparedData
from pipeline.data.sources import prepare_dataset
from pipeline.measure.counting import count_parameters
from pipeline.models import build_model
from pipeline.trial.device import device_tags
from pipeline.trial.loop import run_trial

NUMERIC = {"params", "s/epoch", "images/s", "test_acc"}


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("train_speed", __doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: %(default)s)")
    parser.add_argument("--epochs", type=positive_int, default=2, help="epochs per model (default: %(default)s)")
    parser.add_argument("--variants", nargs="+", help="variants to time (default: the params' sweep.variants)")
    parser.add_argument(
        "--devices",
        nargs="+",
        choices=["cpu", "cuda"],
        help="devices to time (default: cpu, plus cuda when present)",
    )
    parser.add_argument("--threads", type=positive_int, help="torch intra-op threads (default: torch's own choice)")
    parser.add_argument("--verbose", action="store_true", help="also the trainer's own log (device, compile time)")
    parser.add_argument("--history", type=Path, metavar="DIR", help="write history.csv and curves.png there")
    return parser


def check_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Params:
    """Everything the command line and the params file can get wrong, before any data is prepared or model trained;
    a problem ends in ``parser.error`` (exit code 2). Creates the ``--history`` directory."""
    with bad_input_is_a_usage_error(parser):
        params = load_params(args.params)
    unknown = [name for name in args.variants or [] if name not in params.variants]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; defined in {args.params}: {sorted(params.variants)}")
    if args.devices and "cuda" in args.devices and not torch.cuda.is_available():
        parser.error("--devices cuda, but no CUDA device is available")
    if args.history is not None:
        if args.history.exists() and not args.history.is_dir():  # up front, not after the whole run
            parser.error(f"--history {args.history}: exists and is not a directory")
        try:
            args.history.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--history {args.history}: cannot create the directory ({err.strerror})")
        if not os.access(args.history, os.W_OK):
            parser.error(f"--history {args.history}: directory is not writable")
    return params


def time_variant(
    params: Params, variant: str, device: str, epochs: int, data: PreparedData
) -> tuple[dict[str, str], list[dict[str, float]]]:
    """One trial of ``variant`` on ``device``; returns the table row and every epoch's metrics."""
    model_cfg = params.model_for(variant)
    train_cfg = params.train_for(variant).model_copy(update={"epochs": epochs, "device": device})  # as its trial
    history: list[dict[str, float]] = []
    progress(f"training {variant} on {device}, {epochs} epochs")
    final = run_trial(model_cfg, train_cfg, data, epoch_reporter(variant, epochs, history))
    steady = history[1:] or history  # the first epoch pays one-off costs
    seconds = statistics.median(m["epoch_time_s"] for m in steady)
    channels, size, _ = data.image_shape
    model = build_model(model_cfg, image_size=size, in_channels=channels, num_classes=data.num_classes)
    row = {
        "model": variant,
        "device": device_tags(train_cfg)["device_name"] if device == "cuda" else "cpu",
        "precision": device_tags(train_cfg)["precision"],
        "params": f"{count_parameters(model):,}",
        "s/epoch": f"{seconds:.2f}",
        "images/s": f"{len(data.train_labels) / seconds:,.0f}",
        "test_acc": f"{final['test_acc']:.3f}",
    }
    return row, history


def write_history(runs: list[tuple[dict[str, str], list[dict[str, float]]]], out_dir: Path, title: str) -> None:
    """Every epoch of every run as ``history.csv``, and ``curves.png``: losses (train solid, test dashed) and test
    accuracy against the epoch, one colour per model and device."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    import pandas as pd
    from matplotlib.ticker import MaxNLocator

    out_dir.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(
        [{"model": row["model"], "device": row["device"], **metrics} for row, history in runs for metrics in history]
    )
    frame.to_csv(out_dir / "history.csv", index=False)
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for (model, device), run in frame.groupby(["model", "device"], sort=False):
        label = f"{model} ({device})"
        line = loss_ax.plot(run["epoch"], run["train_loss"], label=f"{label} train")[0]
        loss_ax.plot(run["epoch"], run["test_loss"], linestyle="--", color=line.get_color(), label=f"{label} test")
        acc_ax.plot(run["epoch"], run["test_acc"], color=line.get_color(), marker="o", markersize=3, label=label)
    loss_ax.set(xlabel="epoch", ylabel="cross-entropy", title="loss (train solid, test dashed)")
    acc_ax.set(xlabel="epoch", ylabel="test accuracy", title="test accuracy", ylim=(0, 1))
    for ax in (loss_ax, acc_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.savefig(out_dir / "curves.png", dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    params = check_inputs(parser, args)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    variants = args.variants or params.sweep.variants
    devices = args.devices or ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    with bad_input_is_a_usage_error(parser):  # a missing or unreadable dataset (data.cifar10_path)
        data = prepare_dataset(params.data, args.params.resolve().parent)
    runs = [time_variant(params, name, device, args.epochs, data) for device in devices for name in variants]
    epochs_note = "median of epochs 2.." if args.epochs > 1 else "single epoch, includes warm-up"
    summary = (
        f"{params.data.dataset} {data.image_shape}, {len(data.train_labels)} train images, "
        f"batch {params.train.batch_size}, {args.epochs} epochs ({epochs_note}), torch threads "
        f"{torch.get_num_threads()}"
    )
    print(summary)
    print(text_table([row for row, _ in runs], numeric=NUMERIC))
    if args.history is not None:
        write_history(runs, args.history, summary)
        print(f"per-epoch metrics: {args.history / 'history.csv'}; curves: {args.history / 'curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
