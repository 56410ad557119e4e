"""Planning at scale: which trials of a large sweep to reuse, resume or train, against a store already full of runs.

Fills a scratch sqlite MLflow store with --runs runs as sweeps write them (tags, params, latest metrics; MLflow's own
tables, filled in bulk): half of the planned trials have a finished run (reused), a quarter a killed one, the rest
of the runs belong to other trials, and one run in twenty is a parent run without a trial key. It then plans a sweep
of --trials trials as the tune stage and its dry run do (``grid.sweep_decisions``) through a client that counts its
requests, and prints per store:
  store requests   by method; issue 30's target is <= 10 for 1000 trials, whatever the store holds
  time             wall seconds, and this process's CPU seconds (a server's own CPU is not in it)
  decisions        reuse / resume / train
--server plans once more through a real ``mlflow server --workers 1`` on the same store. (The former plan, one
search per trial key, made 1000 requests for 1000 trials: benchmarks/README.md.)
Usage: ``python -m benchmarks.sweep_scale [--trials 1000] [--runs 10000] [--server] [--help]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import bad_input_is_a_usage_error, make_parser, positive_int, progress
from pipeline.config import Params, load_params, parse_params
from pipeline.sweep.grid import sweep_decisions
from pipeline.sweep.identity import trial_key
from pipeline.sweep.reuse import RESUME, REUSE, TRAIN
from pipeline.sweep.tracking import Store
from pipeline.sweep.tracking.server import MlflowServer
from pipeline.sweep.tracking.store import CountingClient, mlflow_client, prepare_store
from pipeline.sweep.tracking.tags import (
    CHECKPOINT_TAG,
    KEY_TAG,
    LAST_EPOCH_TAG,
    PARENT_TAG,
    STATUS_TAG,
    TRIAL_ID_TAG,
    TRIAL_PATH_TAG,
)

ROOT = Path(__file__).resolve().parent.parent
DATA_HASH = "0" * 64  # the plan only hashes it into the trial keys
EXPERIMENT = "sweep-scale"
PARAMS_PER_RUN, METRICS = 25, ("train_loss", "train_acc", "test_loss", "test_acc", "epoch_time_s", "lr")


def sweep_params(path: Path, trials: int) -> Params:
    """The params file's first variant x ``trials`` seeds."""
    raw = load_params(path).model_dump(mode="json")
    raw["sweep"].update(variants=raw["sweep"]["variants"][:1], seeds=list(range(trials)), retrain=False)
    return parse_params(raw, "benchmark params")


def fill_store(uri: str, params: Params, runs: int, scratch: Path) -> tuple[str, int]:
    """``runs`` runs in a new experiment of the store at ``uri``, written in one transaction through MLflow's tables;
    the experiment's id and how many of the runs are the planned trials'."""
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlParam, SqlRun, SqlTag
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    prepare_store(uri)
    experiment_id = mlflow_client(uri).create_experiment(EXPERIMENT, artifact_location=(scratch / "art").as_uri())
    variant, epochs = params.sweep.variants[0], params.train.epochs
    keys = [trial_key(params, variant, seed, DATA_HASH) for seed in params.sweep.seeds]
    planned = [(key, "finished") for key in keys[::2]] + [(key, "killed") for key in keys[1::4]]
    planned = planned[:runs]
    now = int(time.time() * 1000)
    rows: dict[str, list[dict]] = {"runs": [], "tags": [], "params": [], "metrics": []}
    for i in range(runs):
        run_id = uuid.uuid4().hex
        key, kind = planned[i] if i < len(planned) else (uuid.uuid4().hex[:12], "finished")
        parent = i >= len(planned) and i % 20 == 0
        status = "KILLED" if kind == "killed" else "FINISHED"
        rows["runs"].append(
            {
                "run_uuid": run_id,
                "name": f"run-{i}",
                "source_type": "LOCAL",
                "source_name": "stages/tune.py",
                "entry_point_name": "",
                "user_id": "bench",
                "status": status,
                "start_time": now - (runs - i) * 1000,
                "end_time": now,
                "source_version": "",
                "lifecycle_stage": "active",
                "artifact_uri": (scratch / "art" / run_id).as_uri(),
                "experiment_id": int(experiment_id),
            }
        )
        tags = {"mlflow.runName": f"run-{i}", "mlflow.user": "bench", "dvc_stage": "tune", "git_commit": "0" * 40}
        if not parent:
            tags |= {
                KEY_TAG: key,
                PARENT_TAG: "p" * 32,
                TRIAL_ID_TAG: f"t{i:05d}",
                TRIAL_PATH_TAG: str(scratch / "ray" / f"trial{i}"),
                STATUS_TAG: "finished" if kind == "finished" else "interrupted",
                "variant": variant,
                "seed": str(i),
            }
            if kind == "finished":
                tags |= {LAST_EPOCH_TAG: str(epochs), CHECKPOINT_TAG: str(scratch / "ray" / f"trial{i}" / "ckpt")}
        rows["tags"] += [{"key": k, "value": v, "run_uuid": run_id} for k, v in tags.items()]
        rows["params"] += [{"key": f"param.{p}", "value": str(p), "run_uuid": run_id} for p in range(PARAMS_PER_RUN)]
        rows["metrics"] += [
            {"key": m, "value": 0.5, "timestamp": now, "step": epochs, "is_nan": False, "run_uuid": run_id}
            for m in METRICS
        ]
    store = SqlAlchemyStore(uri, (scratch / "art").as_uri())
    with store.engine.begin() as connection:
        for table, model in (("runs", SqlRun), ("tags", SqlTag), ("params", SqlParam), ("metrics", SqlLatestMetric)):
            connection.execute(model.__table__.insert(), rows[table])
    store.engine.dispose()
    return experiment_id, len(planned)


