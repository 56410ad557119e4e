"""The analysis over a thousand runs: its wall time, and the MLflow requests and bytes it costs per run.

    python -m benchmarks.analysis_at_scale [--runs 1000] [--epochs 40] [--lab-store DIR | --tracking-uri URI]

N runs of the default study (``params.yaml``: its variants, model widths and epochs; seeds 0, 1, ... over the variants
in turn) are written to a store through MLflow's client as the tune stage leaves them: a parent run, each trial a
child run with its tags, its model and train params, every epoch's metrics (the tune stage's keys, with the locality
per layer for an attention model) and its ``checkpoint/`` folder (``checkpoint.pt``, the head and locality histories)
as artifacts; and the tune manifest that names them. The checkpoint folders are forged once per variant (the model at
its initialisation, per-epoch histories measured on it) and uploaded for every run of that variant: the analysis
reads them as it reads a trained one's. Then ``python -m stages.analyze`` runs over them in a project folder with the
repository's ``params.yaml`` and no prepared data (so the claims paired on test images and CKA say "not measured").

It prints the requests ``analysis.runs.load_study`` made (every HTTP request of MLflow's client in this process, by
endpoint), per run, and the bytes it received per run; the wall time of ``load_study`` and of the whole stage (the
figures, tables, report and the analysis run it logs back included); and the requests of the whole stage per run.
The store: ``--lab-store DIR``, a running store that ``examples/lab_store.sh start DIR ...`` started (PostgreSQL and
a bucket, what a lab runs); otherwise a fresh ``mlflow server`` on sqlite with its artifacts on this disk.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
import torch
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from benchmarks.common import bad_input_is_a_usage_error, make_parser, positive_int, progress, text_table
from pipeline.config import ModelConfig, load_params
from pipeline.models import build_model
from pipeline.sweep.manifest import TrialRecord, TuneManifest, write_tune_manifest
from pipeline.trial.checkpoint import head_snapshot, save_model_checkpoint
from pipeline.trial.locality import measure_locality
from pipeline.trial.report import METRIC_KEYS, locality_key

ROOT = Path(__file__).resolve().parent.parent
IMAGE = (3, 8, 8)  # the default data: digits at 8x8, made RGB
CLASSES = 10
WRITERS = 4  # threads writing the runs; at 8 on 2 loaded cores the lab server ran out of database connections


@dataclass
class Traffic:
    """HTTP requests by where they went and what they asked (ids left out), and the bytes their answers carried."""

    requests: Counter
    bytes: int = 0

    def to(self, where: str) -> int:
        return sum(n for key, n in self.requests.items() if key.startswith(where))


def request_key(url: str, method: str, server: str) -> str:
    """``server POST runs/search``, ``server GET presigned checkpoint/checkpoint.pt``, ``bucket GET
    checkpoint/checkpoint.pt``: where a request went (the tracking server, else the bucket), then the REST endpoint or
    the run's file (ids left out)."""
    where = "server" if url.startswith(server) else "bucket"
    path = urllib.parse.urlparse(url).path
    if "/artifacts/" in path:  # a run's file: through the server, a URL it presigns, or the bucket's object
        kind = "presigned " if "/presigned/" in path else "artifact " if where == "server" else ""
        return f"{where} {method} {kind}{path.rsplit('/artifacts/', 1)[-1]}"
    return f"{where} {method} {path.split('/mlflow/', 1)[-1]}"


@contextmanager
def counting_http(server: str) -> Iterator[Traffic]:
    """Every HTTP request made in this process meanwhile (any thread: MLflow's REST client, its artifact repository's
    downloads through the server, and those straight from the bucket at a URL the server presigned), by
    ``request_key``, and the bytes of the answers (their Content-Length)."""
    traffic = Traffic(Counter())
    real = requests.Session.send

    def counted(session: requests.Session, request: requests.PreparedRequest, **kwargs: object) -> requests.Response:
        traffic.requests[request_key(str(request.url), str(request.method), server)] += 1
        response = real(session, request, **kwargs)
        traffic.bytes += int(response.headers.get("Content-Length") or 0)
        return response

    requests.Session.send = counted
    try:
        yield traffic
    finally:
        requests.Session.send = real


