"""Our driver at a lab's scale: N short real trials through the tune stage's own path, and through bare Ray Tune.

    python -m benchmarks.sweep_at_scale [--trials 1000] [--sizes 100,300] [--epochs 5] [--concurrency 2] [--server]
        [--checkpoint-interval-s S]

N trials (``sweep.seeds`` 0..N-1 of one small variant, a few epochs of real training each) run twice per size, in
one Ray session: through ``pipeline.sweep.run.run_sweep`` and the manifest, exactly what ``python -m stages.tune``
runs (parent and child runs, claims, our callback's MLflow writes on its writer thread), and through a bare
``tune.Tuner`` of the same trainable with the same resources, actor reuse and checkpointing, and no callback and no
MLflow. Overhead = wall time over the ideal, the trials' own time (Tune's ``time_total_s``) / concurrency, minus 1.
The highest public figure for this stack is Ray Tune's own table: 10,000 one-second trials at 14 % overhead.

Per size it prints both overheads, driver CPU seconds per trial (flat from size to size = linear), MLflow requests per
trial by method (our client's; through a server also every HTTP request the driver made, by endpoint: MLflow's own
model logging included), the tracking server's CPU per trial (``--server``: a real ``mlflow server``; otherwise sqlite
in the driver, counted in its CPU), the driver's peak RSS and the metric rows each trial's run holds; the last line is
``overhead: X % (ours), Y % (bare Ray Tune)`` at the largest size, then ``wall ratio to bare Ray Tune: R`` (our wall
time over bare Tune's for the same trials) and each way's CPU seconds per trial; with several sizes, each way's driver
CPU seconds per trial added from the smallest size to the largest (the slope: per trial it falls with the size as the
start-up spreads, the same for bare Tune). Each size uses a fresh store and Ray folder.

``--checkpoint-interval-s`` sets ``sweep.checkpoint_interval_s`` for both ways: at 0 (every epoch) each trial's
second checkpoint makes Ray Tune snapshot the whole experiment, which grows Tune's own driver CPU per trial with the
trial count; at more than a trial's length a trial checkpoints once, after its last epoch. At the default, ``auto``,
both ways use the interval the tune stage chooses for the size (``SweepConfig.checkpoint_interval``: 0 below about 170
trials at 2 at a time, 6 s at 1000).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.sweep.session import keep_local_ray_on_loopback

keep_local_ray_on_loopback()  # before anything imports Ray

from benchmarks.common import (  # noqa: E402
    bad_input_is_a_usage_error,
    lab_store_uri,
    make_parser,
    positive_int,
    positive_ints,
    progress,
    text_table,
)
from pipeline.config import Params, load_params, parse_params  # noqa: E402
from pipeline.data.prepared import PreparedData  # noqa: E402
from pipeline.data.sources import prepare_dataset  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VARIANT = "resnet18"  # the cheapest model of the default study per epoch on the embedded data
NUMERIC = {
    "trials",
    "overhead %",
    "trial s",
    "wall s",
    "driver CPU s/trial",
    "requests/trial",
    "HTTP/trial",
    "server CPU s/trial",
}


@dataclass
class Side:
    """One way of running one size: what it took and what it wrote."""

    way: str
    trials: int
    wall_s: float
    trial_s: float  # sum of the trials' own time (Tune's time_total_s)
    driver_cpu_s: float
    peak_rss_mib: float
    requests: dict[str, int] = field(default_factory=dict)
    http: Counter = field(default_factory=Counter)  # every HTTP request to the tracking server, by endpoint
    server_cpu_s: float | None = None
    metric_rows_per_trial: float | None = None

    def overhead(self, concurrency: int) -> float:
        return self.wall_s / (self.trial_s / concurrency) - 1


def scaled_params(
    base: Params,
    trials: int,
    epochs: int,
    concurrency: int,
    tracking_uri: str | None,
    checkpoint_interval_s: float | None = None,
) -> Params:
    """``base`` with one variant x ``trials`` seeds, ``epochs`` each, at ``concurrency`` (and its checkpoint interval,
    unless given); system metrics off (a sampling thread per trial is a cost of its own, not measured here)."""
    raw = base.model_dump(mode="json")
    raw["train"]["epochs"] = epochs
    if checkpoint_interval_s is not None:
        raw["sweep"]["checkpoint_interval_s"] = checkpoint_interval_s
    raw["sweep"].update(
        variants=[VARIANT], seeds=list(range(trials)), max_concurrent_trials=concurrency, ray_address=None, retrain=True
    )
    raw["sweep"]["asha"]["enabled"] = False
    raw["tracking"].update(uri=tracking_uri, system_metrics=False)
    return parse_params(raw, "sweep_at_scale params")


def run_ours(params: Params, data: PreparedData, root: Path) -> tuple[Side, object]:
    """The tune stage's path: ``run_sweep`` (plan, claims, parent and child runs, callback, its writer thread) and the
    manifest it writes."""
    from pipeline.sweep.manifest import write_tune_manifest
    from pipeline.sweep.run import run_sweep, tune_manifest

    cpu, started = time.process_time(), time.perf_counter()
    with counting_http() as http:
        outcome = run_sweep(params, data, root)
    write_tune_manifest(root / "manifest.json", tune_manifest(outcome), root)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    side = Side("ours", len(outcome.records), wall, _trial_seconds(outcome.path.local), cpu, _peak_rss_mib())
    side.requests, side.http = dict(outcome.calls), http
    return side, outcome


@contextmanager
def counting_http() -> Iterator[Counter]:
    """Every request MLflow's REST client makes in this process meanwhile (any thread), by method and endpoint (ids
    left out): MLflow's ``http_request`` wherever a loaded module imported it (its REST store, its artifact
    repository for uploads, our short-budget store)."""
    import re
    import sys

    import mlflow.store.artifact.http_artifact_repo  # noqa: F401 (loaded now, so its import of http_request is patched)
    import mlflow.utils.rest_utils as rest

    calls: Counter = Counter()
    real = rest.http_request

    def counted(host_creds: object, endpoint: str, method: str, *args: object, **kwargs: object) -> object:
        if "/api/" in endpoint:
            path = re.sub(r"/m-[0-9a-f]+$", "/<id>", endpoint.split("/mlflow/", 1)[-1])
        else:  # an upload: the artifact repository's host is the run's (or logged model's) artifact root
            path = "artifact " + endpoint.lstrip("/")
        calls[f"{method} {path}"] += 1
        return real(host_creds, endpoint, method, *args, **kwargs)

    users = [m for m in list(sys.modules.values()) if getattr(m, "http_request", None) is real]
    for module in users:
        module.http_request = counted
    try:
        yield calls
    finally:
        for module in users:
            module.http_request = real


def run_bare(params: Params, data: PreparedData, root: Path) -> Side:
    """The same trials through a bare ``tune.Tuner``: same trainable, resources, actor reuse and checkpointing; no
    callback, no MLflow."""
    from ray import tune

    from pipeline.sweep.identity import trial_codes
    from pipeline.trial.trainable import train_trial

    params_json = params.model_dump(mode="json")  # with the interval the tune stage resolves for these trials
    params_json["sweep"]["checkpoint_interval_s"] = params.sweep.checkpoint_interval(len(params.sweep.seeds))
    trainable = tune.with_parameters(
        train_trial,
        data=data,
        params_json=params_json,
        code_version=trial_codes(params, [VARIANT]),
    )
    resources = {"cpu": params.sweep.resources.cpu, "gpu": params.sweep.resources.gpu}
    tuner = tune.Tuner(
        tune.with_resources(trainable, resources),
        param_space={"variant": VARIANT, "seed": tune.grid_search(params.sweep.seeds)},
        tune_config=tune.TuneConfig(max_concurrent_trials=params.sweep.max_concurrent_trials, reuse_actors=True),
        run_config=tune.RunConfig(
            name="bare",
            storage_path=str(root / "ray"),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            failure_config=tune.FailureConfig(max_failures=params.sweep.max_failures),
        ),
    )
    cpu, started = time.process_time(), time.perf_counter()
    results = tuner.fit()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    errors = [r.error for r in results if r.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} bare trial(s) failed: {errors[0]}")
    return Side("bare Ray Tune", len(results), wall, _trial_seconds(root / "ray" / "bare"), cpu, _peak_rss_mib())


def _trial_seconds(experiment: Path) -> float:
    """Sum of the trials' own time: the last ``time_total_s`` in each trial folder's result.json."""
    total = 0.0
    for result_file in experiment.glob("*/result.json"):
        lines = result_file.read_text().strip().splitlines()
        if lines:
            total += json.loads(lines[-1])["time_total_s"]
    return total


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def metric_rows_per_trial(database: Path, parent_run_id: str) -> float:
    """Rows of MLflow's metric table (every logged point) per child run of the sweep, read from the sqlite file."""
    with sqlite3.connect(database) as db:
        (runs,) = db.execute(
            "SELECT COUNT(*) FROM tags WHERE key = 'mlflow.parentRunId' AND value = ?", (parent_run_id,)
        ).fetchone()
        (rows,) = db.execute(
            "SELECT COUNT(*) FROM metrics WHERE run_uuid IN "
            "(SELECT run_uuid FROM tags WHERE key = 'mlflow.parentRunId' AND value = ?)",
            (parent_run_id,),
        ).fetchone()
    return rows / runs if runs else float("nan")


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (the server and its uvicorn worker)."""
    import psutil

    process = psutil.Process(pid)
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def measure_size(args: argparse.Namespace, base: Params, data: PreparedData, trials: int) -> list[Side]:
    """Both ways at one size, each with a fresh Ray folder and, unless ``--lab-store`` names a running one, a fresh
    store (and server)."""
    from pipeline.sweep.tracking.server import MlflowServer

    sides = []
    with tempfile.TemporaryDirectory(prefix="sweep-at-scale-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        database, server_pid = None, None
        if args.lab_store:  # examples/lab_store.sh's store: PostgreSQL + a bucket, its server's pid in its folder
            uri, server_pid = args.lab_store_uri, int((args.lab_store / "mlflow.pid").read_text())
        elif args.server:
            server = MlflowServer(root / "server")
            server.start()
            stack.callback(server.stop)
            uri, database, server_pid = server.uri, server.database, server.process.pid
        else:
            database = root / "mlflow.db"
            uri = f"sqlite:///{database}"
        params = scaled_params(base, trials, args.epochs, args.concurrency, uri, args.checkpoint_interval_s)
        progress(f"sweep_at_scale: {trials} trials through our driver ...")
        server_cpu = process_tree_cpu_s(server_pid) if server_pid else None
        ours, outcome = run_ours(params, data, root / "ours")
        if server_pid:
            ours.server_cpu_s = process_tree_cpu_s(server_pid) - server_cpu
        if database is not None:
            ours.metric_rows_per_trial = metric_rows_per_trial(database, outcome.parent.parent_run_id)
        sides.append(ours)
        progress(f"sweep_at_scale: {trials} trials through bare Ray Tune ...")
        sides.append(run_bare(params, data, root / "bare"))
    for side in sides:  # a long run's figures as each size ends, not only in the table at the very end
        progress(
            f"sweep_at_scale: {trials} trials, {side.way}: "
            + ", ".join(f"{k} {v}" for k, v in row(side, args.concurrency).items() if k not in ("trials", "way"))
        )
    return sides


def row(side: Side, concurrency: int) -> dict[str, str]:
    requests = sum(side.requests.values())
    return {
        "trials": str(side.trials),
        "way": side.way,
        "overhead %": f"{100 * side.overhead(concurrency):.1f}",
        "trial s": f"{side.trial_s:.1f}",
        "wall s": f"{side.wall_s:.1f}",
        "driver CPU s/trial": f"{side.driver_cpu_s / side.trials:.3f}",
        "requests/trial": f"{requests / side.trials:.2f}" if side.requests else "-",
        "HTTP/trial": f"{sum(side.http.values()) / side.trials:.2f}" if side.http else "-",
        "server CPU s/trial": "-" if side.server_cpu_s is None else f"{side.server_cpu_s / side.trials:.3f}",
        "peak RSS MiB": f"{side.peak_rss_mib:.0f}",
        "metric rows/trial": "-" if side.metric_rows_per_trial is None else f"{side.metric_rows_per_trial:.0f}",
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser("sweep_at_scale", __doc__.split("\n\n")[0], epilog="See the module docstring.")
    parser.add_argument("--trials", type=positive_int, default=1000, help="the largest size (default: %(default)s)")
    parser.add_argument(
        "--sizes", type=positive_ints, default=[], help="smaller sizes measured first, comma-separated (e.g. 100,300)"
    )
    # 5: 1.1-1.9 s of work per trial on the 2-core machines here (1.1-1.5 s under bare Tune, longer under ours, whose
    # store shares the cores), near the "about two seconds" the overhead target was set for; the overhead is a cost per
    # trial, so shorter trials show a larger share of it (2 epochs: 0.6-0.8 s under bare Tune).
    parser.add_argument("--epochs", type=positive_int, default=5, help="epochs per trial (default: %(default)s)")
    parser.add_argument("--concurrency", type=positive_int, default=2, help="trials at once (default: %(default)s)")
    parser.add_argument("--server", action="store_true", help="track through a real mlflow server (its CPU counted)")
    parser.add_argument(
        "--checkpoint-interval-s",
        type=float,
        metavar="S",
        help="sweep.checkpoint_interval_s for both ways (default: the params file's); 0: a checkpoint every epoch",
    )
    parser.add_argument(
        "--lab-store",
        type=Path,
        metavar="DIR",
        help="track through the running store that 'examples/lab_store.sh start DIR ...' started (PostgreSQL + a "
        "bucket; its server's CPU counted); every size then shares it",
    )
    parser.add_argument(
        "--params", type=Path, default=ROOT / "params.yaml", help="params file to scale (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if args.lab_store is not None:
        args.lab_store_uri = lab_store_uri(parser, args.lab_store)
    if any(size >= args.trials for size in args.sizes):
        parser.error(f"--sizes must be smaller than --trials {args.trials}, got {args.sizes}")
    with bad_input_is_a_usage_error(parser):
        args.base = load_params(args.params)
        if VARIANT not in args.base.variants:
            raise ValueError(f"{args.params}: no variant {VARIANT!r} to run at scale")
        scaled = scaled_params(args.base, args.trials, args.epochs, args.concurrency, None, args.checkpoint_interval_s)
        args.checkpoint_interval_s = scaled.sweep.checkpoint_interval_s  # validated (>= 0 or auto), or the file's
    return args


def _interval(args: argparse.Namespace) -> str:
    """The interval as given, and as the sweep resolves ``auto`` at each size."""
    given, sizes = args.checkpoint_interval_s, [*sorted(args.sizes), args.trials]
    if given != "auto":
        return "epoch" if given == 0 else f"{given:g} s at most (and after the last epoch)"
    sweep = scaled_params(args.base, 1, args.epochs, args.concurrency, None).sweep
    chosen = ", ".join(f"{sweep.checkpoint_interval(n):g} s at {n} trials" for n in sizes)
    return f"sweep.checkpoint_interval_s auto: {chosen} (0: every epoch)"


def _store(args: argparse.Namespace) -> str:
    if args.lab_store:
        return f"the lab store at {args.lab_store_uri} (PostgreSQL + bucket)"
    return "mlflow server (sqlite)" if args.server else "sqlite store in the driver"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    data = prepare_dataset(args.base.data, args.params.resolve().parent)
    import ray

    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(
            address="local",
            num_cpus=args.concurrency,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
        )
    try:
        sides = [
            side for size in [*sorted(args.sizes), args.trials] for side in measure_size(args, args.base, data, size)
        ]
    finally:
        if own_ray:
            ray.shutdown()
    print(
        f"{VARIANT} x {args.epochs} epochs per trial, {args.concurrency} at a time, "
        f"{_store(args)}; a checkpoint every {_interval(args)}; ideal = trial s / concurrency"
    )
    print(text_table([row(s, args.concurrency) for s in sides], numeric=NUMERIC))
    for side in (s for s in sides if s.requests):
        print(f"{side.trials} trials, MLflow requests by method: {dict(sorted(side.requests.items()))}")
    for side in (s for s in sides if s.http):
        print(f"{side.trials} trials, HTTP requests by endpoint: {dict(side.http.most_common())}")
    ours, bare = sides[-2], sides[-1]
    print(
        f"overhead: {100 * ours.overhead(args.concurrency):.1f} % (ours), "
        f"{100 * bare.overhead(args.concurrency):.1f} % (bare Ray Tune)"
    )
    # The headline a user pays: each way's overhead above is over its own trials' time, and ours trains slower
    # (its tracking shares the cores), which that hides. The same trials, the same concurrency, one run.
    print(f"wall ratio to bare Ray Tune: {ours.wall_s / bare.wall_s:.2f}")
    server = "-" if ours.server_cpu_s is None else f"{ours.server_cpu_s / ours.trials:.3f}"
    print(
        f"CPU s per trial: our driver {ours.driver_cpu_s / ours.trials:.3f}, its tracking server {server}; "
        f"bare Ray Tune's driver {bare.driver_cpu_s / bare.trials:.3f}"
    )
    if len(sides) > 2:  # CPU per trial falls with the size by the start-up spread: the added trials' cost is the slope
        (small, small_bare), n = sides[:2], ours.trials - sides[0].trials
        print(
            f"driver CPU s per trial added from {small.trials} to {ours.trials} trials: ours "
            f"{(ours.driver_cpu_s - small.driver_cpu_s) / n:.3f}, bare Ray Tune "
            f"{(bare.driver_cpu_s - small_bare.driver_cpu_s) / n:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
