"""Overhead of running trials through Ray Tune + MLflow instead of calling run_trial directly.

Runs the smoke sweep (params.yaml shrunk by the options below) in a scratch directory with a local Ray and an sqlite
MLflow store, then prints:
  wall / trials   the sweep's wall time (Tuner.fit, Ray start excluded and shown apart) divided by the sum of the
                  trials' own time (Ray's time_total_s: epochs, evaluation, checkpoint writes), with
                  --concurrency 1 so the two are comparable; target <= 1.3 at smoke scale (1.25 measured)
  MLflow calls    requests the driver-side callback makes per epoch result (target: 1, one log_batch)

When Ray is already initialised in the calling process (the test session's), the sweep uses it and the Ray start is
not measured. Usage: ``python -m benchmarks.sweep_overhead [--epochs 16] [--help]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from pipeline.sweep.session import keep_local_ray_on_loopback

keep_local_ray_on_loopback()  # before pipeline.sweep.preflight imports Ray

from benchmarks.common import bad_input_is_a_usage_error, make_parser, positive_int  # noqa: E402
from pipeline.config import load_params, parse_params  # noqa: E402
from pipeline.data.sources import prepare_dataset  # noqa: E402
from pipeline.sweep.preflight import preflight  # noqa: E402
from pipeline.sweep.run import run_sweep  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("sweep_overhead", __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--params", type=Path, default=ROOT / "params.yaml", help="params file to shrink (default: %(default)s)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["sa_quadratic_9", "resnet18"],
        help="variants of the params file to sweep, one trial each (default: %(default)s)",
    )
    parser.add_argument("--epochs", type=positive_int, default=4, help="epochs per trial (default: %(default)s)")
    parser.add_argument(
        "--concurrency", type=positive_int, default=1, help="max concurrent trials (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    # Every check, and the data, before Ray starts: bad input ends in parser.error (exit code 2), not in a traceback.
    with bad_input_is_a_usage_error(parser):
        raw = load_params(args.params).model_dump(mode="json")
    unknown = [name for name in args.variants if name not in raw["variants"]]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; defined in {args.params}: {sorted(raw['variants'])}")
    raw["train"]["epochs"] = args.epochs
    raw["sweep"].update(variants=args.variants, seeds=[0], max_concurrent_trials=args.concurrency, ray_address=None)
    raw["tracking"]["uri"] = None
    with bad_input_is_a_usage_error(parser):
        params = parse_params(raw, "benchmark params")
        preflight(params, ROOT)  # resources, storage, tracking: what the sweep would otherwise find after Ray starts
        data = prepare_dataset(params.data, ROOT)
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as tmp:
        root = Path(tmp)
        import ray

        own_ray = not ray.is_initialized()
        started = time.perf_counter()
        if own_ray:
            ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
        ray_start = time.perf_counter() - started
        try:
            started = time.perf_counter()
            outcome = run_sweep(params, data, root)
            wall = time.perf_counter() - started
        finally:
            if own_ray:
                ray.shutdown()
        trial_seconds = 0.0
        for result_file in outcome.path.local.glob("*/result.json"):
            last = result_file.read_text().strip().splitlines()[-1]
            trial_seconds += json.loads(last)["time_total_s"]
    epochs = sum(t.epochs_completed for t in outcome.records)
    print(f"trials: {len(outcome.records)} x {args.epochs} epochs, concurrency {args.concurrency}")
    print(f"ray start: {ray_start:.1f} s (not counted)" if own_ray else "ray: the Ray already running in this process")
    print(f"sweep wall time: {wall:.1f} s; sum of trials' own time: {trial_seconds:.1f} s")
    if args.concurrency == 1 and trial_seconds > 0:
        print(f"overhead ratio wall / trials: {wall / trial_seconds:.2f} (target <= 1.3)")
    calls = outcome.calls
    if outcome.epochs_logged:
        # each run also logs its params (one batch) and its end's and checkpoint's tags (one batch)
        per_epoch = calls.get("log_batch", 0) - len(outcome.records) * 2
        print(f"MLflow requests per epoch: {per_epoch / outcome.epochs_logged:.2f} (log_batch, {epochs} epochs)")
        print(f"MLflow requests per trial, all: {sum(calls.values()) / len(outcome.records):.1f} {dict(calls)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
