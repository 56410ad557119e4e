"""What the benchmarks share: CIFAR-10-shaped synthetic data on the device, the reduced CPU model size, and the
command-line conventions (``python -m benchmarks.<name>`` usage lines, bad input as one clear error, exit code 2).

Throughput does not depend on what the pixels show, so the speed benchmarks train on uniformly random uint8 images
with random labels, held on the device exactly as the trainer holds a prepared dataset (``DeviceData``). Figures of
accuracy or loss never come from this data.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pipeline.io import EXPECTED_FAILURES

if TYPE_CHECKING:
    from pipeline.trial.device_data import DeviceData

# Paper-size models take ~1 s per step on a 2-core CPU; on the CPU the benchmarks shrink widths and depth (16x16
# tokens stay, as in the paper) so that they finish in minutes and show only that they run.
REDUCED_MODEL = {"hidden": 64, "layers": 2, "ffn": 128, "learned_dim": 64, "resnet_width": 16}


def synthetic_device_data(
    device: torch.device, n_train: int, n_test: int, generator: torch.Generator, image_size: int = 32
) -> DeviceData:
    """Random CIFAR-10-shaped uint8 images and labels in [0, 10), on ``device``, with CIFAR-10's normalisation."""
    from pipeline.data.cifar10 import CIFAR10_MEAN, CIFAR10_STD
    from pipeline.trial.device_data import DeviceData

    def images(n: int) -> torch.Tensor:
        shape = (n, 3, image_size, image_size)
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator).to(device)

    def labels(n: int) -> torch.Tensor:
        return torch.randint(0, 10, (n,), generator=generator).to(device)

    stats = [torch.tensor(s, device=device).view(1, 3, 1, 1) for s in (CIFAR10_MEAN, CIFAR10_STD)]
    return DeviceData(images(n_train), labels(n_train), images(n_test), labels(n_test), *stats)


# --- progress -----------------------------------------------------------------------------------------------------


def progress(message: str) -> None:
    """Long work says what it is doing, on stderr, so that stdout holds only the tables."""
    print(message, file=sys.stderr, flush=True)


def epoch_reporter(label: str, epochs: int, history: list[dict[str, float]] | None = None) -> Callable:
    """A ``run_trial`` reporter that prints one progress line per epoch (and keeps the metrics in ``history``)."""

    def report(metrics: dict[str, float], checkpoint_dir: object) -> None:
        if history is not None:
            history.append(metrics)
        progress(
            f"  {label}: epoch {metrics['epoch']}/{epochs}  train loss {metrics['train_loss']:.4f}  "
            f"test acc {metrics['test_acc']:.4f}  {metrics['epoch_time_s']:.1f} s"
        )

    return report


# --- tables -------------------------------------------------------------------------------------------------------


def text_table(rows: list[dict[str, str]], numeric: Collection[str] = ()) -> str:
    """Aligned plain-text table of ``rows`` (the first row's keys are the columns): a header, a rule of dashes, one
    line per row; ``numeric`` columns right-aligned, the others left-aligned, two spaces between columns."""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}

    def line(cells: dict[str, str]) -> str:
        return "  ".join(cells[c].rjust(widths[c]) if c in numeric else cells[c].ljust(widths[c]) for c in columns)

    rule = "  ".join("-" * widths[c] for c in columns)
    return "\n".join(text.rstrip() for text in [line({c: c for c in columns}), rule, *(line(r) for r in rows)])


# --- command line ------------------------------------------------------------------------------------------------


def make_parser(name: str, description: str | None, **kwargs: object) -> argparse.ArgumentParser:
    """A parser whose usage and error lines name the script as it is run: ``python -m benchmarks.<name>``."""
    return argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=description, **kwargs)


@contextmanager
def bad_input_is_a_usage_error(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Turn what the stages treat as bad input (``EXPECTED_FAILURES``: ConfigError and other ValueErrors, a missing
    file) raised inside the block into ``parser.error``: usage, one ``<prog>: error: <message>``
    line on stderr, exit code 2. Wrap only the checks and loading done before any work: a ValueError from the work
    itself is a bug and keeps its traceback."""
    try:
        yield
    except EXPECTED_FAILURES as err:
        parser.error(str(err))


def lab_store_uri(parser: argparse.ArgumentParser, directory: Path) -> str:
    """The tracking URI of the running store ``examples/lab_store.sh start DIR`` started in ``directory`` (it writes
    ``tracking_uri`` and ``mlflow.pid`` there); a usage error naming ``--lab-store`` when it is not one."""
    files = [directory / name for name in ("tracking_uri", "mlflow.pid")]
    if not all(f.is_file() for f in files):
        parser.error(f"--lab-store {directory}: not a running store (start one with examples/lab_store.sh)")
    return files[0].read_text().strip()


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _at_least(kind: type[int] | type[float], minimum: int, doc: str) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        value = _number(text, kind)
        if value < minimum:
            shown = value if kind is int else repr(text)
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {shown}")
        return value

    parse.__doc__ = f"argparse ``type=``: {doc}."
    return parse


positive_int = _at_least(int, 1, "an integer >= 1")
non_negative_int = _at_least(int, 0, "an integer >= 0")
non_negative_float = _at_least(float, 0, "a finite float >= 0")


def probability(text: str) -> float:
    """argparse ``type=``: a float in [0, 1), as ``model.attention_window_eps``."""
    value = _number(text, float)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value


def positive_ints(text: str) -> list[int]:
    """argparse ``type=``: comma-separated integers, each >= 1."""
    return [positive_int(item.strip()) for item in text.split(",")]


def probabilities(text: str) -> tuple[float, ...]:
    """argparse ``type=``: comma-separated floats, each in [0, 1)."""
    return tuple(probability(item.strip()) for item in text.split(","))


def check_range(parser: argparse.ArgumentParser, flag: str, bounds: tuple[float, float] | None) -> None:
    """``parser.error`` unless ``bounds`` (LOW, HIGH) satisfy 0 < LOW <= HIGH, both finite; None passes."""
    if bounds is None:
        return
    low, high = bounds
    if not (0 < low <= high and math.isfinite(high)):
        parser.error(f"{flag} LOW HIGH must satisfy 0 < LOW <= HIGH (both finite), got {low:g} {high:g}")
