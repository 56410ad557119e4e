"""Locality-truncated attention: FLOPs saved and output error against exact attention, per eps; optionally accuracy.

Part 1 (always). The paper-size model (SA quadratic, 9 heads, 6 layers, 400 wide, 16x16 tokens), its Gaussian heads
set trained-like (centres on the 3x3 grid around the query of the paper's Fig. 3, plus jitter; alpha log-uniform in
``--alpha``), in eval mode. For each eps: forward FLOPs per image (``FlopCounterMode``, multiply-add = 2, the
``full`` convention; the pure-shift heads' elementwise scaling, which it does not see, is added by formula), the
saving against exact attention, the largest kept-key width per layer, and the largest error of the logits and of the
attention heads' outputs (bounded by eps * max|x| per layer, checked).

Part 2 (``--train-epochs E``). Trains the variant twice on the prepared dataset of ``params.yaml`` (or
``--params``): exact attention and ``attention_window_eps = --train-eps``, same seed, and prints both final test
accuracies. On the CPU this is the embedded digits at smoke scale; the claim "accuracy is unchanged" needs the
CIFAR-10 run on a GPU.

Usage: ``python -m benchmarks.truncation [--eps 1e-2,1e-4,1e-6] [--train-epochs 4]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import (
    bad_input_is_a_usage_error,
    check_range,
    epoch_reporter,
    make_parser,
    non_negative_float,
    non_negative_int,
    positive_int,
    probabilities,
    probability,
)
from pipeline.config import PAPER_VARIANTS, ModelConfig, Params, load_params
from pipeline.data.prepared import PreparedData
from pipeline.encodings import spec_for
from pipeline.measure.counting import count_flops
from pipeline.measure.speed import set_gaussian_heads
from pipeline.models import build_model
from pipeline.models.local_attention import LocalMultiHeadSelfAttention, dense_flops, window_flops


def parse_args(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser (for errors found later, in the params file) and the checked arguments; ``args.eps`` is a tuple."""
    parser = make_parser("truncation", __doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default="sa_quadratic_9",
        choices=[n for n, v in PAPER_VARIANTS.items() if v.arch == "sa" and spec_for(v.fields["encoding"]).gaussian],
    )
    parser.add_argument(
        "--eps",
        type=probabilities,
        default="1e-2,1e-3,1e-4,1e-6,1e-9",
        help="comma-separated eps values, each in [0, 1) (default: %(default)s)",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        nargs=2,
        default=(1.0, 10.0),
        metavar=("LOW", "HIGH"),
        help="Gaussian heads' alpha, log-uniform in [LOW, HIGH], 0 < LOW <= HIGH (default: 1 10)",
    )
    parser.add_argument(
        "--jitter",
        type=non_negative_float,
        default=0.1,
        help="std of the centres around the 3x3 grid, >= 0 (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=4, help="images of the error table (default: %(default)s)"
    )
    parser.add_argument(
        "--train-epochs",
        type=non_negative_int,
        default=0,
        metavar="E",
        help="also train exact vs truncated for E epochs (part 2; default: %(default)s, part 1 only)",
    )
    parser.add_argument(
        "--train-eps",
        type=probability,
        default=1e-4,
        help="attention_window_eps of the truncated model of part 2, in [0, 1) (default: %(default)s)",
    )
    parser.add_argument(
        "--params",
        type=Path,
        default=Path("params.yaml"),
        help="params file of part 2: dataset, model sizes, training (default: %(default)s)",
    )
    parser.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="device of both parts (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    check_range(parser, "--alpha", args.alpha)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but no CUDA device is available")
    return parser, args


def _heads_outputs(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list, list]:
    """Logits, and per layer the attention's input x and its heads' outputs (the input of its ``value``)."""
    inputs, heads, hooks = [], [], []
    for layer in model.layers:
        hooks.append(layer.attention.register_forward_hook(lambda m, args, out: inputs.append(args[0])))
        hooks.append(layer.attention.value.register_forward_hook(lambda m, args, out: heads.append(args[0])))
    try:
        with torch.no_grad():
            logits = model(images)
    finally:
        for hook in hooks:
            hook.remove()
    return logits, inputs, heads


