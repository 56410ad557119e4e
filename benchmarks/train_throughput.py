"""Training and evaluation throughput of the paper's models, per implementation path, measured as MFU.

For each model of the sweep and each path it prints images/s for training and evaluation, ms per training step,
peak GPU memory, counted training FLOPs per image (forward + backward, ``FlopCounterMode``, multiply-add = 2) and
MFU = those FLOPs per second / the bf16 (CUDA) or fp32 (CPU) matmul FLOP/s this script measures on the same device
in the same run. Then seconds per epoch (50,000 training + 10,000 test images) and the projected time of the
paper's 300-epoch schedule.

Paths (each tested against ``plain``: tests/unit/pipeline/measure/test_speed.py and the files its docstring names,
tests/unit/test_authors_pattern.py; graphed and whole-step only on a GPU, by tests/unit/pipeline/trial/test_loop.py):
  plain       fp32, eager, exact dense attention
  optimised   bf16 autocast with fp32 master weights (CUDA; the CPU stays fp32, as train.amp does), eager
  compiled    optimised + torch.compile (compile time reported separately, in the "first s" column)
  graphed     optimised + torch.compile(mode="reduce-overhead"): the step replayed as CUDA graphs, one launch instead
              of hundreds, for batch 100, where the H200 was host-bound (CUDA only)
  whole-step  optimised + torch.compile, the whole step (forward, backward, SGD) captured as one CUDA graph
              (``train.compile: whole-step``, ``pipeline.trial.whole_step``; CUDA only)
  channels_last optimised with weights in channels-last layout, so cuDNN runs NHWC without converting around every
              convolution (which took 10-14 % of ResNet18's H200 time); convolutional models only
  truncated   optimised + locality-truncated attention (model.attention_window_eps = --eps); Gaussian models only
  authors     the authors' computational pattern (``benchmarks.authors_pattern``: 5-D einsums, fp32); Gaussian
              models only: the baseline our paths are compared with

Every path runs the trainer's own loop (``pipeline.trial.loop.train_one_epoch`` / ``evaluate``): data held on the device
as uint8, batched on-device augmentation drawn per epoch, no host sync per step (the divergence check reads the
epoch's losses at its end).

On a CPU it runs at reduced size (hidden 64, 2 layers, batch 8: still 16x16 tokens) and says so; the figures to
quote are the GPU ones. Usage: ``python -m benchmarks.train_throughput [--help]``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace

import torch

from benchmarks.authors_pattern import use_authors_pattern
from benchmarks.common import (
    REDUCED_MODEL,
    check_range,
    make_parser,
    positive_int,
    probability,
    progress,
    synthetic_device_data,
)
from pipeline.config import PAPER_VARIANTS, ModelConfig, TrainConfig
from pipeline.encodings import spec_for
from pipeline.measure.speed import (
    count_training_flops,
    matmul_peak_flops,
    peak_memory_bytes,
    reset_peak_memory,
    set_gaussian_heads,
)
from pipeline.models import build_model
from pipeline.trial.checkpoint import Trial
from pipeline.trial.device import flush_subnormals, synchronize
from pipeline.trial.loop import build_optimizer, build_scheduler, evaluate, train_one_epoch
from pipeline.trial.whole_step import WholeStep

PATHS = ("plain", "optimised", "compiled", "graphed", "whole-step", "channels_last", "truncated", "authors")
CUDA_ONLY_PATHS = ("compiled", "graphed", "whole-step")  # torch.compile on a CPU measures compile time, not a GPU path
TRAIN_IMAGES, TEST_IMAGES, EPOCHS = 50_000, 10_000, 300


@dataclass
class Row:
    model: str
    path: str
    train_ips: float
    eval_ips: float
    step_ms: float
    first_s: float
    peak_mib: float | None
    gflop_per_image: float
    mfu: float
    batch_size: int | None = None

    @property
    def epoch_s(self) -> float:
        return TRAIN_IMAGES / self.train_ips + TEST_IMAGES / self.eval_ips


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed and checked arguments: every problem ends in ``parser.error`` (exit code 2) before anything is measured.
    Resolves ``args.device`` (auto: cuda or cpu), fills in the device-dependent defaults, and splits ``args.paths``
    and ``args.models`` into lists."""
    parser = make_parser("train_throughput", __doc__.split("\n\n")[0], epilog="See the module docstring.")
    parser.add_argument("--models", default=",".join(PAPER_VARIANTS), help="comma-separated variants (default: all)")
    parser.add_argument(
        "--paths", default=None, help=f"comma-separated of {PATHS} (default: all; CPU: none of {CUDA_ONLY_PATHS})"
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--batch-size", type=positive_int, default=None, help="training batch (default: 100 GPU, 8 CPU)"
    )
    parser.add_argument("--eval-batch-size", type=positive_int, default=None, help="default: 500 GPU, 32 CPU")
    parser.add_argument(
        "--steps", type=positive_int, default=None, help="timed training steps (default: 50 GPU, 3 CPU)"
    )
    parser.add_argument(
        "--eps",
        type=probability,
        default=1e-4,
        help="attention_window_eps of the truncated path, in [0, 1) (default: %(default)s)",
    )
    parser.add_argument(
        "--head-alpha",
        type=float,
        nargs=2,
        default=None,
        metavar=("LOW", "HIGH"),
        help="give Gaussian heads a trained-like shape (3x3 grid of centres, alpha log-uniform in [LOW, HIGH], "
        "0 < LOW <= HIGH) before timing every path; default: the random initialisation",
    )
    parser.add_argument("--full-size", action="store_true", help="paper-size models even on the CPU (slow)")
    args = parser.parse_args(argv)
    check_range(parser, "--head-alpha", args.head_alpha)
    args.models = args.models.split(",")
    unknown = [m for m in args.models if m not in PAPER_VARIANTS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; valid: {list(PAPER_VARIANTS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but no CUDA device is available")
    on_gpu = args.device != "cpu" and torch.cuda.is_available()
    args.device = "cuda" if on_gpu else "cpu"
    args.paths = args.paths.split(",") if args.paths else [p for p in PATHS if on_gpu or p not in CUDA_ONLY_PATHS]
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown:
        parser.error(f"--paths: unknown {unknown}; valid: {list(PATHS)}")
    if args.batch_size is None:
        args.batch_size = 100 if on_gpu else 8
    if args.eval_batch_size is None:
        args.eval_batch_size = 500 if on_gpu else 32
    if args.steps is None:
        args.steps = 50 if on_gpu else 3
    return args


def _position_only_gaussian(model_cfg: ModelConfig) -> bool:
    """Heads whose probabilities are their Gaussians alone: what truncation and the authors' pattern compute."""
    if model_cfg.arch != "sa" or model_cfg.content:
        return False
    spec = spec_for(model_cfg.encoding)
    return spec.gaussian and not spec.reads_content


def measure(
    name: str,
    path: str,
    model_cfg: ModelConfig,
    args: argparse.Namespace,
    device: torch.device,
    peak: float,
) -> Row | None:
    if path in ("truncated", "authors") and not _position_only_gaussian(model_cfg):
        return None
    if path == "channels_last" and model_cfg.arch == "sa":
        return None  # no convolution: the layout changes nothing
    if path == "truncated":
        model_cfg = model_cfg.model_copy(update={"attention_window_eps": args.eps})
    amp = torch.bfloat16 if device.type == "cuda" and path not in ("plain", "authors") else None
    cfg = TrainConfig(batch_size=args.batch_size, eval_batch_size=args.eval_batch_size, crop_padding=4, epochs=1)
    torch.manual_seed(0)
    model = build_model(model_cfg).to(device)
    if args.head_alpha is not None:
        set_gaussian_heads(model, tuple(args.head_alpha), jitter=0.1)
    if path == "authors":
        use_authors_pattern(model)
    if path == "channels_last":
        model = model.to(memory_format=torch.channels_last)  # NCHW inputs follow the first convolution's weights
    generator = torch.Generator().manual_seed(0)
    data = synthetic_device_data(device, args.steps * args.batch_size, 2 * args.eval_batch_size, generator)
    flops = count_training_flops(
        model,
        data.normalise(data.train_images[: args.batch_size].float() / 255),
        data.train_labels[: args.batch_size],
        amp,
    )
    if path in CUDA_ONLY_PATHS:
        torch._dynamo.reset()  # as train.compile does: earlier models' graphs must not fill the recompile limit
    runner = model
    if path in ("compiled", "whole-step"):
        runner = torch.compile(model)
    elif path == "graphed":
        runner = torch.compile(model, mode="reduce-overhead")
    optimizer = build_optimizer(model, cfg)
    trial = Trial(model, optimizer, build_scheduler(optimizer, cfg, args.steps), generator, runner=runner)
    # Two batches each: CUDA graphs (the graphed path) run a warm-up call, then record on the second.
    warm = synthetic_device_data(device, 2 * args.batch_size, 2 * args.eval_batch_size, generator)
    if path == "whole-step":  # the captured step reads the images it is built on: it warms up on the timed set's
        warm = replace(warm, train_images=data.train_images[: 2 * args.batch_size])

    # First calls: CUDA/cuBLAS initialisation, and compilation of the train and eval graphs on the compiled path.
    synchronize(device)
    started = time.perf_counter()
    if path == "whole-step":
        trial.whole_step = WholeStep(trial, data, cfg, amp)  # compiles and captures
    train_one_epoch(trial, warm, cfg, amp)
    evaluate(runner, warm.test_images, warm.test_labels, warm, args.eval_batch_size, amp)
    synchronize(device)
    first_s = time.perf_counter() - started

    reset_peak_memory(device)
    started = time.perf_counter()
    train_one_epoch(trial, data, cfg, amp)  # ends with .item(): synchronised
    train_s = time.perf_counter() - started
    started = time.perf_counter()
    evaluate(runner, data.test_images, data.test_labels, data, args.eval_batch_size, amp)
    eval_s = time.perf_counter() - started
    memory = peak_memory_bytes(device)

    n_train = args.steps * args.batch_size
    train_ips = n_train / train_s
    per_image = flops / args.batch_size
    return Row(
        model=name,
        path=path,
        train_ips=train_ips,
        eval_ips=2 * args.eval_batch_size / eval_s,
        step_ms=1000 * train_s / args.steps,
        first_s=first_s,
        peak_mib=None if memory is None else memory / 2**20,
        gflop_per_image=per_image / 1e9,
        mfu=per_image * train_ips / peak,
        batch_size=args.batch_size,
    )


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:.1f} h" if hours >= 1 else f"{seconds / 60:.1f} min"


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'model':<17} {'path':<10} {'train img/s':>11} {'eval img/s':>10} {'ms/step':>8} {'first s':>8} "
        f"{'peak MiB':>8} {'GFLOP/img':>9} {'MFU':>6} {'s/epoch':>8} {'300 epochs':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        memory = "-" if r.peak_mib is None else f"{r.peak_mib:.0f}"
        print(
            f"{r.model:<17} {r.path:<10} {r.train_ips:>11.1f} {r.eval_ips:>10.1f} {r.step_ms:>8.1f} {r.first_s:>8.1f} "
            f"{memory:>8} {r.gflop_per_image:>9.3f} {100 * r.mfu:>5.1f}% {r.epoch_s:>8.1f} "
            f"{_duration(EPOCHS * r.epoch_s):>10}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, paths = torch.device(args.device), args.paths
    flush_subnormals(device)  # as a trial on the CPU does (a no-op on CUDA)
    on_gpu = device.type == "cuda"
    reduced = not on_gpu and not args.full_size

    name = torch.cuda.get_device_name(device) if on_gpu else f"CPU, {torch.get_num_threads()} threads"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    peak = matmul_peak_flops(device, dtype)
    print(f"device: {name}; torch {torch.__version__}")
    print(f"measured {str(dtype).removeprefix('torch.')} matmul peak: {peak / 1e12:.2f} TFLOP/s (the MFU denominator)")
    base = ModelConfig(**REDUCED_MODEL) if reduced else ModelConfig()
    if reduced:
        print(
            f"CPU: REDUCED SIZE {REDUCED_MODEL} (16x16 tokens as in the paper), batch {args.batch_size}, "
            f"{args.steps} steps; paper-size figures need a GPU (or --full-size)"
        )
    if not on_gpu:
        print(
            "CPU: 'optimised' = plain numerics (bf16 autocast is CUDA-only, as in train.amp); compiled and graphed "
            "paths only with --paths"
        )
    if args.head_alpha is not None:
        print(f"Gaussian heads set trained-like: 3x3/4x4 grid of centres, alpha in {args.head_alpha}")
    print(f"truncated path: attention_window_eps = {args.eps}; epoch = {TRAIN_IMAGES:,} train + {TEST_IMAGES:,} test")
    print()

    rows = []
    for model_name in args.models:
        model_cfg = PAPER_VARIANTS[model_name].apply(base)
        for path in paths:
            progress(f"measuring {model_name} / {path} ...")
            row = measure(model_name, path, model_cfg, args, device, peak)
            if row is not None:
                rows.append(row)
    print_table(rows)
    print("\nfirst s: first training step + first evaluation (CUDA warm-up; compilation on the compiled path).")
    print("GFLOP/img: counted forward + backward FLOPs per training image (multiply-add = 2); truncated counts the")
    print("reduced attention sums it executes, so its MFU understates its speed-up: compare img/s across paths.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
