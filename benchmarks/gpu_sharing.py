"""Trials sharing one GPU: 1 vs 2 vs 4 training processes at once, as Ray runs fractional-GPU trials.

Ray gives a trial with ``resources: {gpu: 0.5}`` the same device as its neighbour and nothing more: no memory cap, no
time slicing of its own. This script starts k = 1, 2, 4 independent worker processes (a fresh interpreter each, as
Ray workers are), each training the same model on the trainer's own loop. Every worker builds its model and warms
up, then waits; all start their timed steps together on one signal, so the aggregate rate is the images of all
workers over the common wall-clock window (first start to last finish), not a sum of rates measured at different
times. Sharing pays when the aggregate grows with k (one trial leaves the GPU idle between small kernels); it
thrashes when the aggregate falls.

Without CUDA it says so and exits 0: there is nothing to share. ``--device cpu`` runs the same protocol on CPU cores
at reduced size (one thread per worker), to check the script itself.

Usage: ``python -m benchmarks.gpu_sharing [--model sa_quadratic_9] [--counts 1,2,4] [--steps 100]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

GO = "go"
REPO_ROOT = Path(__file__).resolve().parents[1]  # workers run ``-m benchmarks.gpu_sharing`` from here


@dataclass(frozen=True)
class WorkerResult:
    images: int
    started: float  # time.monotonic(): one clock for every process of the machine
    finished: float
    peak_mib: float | None

    @property
    def images_per_s(self) -> float:
        return self.images / (self.finished - self.started)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.common import make_parser, positive_int, positive_ints

    parser = make_parser("gpu_sharing", __doc__.split("\n\n")[0], epilog="See the module docstring.")
    parser.add_argument("--model", default="sa_quadratic_9", help="variant of the paper's sweep")
    parser.add_argument("--counts", type=positive_ints, default="1,2,4", help="numbers of processes sharing the device")
    parser.add_argument("--steps", type=positive_int, default=100, help="timed training steps per process")
    parser.add_argument("--batch-size", type=positive_int, default=100)
    parser.add_argument("--no-amp", action="store_true", help="fp32 instead of bf16 autocast")
    parser.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="auto: CUDA, or skip without one; cpu: reduced-size check of the script",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from pipeline.config import PAPER_VARIANTS

    if args.model not in PAPER_VARIANTS:
        parser.error(f"--model {args.model!r} is not a variant of the sweep; valid: {list(PAPER_VARIANTS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but no CUDA device is available")
    return args


def worker(args: argparse.Namespace) -> None:
    """One trial-like process: build and warm up, say ready, wait for the signal, train ``--steps`` steps, report."""
    from benchmarks.common import REDUCED_MODEL, synthetic_device_data
    from pipeline.config import PAPER_VARIANTS, ModelConfig, TrainConfig
    from pipeline.measure.speed import peak_memory_bytes, reset_peak_memory
    from pipeline.models import build_model
    from pipeline.trial.checkpoint import Trial
    from pipeline.trial.loop import build_optimizer, build_scheduler, train_one_epoch

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # workers share the cores as trials with resources.cpu = 1 do
    amp = None if args.no_amp or device.type == "cpu" else torch.bfloat16
    cfg = TrainConfig(batch_size=args.batch_size, epochs=1)
    base = ModelConfig(**REDUCED_MODEL) if device.type == "cpu" else ModelConfig()
    model = build_model(PAPER_VARIANTS[args.model].apply(base)).to(device)
    optimizer = build_optimizer(model, cfg)
    generator = torch.Generator().manual_seed(0)
    trial = Trial(model, optimizer, build_scheduler(optimizer, cfg, args.steps + 2), generator)

    train_one_epoch(trial, synthetic_device_data(device, 2 * args.batch_size, 1, generator), cfg, amp)  # warm-up
    timed = synthetic_device_data(device, args.steps * args.batch_size, 1, generator)
    reset_peak_memory(device)
    print(json.dumps({"ready": True}), flush=True)
    if sys.stdin.readline().strip() != GO:
        raise SystemExit("worker: no start signal")
    started = time.monotonic()
    train_one_epoch(trial, timed, cfg, amp)  # ends with .item(): synchronised
    finished = time.monotonic()
    peak = peak_memory_bytes(device)
    result = WorkerResult(args.steps * args.batch_size, started, finished, None if peak is None else peak / 2**20)
    print(json.dumps(result.__dict__), flush=True)


def run(count: int, args: argparse.Namespace) -> list[WorkerResult]:
    """Start ``count`` workers, release them together once all are warm, collect their results."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.gpu_sharing",
        "--worker",
        "--model",
        args.model,
        "--device",
        args.device,
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
    ]
    command += ["--no-amp"] if args.no_amp else []
    processes = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
        for _ in range(count)
    ]
    try:
        for process in processes:
            line = process.stdout.readline()
            if not line or not json.loads(line).get("ready"):
                raise RuntimeError(f"a worker failed before it was ready (exit {process.wait()})")
        for process in processes:
            process.stdin.write(GO + "\n")
            process.stdin.flush()
        results = []
        for process in processes:
            out, _ = process.communicate()
            if process.returncode != 0:
                raise RuntimeError(f"a worker failed (exit {process.returncode})")
            results.append(WorkerResult(**json.loads(out.strip().splitlines()[-1])))
        return results
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def aggregate_images_per_s(results: list[WorkerResult]) -> float:
    """All workers' images over the common window, first start to last finish."""
    window = max(r.finished for r in results) - min(r.started for r in results)
    return sum(r.images for r in results) / window


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.device == "auto":
        if not torch.cuda.is_available():
            print(
                "gpu_sharing: no CUDA device here, so there is no GPU to share; skipped (run it on a GPU machine, "
                "or --device cpu to check the script at reduced size)."
            )
            return 0
        args.device = "cuda"
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (REDUCED SIZE, 1 thread per worker)"
    print(f"device: {name}; model {args.model}, batch {args.batch_size}, {args.steps} timed steps per worker")
    print("workers warm up, then start together; aggregate = all images / (last finish - first start)")
    baseline = f"vs {args.counts[0]}"
    header = (
        f"{'processes':>9} {'img/s each (min..max)':>22} {'aggregate img/s':>15} {baseline:>6} {'peak MiB each':>13}"
    )
    print(header)
    print("-" * len(header))
    single = None
    for count in args.counts:
        results = run(count, args)
        rates = [r.images_per_s for r in results]
        total = aggregate_images_per_s(results)
        single = single or total
        peaks = [r.peak_mib for r in results if r.peak_mib is not None]
        memory = f"{max(peaks):.0f}" if peaks else "-"
        print(
            f"{count:>9} {min(rates):>10.0f}..{max(rates):<11.0f} {total:>15.0f} {total / single:>5.2f}x {memory:>13}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
