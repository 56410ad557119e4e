"""The driver's time per trial end at paper size: on Tune's event loop (before) against a background thread (now).

At each trial's end the driver's Tune callback uploads the trial's checkpoint to MLflow, rebuilds its model and logs
it. This runs real Tune sweeps with the real callback (``MlflowTrialCallback``) and a real sqlite MLflow store, whose
trials each report one epoch with a paper-size checkpoint (the paper's SA quadratic model, hidden 400, 6 layers,
9 heads, 32x32 images, weights and SGD momentum: about 92 MiB), one trial at a time, both ways in one run:
  event loop   the trial's end logged inside ``on_trial_complete`` (``background=False``): Tune waits
  background   ``on_trial_complete`` hands it to the callback's writer thread and returns
and prints per trial end: the driver's time inside ``on_trial_complete`` (wall and the driver thread's CPU time), the
worker's time, and how long after a trial ended the next one started, with whether it started while the previous
model was still being logged. Torch runs single-threaded. Usage: ``python -m benchmarks.trial_end [--trials 3]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.sweep.session import keep_local_ray_on_loopback

keep_local_ray_on_loopback()  # before Ray is imported

import torch  # noqa: E402

from benchmarks.common import REDUCED_MODEL, make_parser, positive_int, progress  # noqa: E402
from pipeline.sweep.tracking.callback import MlflowTrialCallback, TrialInfo  # noqa: E402
from pipeline.sweep.tracking.trial_end import TrialEnd, TrialEnds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def paper_checkpoint(directory: Path, reduced: bool = False) -> int:
    """A checkpoint of the paper's SA quadratic model as a trial writes it (weights, SGD momentum, configs); its
    size in bytes. ``reduced``: the benchmarks' reduced CPU size instead (a smoke run)."""
    from pipeline.config import load_params
    from pipeline.models import build_model
    from pipeline.trial.checkpoint import heads_of
    from pipeline.trial.loop import build_optimizer

    params = load_params(ROOT / "params" / "paper.yaml")
    model_cfg = params.model_for("sa_quadratic_9")
    if reduced:
        model_cfg = model_cfg.model_copy(update=REDUCED_MODEL)
    model = build_model(model_cfg, image_size=32, in_channels=3, num_classes=10)
    optimizer = build_optimizer(model, params.train)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # momentum buffers, as after any epoch
    directory.mkdir(parents=True)
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 1,
        "model_config": model_cfg.model_dump(),
        "train_config": params.train.model_dump(),
        "heads_per_layer": heads_of(model),
        "metrics_history": [{"epoch": 1, "test_acc": 0.1}],
        "image_shape": [3, 32, 32],
        "num_classes": 10,
    }
    torch.save(payload, directory / "checkpoint.pt")
    return (directory / "checkpoint.pt").stat().st_size


def one_epoch_trial(config: dict[str, Any]) -> None:
    """A trial that reports one epoch with the prepared paper-size checkpoint (Tune copies it into its storage)."""
    from ray import tune

    report = {"epoch": 1, "test_acc": 0.1, "train_loss": 2.3, "train_acc": 0.1, "test_loss": 2.3, "epoch_time_s": 1.0}
    tune.report(report, checkpoint=tune.Checkpoint.from_directory(config["checkpoint"]))


def describe(config: dict) -> TrialInfo:
    return TrialInfo(f"trial-end-{config['index']}", {"index": str(config["index"])}, {})


class TimedCallback(MlflowTrialCallback):
    """The real callback, timing its trial ends and the next trials' starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.starts: list[float] = []  # on_trial_start, perf_counter
        self.completes: list[tuple[float, float, float]] = []  # (returned at, wall s, driver thread CPU s)
        self.worker: list[tuple[float, float]] = []  # background trial ends: (began, ended)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.starts.append(time.perf_counter())
        super().on_trial_start(iteration, trials, trial, **info)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        super().on_trial_complete(iteration, trials, trial, **info)
        now = time.perf_counter()
        self.completes.append((now, now - wall, time.thread_time() - cpu))


class TimedEnds(TrialEnds):
    """The callback's trial ends, timing the work on the writer thread."""

    def end_trial(self, end: TrialEnd) -> None:
        began = time.perf_counter()
        try:
            super().end_trial(end)
        finally:
            if self.callback.background:  # else it ran inside on_trial_complete, timed there
                self.callback.worker.append((began, time.perf_counter()))


