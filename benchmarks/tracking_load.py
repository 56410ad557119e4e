"""Load on one tracking server: the writes of many concurrent trials through the sweep's own logging path.

Starts one real ``mlflow server --workers 1`` (``pipeline.sweep.tracking.server``) on a scratch sqlite store, and a
local Ray (or uses the one this process already has), then runs --trials trials, --concurrent at a time, through a
Tuner whose MLflow writes go through the sweep's callback (``MlflowTrialCallback``, its short-budget client and
outage buffer), as the tune stage's do: a run per trial, a ``log_batch`` of the sweep's metrics per epoch, tags and
the run's end. The trials train nothing (each reports --epochs epochs, --epoch-s apart): what is measured is the
driver and the server. Then it checks, from the server, that no write was lost: every trial's run FINISHED and
tagged finished, every epoch's metrics logged exactly once at its step, the outage buffer empty (a write the server
did not take in time is buffered and replayed, and counted here).
Prints: requests by method; sustained writes/s (the callback's requests over the sweep's wall time) and epochs
logged/s; how many writes went through the buffer; this process's CPU seconds. Exit code 1 when a check fails.
Usage: ``python -m benchmarks.tracking_load [--trials 200] [--epochs 20] [--concurrent 12] [--epoch-s 0.05]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pipeline.sweep.session import keep_local_ray_on_loopback

keep_local_ray_on_loopback()  # before Ray is imported

from benchmarks.common import make_parser, positive_int, progress  # noqa: E402
from pipeline.sweep.tracking.callback import MlflowTrialCallback, TrialInfo  # noqa: E402
from pipeline.sweep.tracking.epochs import EPOCH_METRICS  # noqa: E402
from pipeline.sweep.tracking.server import MlflowServer  # noqa: E402

EXPERIMENT = "tracking-load"


def fast_trial(config: dict[str, Any]) -> None:
    """A trial that trains nothing: ``epochs`` reports of the sweep's metrics, ``epoch_s`` apart."""
    from ray import tune

    for epoch in range(1, config["epochs"] + 1):
        time.sleep(config["epoch_s"])
        loss = 2.3 / epoch
        tune.report({"epoch": epoch, **{key: loss for key in EPOCH_METRICS}})


def describe(config: dict) -> TrialInfo:
    """The run of trial ``index``: its name and the params a sweep's run has (a handful)."""
    index = config["index"]
    return TrialInfo(f"load-{index}", {"index": str(index), "epochs": str(config["epochs"])}, {"seed": str(index)})


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def sweep(server: MlflowServer, root: Path, args: argparse.Namespace) -> tuple[MlflowTrialCallback, float, float]:
    """The trials through a Tuner with the callback; the callback, the sweep's wall and this process's CPU seconds."""
    import ray
    from ray import tune

    from pipeline.sweep.tracking.parent import ParentRun
    from pipeline.sweep.tracking.store import ensure_experiment, mlflow_client

    client = mlflow_client(server.uri)
    experiment_id = ensure_experiment(client, EXPERIMENT, None)
    parent = ParentRun(server.uri, experiment_id, client.create_run(experiment_id, run_name="load").info.run_id)
    callback = MlflowTrialCallback(parent, describe, {}, args.epochs, buffer_dir=root / "driver")
    cpus = ray.cluster_resources().get("CPU", 1.0)
    space = {"index": tune.grid_search(list(range(args.trials))), "epochs": args.epochs, "epoch_s": args.epoch_s}
    tuner = tune.Tuner(
        tune.with_resources(fast_trial, {"cpu": cpus / args.concurrent}),  # --concurrent fit on any Ray
        param_space=space,
        tune_config=tune.TuneConfig(max_concurrent_trials=args.concurrent, reuse_actors=True),
        run_config=tune.RunConfig(name="load", storage_path=str(root / "ray"), callbacks=[callback], verbose=0),
    )
    wall, cpu = time.perf_counter(), time.process_time()
    results = tuner.fit()
    flushed = callback.buffer.wait_flushed(60)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if results.errors:
        raise RuntimeError(f"a trial failed: {results.errors[0]}")
    if not flushed:
        raise RuntimeError(f"{callback.buffer.pending} write(s) still buffered in {callback.buffer.path}")
    client.set_terminated(parent.parent_run_id, "FINISHED")
    return callback, wall, cpu


def check(callback: MlflowTrialCallback, trials: int, epochs: int) -> list[str]:
    """What the server holds against what the trials reported: one problem a line (none: nothing lost or twice)."""
    from pipeline.sweep.tracking.store import child_runs, mlflow_client

    parent = callback.parent
    runs = child_runs(parent.tracking_uri, parent.experiment_id, parent.parent_run_id)
    client = mlflow_client(parent.tracking_uri)
    problems = [] if len(runs) == trials else [f"{len(runs)} runs for {trials} trials"]
    expected = list(range(1, epochs + 1))
    for trial_id, run in sorted(runs.items()):
        if run.info.status != "FINISHED" or run.data.tags.get("tune.status") != "finished":
            problems.append(
                f"{trial_id}: run {run.info.run_id} is {run.info.status}, {run.data.tags.get('tune.status')}"
            )
        for key in ("test_acc", "train_loss"):  # the first and the last of a batch
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            if steps != expected:
                problems.append(f"{trial_id}: {key} logged at steps {steps}, expected each of 1..{epochs} once")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("tracking_load", __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=positive_int, default=200, help="trials (default: %(default)s)")
    parser.add_argument("--epochs", type=positive_int, default=20, help="epochs per trial (default: %(default)s)")
    parser.add_argument("--concurrent", type=positive_int, default=12, help="trials at a time (default: %(default)s)")
    parser.add_argument(
        "--epoch-s", type=non_negative_float, default=0.05, help="seconds per epoch (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import ray

    with tempfile.TemporaryDirectory(prefix="tracking-load-") as tmp:
        root = Path(tmp)
        server = MlflowServer(root / "server")
        own_ray = not ray.is_initialized()  # else the Ray of the calling process (the test session's)
        progress("starting mlflow server --workers 1" + (" and a local Ray" if own_ray else ""))
        try:
            server.start()
            if own_ray:
                ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
            progress(f"{args.trials} trials x {args.epochs} epochs, {args.concurrent} at a time ...")
            callback, wall, cpu = sweep(server, root, args)
            progress("checking every run and epoch on the server ...")
            problems = check(callback, args.trials, args.epochs)
        finally:
            if own_ray:
                ray.shutdown()
            server.stop()
    calls: Counter = callback.calls
    requests = sum(calls.values())
    print(f"tracking load: {args.trials} trials x {args.epochs} epochs, {args.concurrent} at a time, one mlflow server")
    print(f"requests: {requests} ({', '.join(f'{name} {n}' for name, n in sorted(calls.items()))})")
    print(f"sustained writes/s: {requests / wall:.1f} ({requests} requests in {wall:.1f} s wall)")
    print(f"epochs logged/s: {callback.epoch_writes.count / wall:.1f} ({callback.epoch_writes.count} epochs)")
    print(f"driver CPU: {cpu:.1f} s ({cpu / max(callback.epoch_writes.count, 1) * 1000:.1f} ms per epoch)")
    print(f"writes the server did not take in time: {callback.buffer.appended} (buffered, then replayed)")
    if problems:
        print(f"LOST OR DUPLICATED: {len(problems)} problem(s)")
        print("\n".join(problems[:20]))
        return 1
    print(f"checked: {args.trials} runs FINISHED, every epoch logged exactly once, no write lost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