def forged_checkpoint(directory: Path, cfg: ModelConfig, epochs: int) -> list[dict[str, float]]:
    """A checkpoint folder as a trial of ``cfg`` leaves it after ``epochs`` epochs (its model at initialisation, the
    histories measured on it every epoch); returns each epoch's locality per layer (the run's logged means)."""
    torch.manual_seed(0)
    model = build_model(cfg, image_size=IMAGE[1], in_channels=IMAGE[0], num_classes=CLASSES)
    images = torch.randn(16, *IMAGE, generator=torch.Generator().manual_seed(0))
    heads, locality = [], []
    model.eval()
    per_layer = measure_locality(model, images)
    for epoch in range(epochs + 1):
        if per_layer is not None:
            locality.append({"epoch": epoch, "layers": per_layer})
        if (snapshot := head_snapshot(model, epoch)) is not None:
            heads.append(snapshot)
    directory.mkdir(parents=True)
    save_model_checkpoint(directory, model, cfg, image_shape=IMAGE, num_classes=CLASSES)
    if heads:
        (directory / "head_history.json").write_text(json.dumps(heads))
    if locality:
        (directory / "locality_history.json").write_text(json.dumps(locality))
    means = {}
    for layer, values in enumerate(per_layer or [], start=1):
        for metric, per_head in values.items():
            if per_head and metric in ("mean_distance", "entropy", "peak_probability"):
                means[locality_key(layer, metric)] = float(sum(per_head) / len(per_head))
    return [means] * (epochs + 1)


def epoch_metrics(epoch: int, seed: int, locality: dict[str, float], now: int) -> list[Metric]:
    """What the tune stage logs at ``step=epoch``: the report's keys (values made up, rising with the epoch)."""
    acc = min(0.99, 0.3 + 0.015 * epoch + 0.001 * seed)
    values = {"train_loss": 2.0 / epoch, "train_acc": acc, "test_loss": 2.1 / epoch, "test_acc": acc, "lr": 0.1}
    values |= {"epoch_time_s": 0.5, "images_per_s": 2800.0, **locality}
    assert set(values) >= set(METRIC_KEYS) - {"epoch"}
    return [Metric(key, value, now + epoch, epoch) for key, value in values.items()]


def build_store(uri: str, project: Path, runs: int, epochs: int) -> int:
    """``runs`` trial runs under one parent run in a new experiment at ``uri`` and the tune manifest naming them in
    ``project``; returns the checkpoint folder's bytes per run (mean)."""
    params = load_params(ROOT / "params.yaml")
    variants = list(params.sweep.variants)
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(f"analysis-at-scale-{time.time_ns()}")
    parent = client.create_run(experiment_id, run_name="sweep").info.run_id
    templates, localities = {}, {}
    for name in variants:
        cfg = params.variants[name].apply(params.model)
        templates[name] = (project / "forged" / name, cfg)
        localities[name] = forged_checkpoint(templates[name][0], cfg, epochs)
    sizes = {name: sum(f.stat().st_size for f in folder.iterdir()) for name, (folder, _) in templates.items()}

    def write(index: int) -> TrialRecord:
        variant, seed = variants[index % len(variants)], index // len(variants)
        folder, cfg = templates[variant]
        tags = {"mlflow.parentRunId": parent, "variant": variant, "seed": str(seed), "device": "cpu"}
        run_id = client.create_run(experiment_id, run_name=f"{variant}-seed{seed}", tags=tags).info.run_id
        logged = [Param(f"model.{k}", str(v)) for k, v in cfg.model_dump().items()]
        logged += [Param("train.epochs", str(epochs)), Param("train.seed", str(seed))]
        now = int(time.time() * 1000)
        metrics = [m for e in range(1, epochs + 1) for m in epoch_metrics(e, seed, localities[variant][e], now)]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            client.log_batch(run_id, metrics=metrics[start : start + 1000], params=logged if not start else [])
        client.log_batch(run_id, tags=[RunTag("trial_id", f"t{index:05d}")])
        client.log_artifacts(run_id, str(folder), artifact_path="checkpoint")
        client.set_terminated(run_id, "FINISHED")
        head = f"{folder}/head_history.json" if (folder / "head_history.json").is_file() else None
        about = {"checkpoint": f"runs:/{run_id}/checkpoint"}
        final = {"test_acc": metrics[-1].value}
        return TrialRecord(
            f"t{index:05d}",
            run_id,
            f"{variant}-seed{seed}",
            variant,
            seed,
            "finished",
            epochs,
            final,
            None,
            head,
            about,
        )

    trials = []
    with ThreadPoolExecutor(WRITERS) as pool:
        for done, record in enumerate(pool.map(write, range(runs)), start=1):
            trials.append(record)
            if done % 100 == 0 or done == runs:
                progress(f"  {done}/{runs} runs written")
    tune = TuneManifest(
        "hash", "tune-hash", str(project / "ray"), "test_acc", "max", uri, experiment_id, parent, trials
    )
    write_tune_manifest(project / "results/tune/manifest.json", tune, project)
    return round(sum(sizes[variants[i % len(variants)]] for i in range(runs)) / runs)


