"""Trials sharing one GPU: 1 vs 2 vs 4 training processes at once, as Ray runs fractional-GPU trials.

Ray gives a trial with ``resources: {gpu: 0.5}`` the same device as its neighbour and nothing more: no memory cap, no
time slicing of its own. This script starts k = 1, 2, 4 independent worker processes (a fresh interpreter each, as
Ray workers are), each training the same model for a fixed number of steps on the trainer's own loop, and prints per
process and aggregate images/s and each process's peak memory. Sharing pays when the aggregate grows with k (one
trial leaves the GPU idle between small kernels); it thrashes when the aggregate falls. Without CUDA it says so and
exits 0: there is nothing to share.

Usage: ``python -m benchmarks.gpu_sharing [--model sa_quadratic_9] [--counts 1,2,4] [--steps 100]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="sa_quadratic_9", help="variant of the paper's sweep")
    parser.add_argument("--counts", default="1,2,4", help="numbers of processes sharing the GPU")
    parser.add_argument("--steps", type=int, default=100, help="timed training steps per process")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--no-amp", action="store_true", help="fp32 instead of bf16 autocast")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def worker(args: argparse.Namespace) -> None:
    """One trial-like process: warm up, then train ``--steps`` steps; prints one JSON line."""
    from pipeline.config import PAPER_VARIANTS, ModelConfig, TrainConfig
    from pipeline.models import build_model
    from pipeline.train import DeviceData, Trial, build_optimizer, build_scheduler, train_one_epoch

    device = torch.device("cuda")
    amp = None if args.no_amp else torch.bfloat16
    cfg = TrainConfig(batch_size=args.batch_size, epochs=1)
    model_cfg = PAPER_VARIANTS[args.model].apply(ModelConfig())
    model = build_model(model_cfg).to(device)
    optimizer = build_optimizer(model, cfg)
    generator = torch.Generator().manual_seed(0)
    trial = Trial(model, optimizer, build_scheduler(optimizer, cfg, args.steps), generator)

    def data(n: int) -> DeviceData:
        images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=generator).to(device)
        labels = torch.randint(0, 10, (n,), generator=generator).to(device)
        stats = torch.full((1, 3, 1, 1), 0.5, device=device)
        return DeviceData(images, labels, images[:1], labels[:1], stats, stats)

    train_one_epoch(trial, data(2 * args.batch_size), cfg, amp)  # warm-up
    timed = data(args.steps * args.batch_size)
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    train_one_epoch(trial, timed, cfg, amp)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device)
    print(json.dumps({"images_per_s": args.steps * args.batch_size / seconds, "peak_mib": peak / 2**20}))


def run(count: int, args: argparse.Namespace) -> list[dict]:
    command = [sys.executable, "-m", "benchmarks.gpu_sharing", "--worker", "--model", args.model]
    command += ["--steps", str(args.steps), "--batch-size", str(args.batch_size)] + (
        ["--no-amp"] if args.no_amp else []
    )
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    results = []
    for process in processes:
        out, _ = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"a worker failed (exit {process.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if not torch.cuda.is_available():
        print("gpu_sharing: no CUDA device here, so there is no GPU to share; skipped (run it on a GPU machine).")
        return 0
    print(f"device: {torch.cuda.get_device_name()}; model {args.model}, batch {args.batch_size}, {args.steps} steps")
    print("workers start together; warm-up overlaps imperfectly, so per-process rates are averages over the run")
    print(f"{'processes':>9} {'img/s each (min..max)':>22} {'aggregate img/s':>15} {'vs 1':>6} {'peak MiB each':>13}")
    single = None
    for count in (int(c) for c in args.counts.split(",")):
        results = run(count, args)
        rates = [r["images_per_s"] for r in results]
        total = sum(rates)
        single = single or total
        print(
            f"{count:>9} {min(rates):>10.0f}..{max(rates):<11.0f} {total:>15.0f} {total / single:>5.2f}x "
            f"{max(r['peak_mib'] for r in results):>13.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
