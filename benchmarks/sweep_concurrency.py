"""Hundreds of trials at once: our driver against bare Ray Tune at a lab's concurrency, on several Ray nodes.

    python -m benchmarks.sweep_concurrency [--concurrency 64] [--trials N] [--nodes 2] [--epochs 1]
        [--lab-store DIR]

A Ray cluster of ``--nodes`` nodes on this machine (``tests/cluster/local_cluster.py``: each node its own process,
token auth, all on 127.0.0.1) that declare ``--concurrency`` logical CPUs between them, so that many one-CPU trials
run at once whatever the cores. Its trials are trivial (ResNet18 at the params' width on the embedded digits for
``--epochs``: a few hundred milliseconds of work each) and run twice in one driver attached to the cluster: through
``pipeline.sweep.run.run_sweep``, the tune stage's own path (plan, claims, parent and child runs, the callback and its
writer thread, a checkpoint upload and a logged model per trial), into a lab's store (PostgreSQL + an ``mlflow
server`` whose artifacts go to an S3 bucket: ``examples/lab_store.sh``, started here on a local S3 server unless
``--lab-store`` names a running one); and through a bare ``tune.Tuner`` of the same trainable, resources and actor
reuse (``benchmarks.sweep_at_scale``'s two ways).

It prints, per way: wall time, trial ends per second the one driver sustained, driver CPU seconds per trial, the
peak memory of the cluster's processes (sum of PSS, and of RSS) and the machine's peak memory in use; for ours also
the server's CPU per trial and the writer thread's lag (per queued MLflow write, seconds from its queueing, when
Tune reported, to its end on the writer thread: max, p95 and median, and p95 over the first and the last half of the
writes: a lag that grows from one half to the other is a queue building up). Then ``wall ratio to bare Ray Tune:
R`` and the checks (exit 1 if one fails): every trial of both ways ended, and the store holds exactly one FINISHED
run per trial under the sweep's parent run.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pipeline.sweep.session import keep_local_ray_on_loopback

keep_local_ray_on_loopback()  # before anything imports Ray

from benchmarks.common import bad_input_is_a_usage_error, lab_store_uri, make_parser, positive_int, progress, text_table  # noqa: E402
from benchmarks.sweep_at_scale import (  # noqa: E402
    VARIANT,
    Side,
    process_tree_cpu_s,
    run_bare,
    run_ours,
    scaled_params,
)
from pipeline.config import Params, load_params  # noqa: E402
from pipeline.data.prepared import PreparedData  # noqa: E402
from pipeline.data.sources import prepare_dataset  # noqa: E402
from pipeline.sweep.manifest import FINISHED  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_EVERY_S = 1.0  # the memory sampler's period (in a process of its own: its CPU is not the driver's)
S3_START_S = 60


@dataclass
class Memory:
    """Peaks over a run, in MiB: the cluster's processes (nodes, raylets, Ray workers) and the machine in use."""

    pss_mib: float = 0.0  # sum of proportional set sizes: shared pages counted once in all
    rss_mib: float = 0.0  # sum of resident sets: shared pages counted in every process
    processes: int = 0
    machine_used_mib: float = 0.0  # total - available, every process of the machine (other users' too)


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def sample_memory(roots: list[int], connection: multiprocessing.connection.Connection) -> None:
    """In a process of its own: sample the trees under ``roots`` every ``SAMPLE_EVERY_S``; on "peak", send the peaks
    since the last one (``Memory``) and start again; on "stop", end."""
    import psutil

    peak = Memory()
    while True:
        processes = []
        for root in roots:
            with contextlib.suppress(psutil.NoSuchProcess):
                parent = psutil.Process(root)
                processes += [parent, *parent.children(recursive=True)]
        rss = pss = 0
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                rss += process.memory_info().rss
                pss += _pss_kib(process.pid) * 1024
        machine = psutil.virtual_memory()
        peak.pss_mib = max(peak.pss_mib, pss / 2**20)
        peak.rss_mib = max(peak.rss_mib, rss / 2**20)
        peak.processes = max(peak.processes, len(processes))
        peak.machine_used_mib = max(peak.machine_used_mib, (machine.total - machine.available) / 2**20)
        if connection.poll(SAMPLE_EVERY_S):
            message = connection.recv()
            if message == "stop":
                return
            connection.send(peak)
            peak = Memory()


class MemorySampler:
    """``sample_memory`` in a spawned process (a fork of a driver holding Ray's threads is unsafe)."""

    def __init__(self, roots: list[int]) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=sample_memory, args=(roots, child), daemon=True)
        self._process.start()

    def peak(self) -> Memory:
        """The peaks since the last call (or the start)."""
        self._connection.send("peak")
        return self._connection.recv()

    def stop(self) -> None:
        self._connection.send("stop")
        self._process.join(timeout=10)