def sweep(root: Path, label: str, trials: int, checkpoint: Path, background: bool) -> TimedCallback:
    """``trials`` one-epoch trials, one at a time, through a Tuner with the callback; the callback with its timings."""
    from mlflow.tracking import MlflowClient
    from ray import tune

    from pipeline.sweep.tracking.parent import ParentRun
    from pipeline.sweep.tracking.store import ensure_experiment

    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = ensure_experiment(client, f"trial-end-{label}", (root / "artifacts").as_uri())
    parent = ParentRun(uri, experiment_id, client.create_run(experiment_id, run_name=label).info.run_id)
    callback = TimedCallback(parent, describe, {}, epochs=1, background=background)
    callback.ends = TimedEnds(callback)
    space = {"index": tune.grid_search(list(range(trials))), "checkpoint": str(checkpoint)}
    tuner = tune.Tuner(
        tune.with_resources(one_epoch_trial, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(name=label, storage_path=str(root / "ray"), callbacks=[callback], verbose=0),
    )
    results = tuner.fit()
    if results.errors:
        raise RuntimeError(f"{label}: {results.errors[0]}")
    return callback


def summary(label: str, callback: TimedCallback) -> list[str]:
    walls = [c[1] for c in callback.completes]
    cpus = [c[2] for c in callback.completes]
    lines = [f"{label:<12} {statistics.mean(walls):>9.2f} {statistics.mean(cpus):>9.2f}"]
    worker = [end - began for began, end in callback.worker]
    lines[0] += f" {statistics.mean(worker):>9.2f}" if worker else f" {'-':>9}"
    # the next trial's start after each trial's end (the first start is the first trial's)
    gaps, overlapped = [], 0
    for index, (returned, _, _) in enumerate(callback.completes[:-1]):
        started = callback.starts[index + 1]
        gaps.append(started - returned)
        if index < len(callback.worker) and started < callback.worker[index][1]:
            overlapped += 1
    gap = f"{statistics.mean(gaps):.2f}" if gaps else "-"
    lines[0] += f" {gap:>12} {overlapped:>3}/{len(gaps)}"
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("trial_end", __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=positive_int, default=3, help="trials per way (default: %(default)s)")
    parser.add_argument("--reduced", action="store_true", help="the reduced CPU model size, not the paper's (smoke)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    import ray

    with tempfile.TemporaryDirectory(prefix="trial-end-") as tmp:
        root = Path(tmp)
        size = paper_checkpoint(root / "paper_checkpoint", args.reduced)
        own_ray = not ray.is_initialized()  # else the Ray of the calling process (the test session's)
        progress(f"paper-size checkpoint: {size / 2**20:.0f} MiB" + ("; starting a local Ray" if own_ray else ""))
        if own_ray:
            ray.init(
                address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False
            )
        try:
            runs = {}
            for label, background in (("event loop", False), ("background", True)):
                progress(f"{label}: {args.trials} trials")
                runs[label] = sweep(root, label.replace(" ", "-"), args.trials, root / "paper_checkpoint", background)
        finally:
            if own_ray:
                ray.shutdown()
    what = "reduced size" if args.reduced else "paper size"
    print(f"trial ends at {what} ({size / 2**20:.1f} MiB checkpoint), {args.trials} trials each, one at a time")
    print(f"{'way':<12} {'driver s':>9} {'drv CPU s':>9} {'worker s':>9} {'next start s':>12} {'overlap':>7}")
    for label, callback in runs.items():
        print("\n".join(summary(label, callback)))
    print("driver s / drv CPU s: time inside on_trial_complete (Tune's event loop waits), wall / driver thread CPU;")
    print("worker s: the background thread's time per trial end; next start s: from a trial's end to the next")
    print("trial's start; overlap: next trials that started while the previous model was still being logged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