def error_table(args: argparse.Namespace, device: torch.device) -> None:
    cfg = PAPER_VARIANTS[args.model].apply(ModelConfig())
    torch.manual_seed(0)
    dense = build_model(cfg).to(device).eval()
    set_gaussian_heads(dense, tuple(args.alpha), jitter=args.jitter)
    images = torch.randn(args.batch_size, 3, 32, 32, device=device)
    logits, _, dense_heads = _heads_outputs(dense, images)
    dense_forward = count_flops(dense).full
    print(
        f"{args.model}, paper size; heads: 3x3 grid + N(0, {args.jitter}^2) jitter, alpha log-uniform in "
        f"{list(args.alpha)}; eval mode, batch {args.batch_size}"
    )
    print(f"exact attention: {dense_forward / 1e9:.3f} GFLOP per image (full convention, multiply-add = 2)\n")
    header = (
        f"{'eps':>7} {'GFLOP/img':>9} {'saved':>6} {'attn sums saved':>15} {'K per layer':>20} "
        f"{'max|logit err|':>14} {'max head err/max|x|':>19}"
    )
    print(header)
    print("-" * len(header))
    for eps in args.eps:
        local = build_model(cfg.model_copy(update={"attention_window_eps": eps})).to(device).eval()
        local.load_state_dict(dense.state_dict())
        out, inputs, heads = _heads_outputs(local, images)
        layers = [layer.attention for layer in local.layers]
        assert all(isinstance(a, LocalMultiHeadSelfAttention) for a in layers)
        plans = [a.plan(local.grid) for a in layers]
        shift_flops = sum(len(p.shift_heads) * p.counts.shape[1] * a.in_dim for p, a in zip(plans, layers, strict=True))
        flops = count_flops(local).full + shift_flops
        relative = max(
            ((h - d).abs().max() / x.abs().max()).item() for h, d, x in zip(heads, dense_heads, inputs, strict=True)
        )
        sums = sum(window_flops(p, a.in_dim) for p, a in zip(plans, layers, strict=True))
        dense_sums = sum(
            dense_flops(a.num_heads, p.counts.shape[1], a.in_dim) for p, a in zip(plans, layers, strict=True)
        )
        widths = ",".join(str(p.width) for p in plans)
        print(
            f"{eps:>7.0e} {flops / 1e9:>9.3f} {100 * (1 - flops / dense_forward):>5.1f}% "
            f"{100 * (1 - sums / dense_sums):>14.1f}% {widths:>20} "
            f"{(out - logits).abs().max().item():>14.2e} {relative:>19.2e}"
        )
    print("\nsaved: of the whole forward pass (the attention sums, 2 H N^2 D per layer, are 31% of it at this size);")
    print(
        "attn sums saved: of those sums alone. K: keys per query of the layer's shared matmul (union over its heads)."
    )
    print("max head err/max|x| <= eps (+ float32 rounding) is the guarantee; kept probabilities are not renormalised.")


def training_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Params, PreparedData]:
    """Part 2's params and prepared dataset, loaded before part 1 runs: a bad --params file, an unknown variant or a
    missing dataset ends in ``parser.error`` (exit code 2) before anything is computed."""
    from pipeline.data.sources import prepare_dataset

    with bad_input_is_a_usage_error(parser):
        params = load_params(args.params)
    if args.model not in params.variants:
        parser.error(f"--model {args.model!r} is not a variant of {args.params}; defined: {sorted(params.variants)}")
    with bad_input_is_a_usage_error(parser):
        data = prepare_dataset(params.data, args.params.resolve().parent)
    return params, data


def accuracy_run(args: argparse.Namespace, params: Params, data: PreparedData) -> None:
    from pipeline.trial.loop import run_trial

    train_cfg = params.train.model_copy(update={"epochs": args.train_epochs, "device": args.device})
    print(
        f"\ntraining {args.model} on {params.data.dataset} ({args.params}, model section's sizes), "
        f"{args.train_epochs} epochs, seed {train_cfg.seed}"
    )
    for eps in (None, args.train_eps):
        cfg = params.model_for(args.model).model_copy(update={"attention_window_eps": eps})
        started = time.perf_counter()
        label = "exact" if eps is None else f"eps {eps:.0e}"
        final = run_trial(cfg, train_cfg, data, epoch_reporter(label, args.train_epochs))
        print(
            f"  {label:<10} test acc {final['test_acc']:.4f}  test loss {final['test_loss']:.4f}  "
            f"({time.perf_counter() - started:.0f} s)"
        )


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(argv)
    training = training_inputs(parser, args) if args.train_epochs else None
    error_table(args, torch.device(args.device))
    if training is not None:
        accuracy_run(args, *training)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