def analyse(project: Path, server: str) -> tuple[Traffic, Traffic, float, float]:
    """``stages.analyze`` in ``project``: the traffic of ``load_study`` and of the whole stage, and both wall times."""
    import analysis.runs as runs
    from stages.analyze import main

    real, inner = runs.load_study, {}

    def timed(*args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        with counting_http(server) as traffic:
            study = real(*args, **kwargs)
        inner["traffic"], inner["wall"] = traffic, time.perf_counter() - started
        return study

    runs.load_study = timed
    cwd = Path.cwd()
    os.chdir(project)
    try:
        started = time.perf_counter()
        with counting_http(server) as whole:
            if main([]) != 0:
                raise RuntimeError("python -m stages.analyze failed (its log says why)")
        wall = time.perf_counter() - started
    finally:
        os.chdir(cwd)
        runs.load_study = real
    return inner["traffic"], whole, inner["wall"], wall


def row(part: str, traffic: Traffic, wall: float, runs: int) -> dict[str, str]:
    return {
        "part": part,
        "wall s": f"{wall:.1f}",
        "server requests/run": f"{traffic.to('server') / runs:.2f}",
        "bucket requests/run": f"{traffic.to('bucket') / runs:.2f}",
        "KB/run": f"{traffic.bytes / runs / 1e3:.1f}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("analysis_at_scale", __doc__.split("\n\n")[0], epilog="See the module docstring.")
    parser.add_argument("--runs", type=positive_int, default=1000, help="trial runs in the study (default 1000)")
    parser.add_argument("--epochs", type=positive_int, default=None, help="epochs per run (default: params.yaml's)")
    parser.add_argument(
        "--lab-store",
        type=Path,
        default=None,
        help="the running store that 'examples/lab_store.sh start DIR ...' started (PostgreSQL + a bucket)",
    )
    parser.add_argument(
        "--tracking-uri", default=None, help="a running mlflow server to write to (a test's), instead of a fresh one"
    )
    args = parser.parse_args(argv)
    with bad_input_is_a_usage_error(parser):
        epochs = args.epochs or load_params(ROOT / "params.yaml").train.epochs
        if args.tracking_uri is not None and not args.tracking_uri.startswith(("http://", "https://")):
            raise ValueError(f"--tracking-uri {args.tracking_uri}: not an mlflow server's http(s) address")
        if args.lab_store is not None and not (args.lab_store / "tracking_uri").is_file():
            raise ValueError(
                f"--lab-store {args.lab_store}: not a running store (start one with examples/lab_store.sh)"
            )
    import logging

    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    with tempfile.TemporaryDirectory(prefix="analysis-at-scale-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        if args.lab_store is not None:
            uri, where = (args.lab_store / "tracking_uri").read_text().strip(), "the lab store (PostgreSQL + bucket)"
        elif args.tracking_uri is not None:
            uri, where = args.tracking_uri, f"the mlflow server at {args.tracking_uri}"
        else:
            from pipeline.sweep.tracking.server import MlflowServer

            server = MlflowServer(root / "server")
            server.start()
            stack.callback(server.stop)
            uri, where = server.uri, "a fresh mlflow server (sqlite, artifacts on disk)"
        project = root / "project"
        project.mkdir()
        shutil.copy(ROOT / "params.yaml", project / "params.yaml")
        progress(f"analysis_at_scale: writing {args.runs} runs of {epochs} epochs to {uri} ...")
        started = time.perf_counter()
        checkpoint_bytes = build_store(uri, project, args.runs, epochs)
        progress(f"  written in {time.perf_counter() - started:.0f} s; analysing ...")
        loading, whole, load_wall, wall = analyse(project, uri)
    n = args.runs
    print(f"{n} runs of {epochs} epochs in {where}; a checkpoint folder holds {checkpoint_bytes / 1e3:.1f} KB")
    rows = [row("load_study", loading, load_wall, n), row("whole stage", whole, wall, n)]
    print(text_table(rows, numeric=set(rows[0]) - {"part"}))
    print(f"load_study requests: {dict(sorted(loading.requests.items()))}")
    others = whole.requests - loading.requests
    print(f"the rest of the stage (figures, report, the analysis run, run colours): {dict(sorted(others.items()))}")
    print(f"analyze over {n} runs: {wall:.1f} s, {loading.to('server') / n:.2f} server requests per run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
