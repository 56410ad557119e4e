"""The paper's finding on a CPU, measured: quadratic heads move to a kernel-like grid around the query.

Trains the variants of a params file (default: SA quadratic, SA generalized and ResNet18 of ``params.yaml``) with
the sweep's own trial code (``run_trial``), one after the other on one thread, and prints:

- per SA variant and layer (``analysis.head_motion``; distances in tokens, "init->end"): the mean displacement of
  the head centres from their initialisation, their mean distance from the query, the mean attention distance, the
  mean peak probability, how many heads are kernel taps (centre within 0.5 tokens of an integer shift at most 2
  tokens from the query, and at least half of the head's attention on that one key) on how many distinct shifts,
  and how many sharp heads sit within one token of such a shift of their own (the report's "heads at distinct
  shifts");
- per variant: final test accuracy, its gap to ResNet18 in points, and the CPU and wall seconds of its training.

CPU seconds (``time.process_time``, this process on one thread) are the figure to compare across machines and
loads; the wall time of a shared machine is not. ``--csv`` keeps every epoch's per-layer measures.

    python -m benchmarks.finding                       # params.yaml's configuration, about 4 CPU minutes
    python -m benchmarks.finding --variants sa_quadratic_9 sa_quadratic_16 sa_generalized_9 sa_learned_9 resnet18
    python -m benchmarks.finding --variants sa_quadratic_9 --set train.positional_lr_factor=1   # one lever
    python -m benchmarks.finding --smoke               # tiny widths, 2 epochs: checks the script in seconds
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from analysis.head_motion import (
    MIN_PEAK,
    RADIUS,
    TOLERANCE,
    finding_summary,
    gap_to_baseline,
    motion_frame,
)
from benchmarks.common import (
    bad_input_is_a_usage_error,
    epoch_reporter,
    make_parser,
    positive_int,
    progress,
    text_table,
)
from pipeline.config import Params, load_params, parse_params
from pipeline.data.prepared import PreparedData
from pipeline.data.sources import prepare_dataset
from pipeline.trial.checkpoint import load_head_history
from pipeline.trial.loop import run_trial

DEFAULT_VARIANTS = ("sa_quadratic_9", "sa_generalized_9", "resnet18")
BASELINE = "resnet18"
# --smoke: the configuration's data and schedule at the smallest widths, for a test that the script runs.
SMOKE_MODEL = {"hidden": 8, "layers": 2, "ffn": 16, "learned_dim": 4, "resnet_width": 2}
SMOKE_EPOCHS = 2


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("finding", __doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: %(default)s)")
    parser.add_argument(
        "--variants", nargs="+", default=list(DEFAULT_VARIANTS), help="variants to train (default: %(default)s)"
    )
    parser.add_argument("--epochs", type=positive_int, help="epochs per variant (default: the params' train.epochs)")
    parser.add_argument("--seed", type=int, default=0, help="the trials' seed (default: %(default)s)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch intra-op threads (default: 1)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override one param of the file (a YAML value; repeatable), e.g. --set train.positional_lr_factor=1 "
        "--set model.layers=2: how docs/finding.md measures each lever",
    )
    parser.add_argument("--csv", type=Path, metavar="FILE", help="write every epoch's per-layer measures there")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"smallest widths ({SMOKE_MODEL}) and {SMOKE_EPOCHS} epochs: checks the script, measures nothing",
    )
    parser.add_argument("--verbose", action="store_true", help="also the trainer's own log")
    return parser


def check_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Params:
    """Everything the command line and the params file can get wrong, before any data is prepared or model trained."""
    with bad_input_is_a_usage_error(parser):
        params = load_params(args.params)
        if args.overrides:
            params = parse_params(with_overrides(params, args.overrides), f"{args.params} with --set")
    unknown = [name for name in args.variants if name not in params.variants]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; defined in {args.params}: {sorted(params.variants)}")
    if len(set(args.variants)) != len(args.variants):
        parser.error(f"--variants: listed more than once: {args.variants}")
    if not 0 <= args.seed < 2**32:
        parser.error(f"--seed: must be in [0, 2**32), got {args.seed}")
    if args.csv is not None and (args.csv.is_dir() or not args.csv.parent.is_dir()):
        parser.error(f"--csv {args.csv}: not a file in an existing directory")
    if args.smoke:
        params = params.model_copy(update={"model": params.model.model_copy(update=SMOKE_MODEL)})
    return params


def with_overrides(params: Params, overrides: list[str]) -> dict:
    """``params`` as a plain mapping with each ``KEY=VALUE`` applied (validated by the caller, which names a bad key);
    raises ``ValueError`` for an override that is not ``KEY=VALUE`` or whose KEY does not lead to a section."""
    raw = params.model_dump()
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {override!r}: expected KEY=VALUE, e.g. train.positional_lr_factor=1")
        *sections, name = key.split(".")
        node = raw
        for section in sections:
            if not isinstance(node.get(section), dict):
                raise ValueError(f"--set {key}: {section!r} is not a section of the params")
            node = node[section]
        node[name] = yaml.safe_load(text)
    return raw


def train_variant(
    params: Params, variant: str, epochs: int, seed: int, data: PreparedData
) -> tuple[dict[str, float], list[dict]]:
    """One trial of ``variant``; returns its final metrics with CPU and wall seconds, and its head history."""
    model_cfg = params.model_for(variant)
    train_cfg = params.train_for(variant).model_copy(update={"epochs": epochs, "device": "cpu", "seed": seed})
    heads: list[dict] = []
    report = epoch_reporter(variant, epochs)

    def keep_heads(metrics: dict[str, float], checkpoint_dir: Path) -> None:
        report(metrics, checkpoint_dir)
        heads[:] = load_head_history(checkpoint_dir)  # epoch 0 (init) .. this epoch

    progress(f"training {variant}, {epochs} epochs")
    cpu, wall = time.process_time(), time.perf_counter()
    final = run_trial(model_cfg, train_cfg, data, keep_heads)
    final = {**final, "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}
    return final, heads


def heads_rows(motion: dict[str, pd.DataFrame]) -> list[dict[str, str]]:
    """Per SA variant and layer: measures at init -> at the last epoch (``analysis.head_motion.finding_summary``, as
    the report computes them)."""
    rows = []
    for variant, frame in motion.items():
        for _, b in finding_summary(frame).iterrows():
            rows.append(
                {
                    "variant": variant,
                    "layer": str(int(b.layer)),
                    "displacement": f"{b.displacement:.2f}",
                    "|centre|": f"{b.centre_norm_init:.2f}->{b.centre_norm:.2f}",
                    "attn_distance": f"{b.mean_attention_distance_init:.2f}->{b.mean_attention_distance:.2f}",
                    "peak_prob": f"{b.peak_probability_init:.2f}->{b.peak_probability:.2f}",
                    "kernel_heads": f"{b.kernel_heads_init:.0f}->{b.kernel_heads:.0f}/{b.heads:.0f}",
                    "distinct_shifts": f"{b.distinct_shifts_init:.0f}->{b.distinct_shifts:.0f}",
                    "at_distinct_shifts": f"{b.heads_at_distinct_shifts_init:.0f}->{b.heads_at_distinct_shifts:.0f}",
                    "by_position": f"{b.shifts_by_position_init:.0f}->{b.shifts_by_position:.0f}",
                    "uniform": f"{b.degenerate_init:.0f}->{b.degenerate:.0f}",
                }
            )
    return rows


def accuracy_rows(finals: dict[str, dict[str, float]]) -> list[dict[str, str]]:
    """Per variant: final test accuracy, its gap to the baseline (points, ``analysis.head_motion.gap_to_baseline``),
    CPU and wall seconds of its training."""
    gaps = gap_to_baseline({variant: m["test_acc"] for variant, m in finals.items()}, BASELINE)
    return [
        {
            "variant": variant,
            "test_acc": f"{m['test_acc']:.3f}",
            f"gap_to_{BASELINE}": f"{gaps[variant]:+.1f}pt" if variant in gaps else "-",
            "cpu_s": f"{m['cpu_s']:.1f}",
            "wall_s": f"{m['wall_s']:.1f}",
        }
        for variant, m in finals.items()
    ]


def setting(params: Params, data: PreparedData, epochs: int, args: argparse.Namespace) -> str:
    m, t = params.model, params.train
    size = data.image_shape[1]
    grid = size // m.downsample
    return (
        f"{'SMOKE SIZE (measures nothing): ' if args.smoke else ''}{args.params}: {params.data.dataset} "
        f"{size}x{size}, {grid}x{grid} tokens of {m.downsample}x{m.downsample} px, {len(data.train_labels)} train "
        f"images; SA hidden {m.hidden} x {m.layers} layers, centre init std {m.centre_init_std:g}; {epochs} epochs, "
        f"batch {t.batch_size}, lr {t.lr:g}, positional lr x{t.positional_lr_factor:g}, augment {t.augment} "
        f"(crop padding {t.crop_padding}); seed {args.seed}; torch threads {torch.get_num_threads()}"
        + "".join(f"; --set {override}" for override in args.overrides)
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    params = check_inputs(parser, args)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    torch.set_num_threads(args.threads)
    epochs = SMOKE_EPOCHS if args.smoke else args.epochs or params.train.epochs
    with bad_input_is_a_usage_error(parser):  # a missing or unreadable dataset (data.cifar10_path)
        data = prepare_dataset(params.data, args.params.resolve().parent)
    finals, motion = {}, {}
    for variant in args.variants:
        finals[variant], heads = train_variant(params, variant, epochs, args.seed, data)
        if heads:  # Gaussian encodings only
            motion[variant] = motion_frame(heads)
    print(setting(params, data, epochs, args))
    print()
    if motion:
        print(
            f"heads, init->end (tokens; kernel head: centre within {TOLERANCE} of an integer shift at most {RADIUS} "
            f"from the query and >= {MIN_PEAK:.0%} of its attention on that key; at_distinct_shifts: the distinct such "
            f"shifts the sharp heads (>= {MIN_PEAK:.0%}) put most mass on; by_position: the same over all heads; "
            "uniform: degenerate heads, left out of the rest; every measure from the head's own Gaussian, no grid)"
        )
        print(text_table(heads_rows(motion), numeric={"layer", "displacement"}))
        print()
    print(f"accuracy after {epochs} epochs (gap: {BASELINE} minus the variant, in points)")
    print(text_table(accuracy_rows(finals), numeric={"test_acc", f"gap_to_{BASELINE}", "cpu_s", "wall_s"}))
    print(f"\ntotal: {sum(m['cpu_s'] for m in finals.values()):.1f} CPU s")
    if args.csv is not None:
        frames = [frame.assign(variant=variant) for variant, frame in motion.items()]
        (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()).to_csv(args.csv, index=False)
        print(f"per-epoch measures: {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