@dataclass
class Lag:
    """The writer thread's lag over a run's writes, in seconds (``TrackingBuffer.write_lags_s``)."""

    writes: int
    max_s: float
    p95_s: float
    median_s: float
    first_half_p95_s: float
    last_half_p95_s: float

    @classmethod
    def of(cls, lags: list[float]) -> Lag:
        if not lags:
            return cls(0, *[float("nan")] * 5)
        half = len(lags) // 2 or 1
        return cls(len(lags), max(lags), _p95(lags), statistics.median(lags), _p95(lags[:half]), _p95(lags[half:]))


def _p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """A local S3-compatible server (moto's, the tests' bucket server) in a process of its own, on a free
    127.0.0.1 port: ``host:port``. Its CPU is not the driver's (in the driver it would be counted as ours)."""
    from pipeline.sweep.tracking.server import free_port

    port = free_port()
    command = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)]
    with tempfile.TemporaryFile() as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_answers(f"http://127.0.0.1:{port}/", process, log_file)
            yield f"127.0.0.1:{port}"
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_answers(url: str, process: subprocess.Popen, log_file: IO[bytes]) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + S3_START_S
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:  # it answers
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                log_file.seek(0)
                raise RuntimeError(f"moto_server did not start: {log_file.read()[-2000:]!r}") from None
            time.sleep(0.3)


