"""Where a training step's time goes: images/s, MFU, how busy the device is, and the kernels that take the time.

The GPU evidence (``benchmarks.gpu_evidence``) says how fast each model trains; this says why. For each variant of the
params file (built at paper size: the params' variant fields on ``ModelConfig()``'s defaults), each path (``plain``
fp32 or ``optimised`` bf16 autocast, as ``benchmarks.train_throughput``) and each batch size it

1. times ``--steps`` training steps of the trainer's own loop (``train_one_epoch``) without a profiler: images/s and
   MFU against the bf16 (CUDA) or fp32 (CPU) matmul peak measured in the same run;
2. profiles ``--profiled-steps`` more steps with ``torch.profiler``: the device-busy share (summed kernel time over
   the profiled wall time; low means the host cannot launch kernels fast enough, so a larger batch or CUDA graphs would
   help, high means the kernels themselves are the limit) and the ``--top`` kernels by device time, with their share.

    python -m benchmarks.gpu_profile                                   # sa_quadratic_9, resnet18; plain, optimised; 100
    python -m benchmarks.gpu_profile --variants sa_quadratic_9 sa_gpsa_9 --batch-sizes 100 400

Without CUDA it runs at the reduced CPU size (``benchmarks.common.REDUCED_MODEL``) and profiles CPU operators: it
shows only that the script runs. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import (
    REDUCED_MODEL,
    bad_input_is_a_usage_error,
    make_parser,
    positive_int,
    progress,
    synthetic_device_data,
)
from pipeline.config import ModelConfig, Params, TrainConfig, load_params
from pipeline.measure.speed import count_training_flops, matmul_peak_flops
from pipeline.models import build_model
from pipeline.trial.checkpoint import Trial
from pipeline.trial.device import synchronize
from pipeline.trial.loop import build_optimizer, build_scheduler, train_one_epoch

PATHS = ("plain", "optimised")


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("gpu_profile", __doc__.split("\n\n")[0], epilog="See the module docstring.")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: %(default)s)")
    parser.add_argument(
        "--variants", nargs="+", default=["sa_quadratic_9", "resnet18"], help="variants (default: %(default)s)"
    )
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS, help="default: %(default)s")
    parser.add_argument(
        "--batch-sizes", nargs="+", type=positive_int, default=None, help="training batches (default: 100 GPU, 8 CPU)"
    )
    parser.add_argument("--steps", type=positive_int, default=None, help="timed steps (default: 30 GPU, 2 CPU)")
    parser.add_argument("--profiled-steps", type=positive_int, default=5, help="profiled steps (default: 5)")
    parser.add_argument("--top", type=positive_int, default=8, help="kernels listed per case (default: 8)")
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Params]:
    parser = build_parser()
    args = parser.parse_args(argv)
    with bad_input_is_a_usage_error(parser):
        params = load_params(args.params)
    unknown = [v for v in args.variants if v not in params.variants]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; defined in {args.params}: {sorted(params.variants)}")
    on_gpu = torch.cuda.is_available()
    args.batch_sizes = args.batch_sizes or ([100] if on_gpu else [8])
    args.steps = args.steps or (30 if on_gpu else 2)
    return args, params


def _kernel_rows(prof: profile, device: torch.device, top: int) -> tuple[float, list[tuple[str, float, int]]]:
    """Total self time on the device (s) and the ``top`` entries by it: (name, share, calls). On the CPU the
    'kernels' are the operators' own CPU time."""
    on_gpu = device.type == "cuda"
    events = [e for e in prof.key_averages() if (e.self_device_time_total if on_gpu else e.self_cpu_time_total) > 0]
    if on_gpu:  # kernels only: an operator's self device time is the kernels it launched directly
        events = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA] or events
    seconds = [(e.self_device_time_total if on_gpu else e.self_cpu_time_total) / 1e6 for e in events]
    total = sum(seconds)
    ranked = sorted(zip(events, seconds, strict=True), key=lambda pair: -pair[1])[:top]
    return total, [(e.key, s / total, e.count) for e, s in ranked]


def profile_case(
    model_cfg: ModelConfig, path: str, batch: int, args: argparse.Namespace, device: torch.device, peak: float
) -> dict:
    amp = torch.bfloat16 if device.type == "cuda" and path == "optimised" else None
    cfg = TrainConfig(batch_size=batch, eval_batch_size=batch, crop_padding=4, epochs=1)
    torch.manual_seed(0)
    model = build_model(model_cfg).to(device)
    generator = torch.Generator().manual_seed(0)
    optimizer = build_optimizer(model, cfg)
    trial = Trial(model, optimizer, build_scheduler(optimizer, cfg, args.steps), generator)
    flops = count_training_flops(
        model, torch.randn(batch, 3, 32, 32, device=device), torch.zeros(batch, dtype=int, device=device), amp
    )

    def data(steps: int):
        return synthetic_device_data(device, steps * batch, batch, generator)

    train_one_epoch(trial, data(2), cfg, amp)  # warm-up: CUDA/cuBLAS initialisation, allocator
    timed = data(args.steps)
    synchronize(device)
    started = time.perf_counter()
    train_one_epoch(trial, timed, cfg, amp)  # ends with .item(): synchronised
    images_per_s = args.steps * batch / (time.perf_counter() - started)

    profiled = data(args.profiled_steps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        train_one_epoch(trial, profiled, cfg, amp)
        synchronize(device)
        wall = time.perf_counter() - started
    busy, kernels = _kernel_rows(prof, device, args.top)
    return {
        "images_per_s": images_per_s,
        "step_ms": 1000 * batch / images_per_s,
        "mfu": flops / batch * images_per_s / peak,
        "busy": busy / wall,
        "kernels": kernels,
        "calls_per_step": 1 / args.profiled_steps,
    }


def main(argv: list[str] | None = None) -> int:
    args, params = parse_args(argv)
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    peak = matmul_peak_flops(device, torch.bfloat16 if on_gpu else torch.float32)
    base = ModelConfig() if on_gpu else ModelConfig(**REDUCED_MODEL)
    name = torch.cuda.get_device_name(device) if on_gpu else f"CPU, {torch.get_num_threads()} threads, REDUCED SIZE"
    print(f"device: {name}; torch {torch.__version__}; matmul peak {peak / 1e12:.1f} TFLOP/s (the MFU denominator)")
    for variant in args.variants:
        model_cfg = params.variants[variant].apply(base)
        for path in args.paths:
            for batch in args.batch_sizes:
                progress(f"profiling {variant} / {path} / batch {batch} ...")
                case = profile_case(model_cfg, path, batch, args, device, peak)
                print(
                    f"\n{variant} / {path} / batch {batch}: {case['images_per_s']:,.0f} images/s, "
                    f"{case['step_ms']:.1f} ms/step, MFU {100 * case['mfu']:.1f} %, device busy "
                    f"{100 * case['busy']:.0f} % of the profiled wall time"
                )
                print(f"  {'share':>6} {'calls/step':>10}  kernel")
                for kernel, share, calls in case["kernels"]:
                    print(f"  {100 * share:>5.1f}% {calls * case['calls_per_step']:>10.1f}  {kernel[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