def timed(plan: Callable[[CountingClient], object], uri: str) -> tuple[object, Counter, float, float]:
    client = CountingClient(mlflow_client(uri))
    wall, cpu = time.perf_counter(), time.process_time()
    result = plan(client)
    return result, client.calls, time.perf_counter() - wall, time.process_time() - cpu


def say(label: str, trials: int, calls: Counter, wall: float, cpu: float, decided: str) -> None:
    requests = ", ".join(f"{name} {n}" for name, n in sorted(calls.items()))
    print(
        f"{label}: {sum(calls.values())} store request(s) ({requests}) for {trials} trials, "
        f"{wall:.2f} s wall, {cpu:.2f} s CPU; {decided}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("sweep_scale", __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--params", type=Path, default=ROOT / "params.yaml", help="params file whose first variant is swept"
    )
    parser.add_argument("--trials", type=positive_int, default=1000, help="trials in the plan (default: %(default)s)")
    parser.add_argument("--runs", type=positive_int, default=10_000, help="runs in the store (default: %(default)s)")
    parser.add_argument("--server", action="store_true", help="plan through a real mlflow server on the store too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with bad_input_is_a_usage_error(parser):
        params = sweep_params(args.params, args.trials)
    with tempfile.TemporaryDirectory(prefix="sweep-scale-") as tmp:
        scratch = Path(tmp)
        database = scratch / "mlflow.db"
        uri = f"sqlite:///{database}"
        progress(f"filling {database} with {args.runs} runs ...")
        started = time.perf_counter()
        experiment_id, planned_runs = fill_store(uri, params, args.runs, scratch)
        print(
            f"store: {args.runs} runs in one experiment ({planned_runs} of them the planned trials'), "
            f"filled in {time.perf_counter() - started:.1f} s"
        )
        stores = [("sqlite", uri)]
        server = MlflowServer(scratch, database) if args.server else None
        try:
            if server is not None:
                progress("starting mlflow server ...")
                server.start(timeout_s=180)
                stores.append(("mlflow server", server.uri))
            for label, store_uri in stores:

                def plan(client: CountingClient, store_uri: str = store_uri) -> list:
                    return sweep_decisions(params, DATA_HASH, store_uri, experiment_id, store=Store(store_uri, client))

                decisions, calls, wall, cpu = timed(plan, store_uri)
                actions = Counter(d.action for d in decisions)
                decided = ", ".join(f"{actions[a]} {a}" for a in (REUSE, RESUME, TRAIN))
                say(f"plan ({label})", args.trials, calls, wall, cpu, decided)
        finally:
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