@contextlib.contextmanager
def lab_store(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    """The tracking URI and the server's pid: the running store ``--lab-store`` names, else one started here
    (``examples/lab_store.sh`` through ``tests/lab_store.py``, artifacts to a new bucket of a local S3 server)."""
    if args.lab_store:
        yield args.lab_store_uri, int((args.lab_store / "mlflow.pid").read_text())
        return
    import pyarrow.fs as pafs

    from tests.lab_store import start_lab_store, stop_lab_store

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        os.environ.setdefault(key, value)  # what the local S3 server accepts; the server process inherits them
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    with s3_server() as endpoint:
        bucket = "sweep-concurrency"
        fs, _ = pafs.FileSystem.from_uri(
            f"s3://{bucket}/?endpoint_override={endpoint}&scheme=http&region=us-east-1&allow_bucket_creation=true"
        )
        fs.create_dir(bucket)
        store = start_lab_store(bucket, endpoint)
        try:
            yield store.uri, store.pids()["mlflow"]
        finally:
            stop_lab_store(store.home)


@contextlib.contextmanager
def ray_cluster(concurrency: int, nodes: int) -> Iterator[list[int]]:
    """``nodes`` Ray nodes declaring ``concurrency`` CPUs between them (the head the remainder), this process attached
    as their driver; the node processes' pids (the memory sampler's roots)."""
    from tests.cluster.local_cluster import start_cluster, stop_cluster

    share, rest = divmod(concurrency, nodes)
    cluster = start_cluster(cpus=share + rest, worker_cpus=[share] * (nodes - 1))
    try:
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(cluster.token_file)  # the driver sends the cluster's token
        import ray

        ray.init(address=cluster.address, log_to_driver=False)
        try:
            yield [node.process.pid for node in [cluster.head, cluster.worker, *cluster.extra] if node is not None]
        finally:
            ray.shutdown()
    finally:
        stop_cluster(cluster)


def check_runs(uri: str, parent_run_id: str, trials: int) -> list[str]:
    """What is wrong with the sweep's runs in the store: not exactly one FINISHED child run per seed."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    parent = client.get_run(parent_run_id)
    runs, token = [], None
    while True:
        page = client.search_runs(
            [parent.info.experiment_id],
            f"tags.mlflow.parentRunId = '{parent_run_id}'",
            max_results=1000,
            page_token=token,
        )
        runs += list(page)
        token = page.token
        if not token:
            break
    problems = []
    seeds = sorted(int(run.data.tags.get("seed", -1)) for run in runs)
    if seeds != list(range(trials)):
        problems.append(f"{len(runs)} child runs for {trials} trials (seeds {seeds[:5]}...)")
    unfinished = [run.info.run_id for run in runs if run.info.status != "FINISHED"]
    if unfinished:
        problems.append(f"{len(unfinished)} child run(s) not FINISHED")
    return problems


def measure(args: argparse.Namespace, data: PreparedData, root: Path) -> dict:
    """Both ways on one cluster and store; the figures and the problems found."""
    with lab_store(args) as (uri, server_pid), ray_cluster(args.concurrency, args.nodes) as node_pids:
        params = scaled_params(args.base, args.trials, args.epochs, args.concurrency, uri)
        sampler = MemorySampler(node_pids)
        try:
            sampler.peak()  # the idle cluster's peaks, dropped
            progress(f"sweep_concurrency: {args.trials} trials, {args.concurrency} at a time, through our driver ...")
            server_cpu = process_tree_cpu_s(server_pid)
            ours, outcome = run_ours(params, data, root / "ours")
            ours.server_cpu_s = process_tree_cpu_s(server_pid) - server_cpu
            ours_memory = sampler.peak()
            progress(f"sweep_concurrency: {args.trials} trials through bare Ray Tune ...")
            bare = run_bare(params, data, root / "bare")
            bare_memory = sampler.peak()
        finally:
            sampler.stop()
        problems = [f"ours: trial {r.trial_id} ended {r.status}" for r in outcome.records if r.status != FINISHED]
        problems += check_runs(uri, outcome.parent.parent_run_id, args.trials)
        if ours.trials != args.trials or bare.trials != args.trials:
            problems.append(f"{ours.trials} (ours) and {bare.trials} (bare) trials ran, not {args.trials}")
    return {
        "sides": [(ours, ours_memory), (bare, bare_memory)],
        "lag": Lag.of(list(outcome.write_lags_s)),
        "requests": dict(outcome.calls),
        "problems": problems,
    }


def row(side: Side, memory: Memory) -> dict[str, str]:
    return {
        "way": side.way,
        "trials": str(side.trials),
        "wall s": f"{side.wall_s:.1f}",
        "trial ends/s": f"{side.trials / side.wall_s:.2f}",
        "driver CPU s/trial": f"{side.driver_cpu_s / side.trials:.3f}",
        "server CPU s/trial": "-" if side.server_cpu_s is None else f"{side.server_cpu_s / side.trials:.3f}",
        "cluster PSS MiB": f"{memory.pss_mib:.0f}",
        "cluster RSS MiB": f"{memory.rss_mib:.0f}",
        "processes": str(memory.processes),
        "machine used MiB": f"{memory.machine_used_mib:.0f}",
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser("sweep_concurrency", __doc__.split("\n\n")[0], epilog="See the module docstring.")
    parser.add_argument("--concurrency", type=positive_int, default=64, help="trials at once (default: %(default)s)")
    parser.add_argument("--trials", type=positive_int, help="trials in all (default: 4 x --concurrency)")
    parser.add_argument(
        "--nodes", type=positive_int, default=2, help="Ray nodes sharing the CPUs (default: %(default)s)"
    )
    parser.add_argument("--epochs", type=positive_int, default=1, help="epochs per trial (default: %(default)s)")
    parser.add_argument(
        "--lab-store",
        type=Path,
        metavar="DIR",
        help="track through the running store that 'examples/lab_store.sh start DIR ...' started (default: start one "
        "here, on a local S3 server)",
    )
    parser.add_argument(
        "--params", type=Path, default=ROOT / "params.yaml", help="params file to scale (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    args.trials = args.trials or 4 * args.concurrency
    if args.nodes > args.concurrency:
        parser.error(f"--nodes {args.nodes}: more nodes than --concurrency {args.concurrency} CPUs to share")
    if args.lab_store is not None:
        args.lab_store_uri = lab_store_uri(parser, args.lab_store)
    with bad_input_is_a_usage_error(parser):
        args.base = load_params(args.params)
        if VARIANT not in args.base.variants:
            raise ValueError(f"{args.params}: no variant {VARIANT!r} to run")
        scaled_params(args.base, args.trials, args.epochs, args.concurrency, None)  # validated before anything starts
    return args


def report(args: argparse.Namespace, base: Params, figures: dict) -> None:
    (ours, ours_memory), (bare, bare_memory) = figures["sides"]
    lag: Lag = figures["lag"]
    print(
        f"{VARIANT} (width {base.model.resnet_width}) x {args.epochs} epoch(s) per trial on the embedded digits, "
        f"{args.concurrency} at a time on {args.nodes} Ray nodes (declared CPUs), the lab store (PostgreSQL + bucket)"
    )
    print(text_table([row(ours, ours_memory), row(bare, bare_memory)], numeric={"trials", "wall s", "processes"}))
    print(f"MLflow requests by method (our client's): {dict(sorted(figures['requests'].items()))}")
    print(
        f"writer lag: {lag.writes} writes, max {lag.max_s:.2f} s, p95 {lag.p95_s:.2f} s, median {lag.median_s:.3f} s; "
        f"p95 first half {lag.first_half_p95_s:.2f} s, last half {lag.last_half_p95_s:.2f} s"
    )
    print(f"trial ends per second (ours, one driver): {ours.trials / ours.wall_s:.2f}")
    print(f"wall ratio to bare Ray Tune: {ours.wall_s / bare.wall_s:.2f}")
    for problem in figures["problems"]:
        print(f"check failed: {problem}")
    if not figures["problems"]:
        print(f"checked: every trial of both ways ended, one FINISHED run per trial ({args.trials})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The cluster started here has token auth on (as a lab's has): Ray reads its auth mode once, when it is imported
    # (nothing imported so far imports it), and the token file (RAY_AUTH_TOKEN_PATH) when the driver attaches.
    os.environ["RAY_AUTH_MODE"] = "token"
    if not args.lab_store:
        from tests.lab_store import postgresql_missing

        if missing := postgresql_missing():
            print(f"python -m benchmarks.sweep_concurrency: no --lab-store given and none can start here: {missing}")
            return 2
    logging.basicConfig(level=logging.WARNING)
    data = prepare_dataset(args.base.data, args.params.resolve().parent)
    with tempfile.TemporaryDirectory(prefix="sweep-concurrency-") as tmp:
        figures = measure(args, data, Path(tmp))
    report(args, args.base, figures)
    return 1 if figures["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
