"""The runs a study's manifests name, fetched from MLflow: params, metrics, per-epoch curves and checkpoints.

The only analysis module that reads MLflow, through the project's one store interface (``pipeline.sweep.tracking``
``Store``). It fetches exactly the runs named in the tune manifest (and the prune and transform manifests when there
are), by id, from the manifest's tracking URI, and the runs' ``checkpoint/`` artifact files (checkpoint.pt, and the
head and locality histories its model has) through MLflow into a local folder:
the manifests' local checkpoint paths are never read, so the analysis runs wherever the MLflow server can be reached (a
workstation, not the cluster that trained). What a study costs the server: a search per hundred runs (params, tags),
a bulk history request per metric and hundred runs, per architecture one run's ``checkpoint.pt`` (its model gives
every seed's parameter and FLOP counts and structure), and the history files of each variant's ``HISTORY_SEEDS``
lowest completed seeds, a request each (2 at most; no folder listing). Any of those runs' models loads on first use
(``LoadedRun.model``): a figure's or a claim's, so a study of a thousand seeds reads a handful of checkpoints (92 MiB
each at the paper's size) and sixty runs' histories, not a thousand of either. A run that is
missing, failed, or has no usable checkpoint becomes a record with a ``reason``, never an exception. It writes two
things back: one ``analysis`` run with the outputs (``log_analysis_run``), and each fetched run's colour in the MLflow
UI, its variant's in the figures (``colour_runs``).
"""

from __future__ import annotations

import json
import logging
import math
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from torch import nn

from analysis.geometry import locality_frame
from analysis.palette import variant_style
from analysis.table import RUN_COLUMNS
from analysis.variants import PRUNED_SUFFIX
from pipeline.finetune.manifest import FineTuneManifest
from pipeline.measure.counting import FlopCount, count_flops, count_parameters
from pipeline.sweep.manifest import COMPLETED, TuneManifest
from pipeline.sweep.tracking import Store, TrackingError
from pipeline.trial.checkpoint import (
    head_snapshot,
    load_checkpoint,
    load_head_history,
    load_locality_history,
    model_from_payload,
)
from pipeline.trial.locality import attention_layers
from pipeline.trial.report import CHECKPOINT_FILE, HEAD_HISTORY_FILE, LOCALITY_HISTORY_FILE, LOCALITY_METRICS

log = logging.getLogger(__name__)

CHECKPOINT_ARTIFACT = "checkpoint"  # the folder pipeline.sweep.tracking uploads (checkpoint.pt and the histories)
# val_acc: only runs trained with a validation set have it; epoch_time_s: each epoch's training pass, for the compute
HISTORY_KEYS = ("test_acc", "train_loss", "val_acc", "epoch_time_s")
# Per variant, the completed runs (lowest seeds first) whose history files are read: the per-head tables, the head
# motion, the locality curves and the finding's means over seeds are theirs; a later seed counts in the accuracy table,
# runs.csv and the compute table from its logged metrics alone. Reading every run's (~360 KB at the default size)
# was two thirds of the analysis of a thousand runs; ten seeds per variant already give the means over seeds.
HISTORY_SEEDS = 10
MISSING = "missing"  # status of a run the manifest names but MLflow does not have
CURVE_COLUMNS = ["variant", "seed", "epoch", "test_acc"]


@dataclass
class LoadedRun:
    """One run named by a manifest, as fetched from MLflow (``reason`` says what is missing, None: nothing)."""

    run_id: str | None
    variant: str  # ``<source variant>_pruned`` for a pruned model
    seed: int
    status: str  # the manifest's label (finished, error, ...) or ``missing``
    source: str  # "tune" | "prune" | "transform"
    reason: str | None = None
    params: dict[str, Any] = field(default_factory=dict)  # cast from MLflow's strings
    tags: dict[str, str] = field(default_factory=dict)  # the run's MLflow tags (device, device_name, ...)
    history: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["epoch", *HISTORY_KEYS]))
    test_acc: float = math.nan  # last epoch
    best_test_acc: float = math.nan  # the best over epochs: an epoch selected on the test set, as the authors did
    val_selected_test_acc: float = math.nan  # test_acc at the epoch of highest val_acc (runs with a validation set)
    epochs: float = math.nan  # last step logged (fine-tuning epochs for a pruned model)
    checkpoint_dir: Path | None = None  # the artifact folder (read in place when local, else downloaded): read only
    # The trained model, loaded on first use (``load_model``, then None): a run whose checkpoint was not needed yet
    # has only its histories here. Not compared or shown: comparing or printing a run must not download anything.
    model: nn.Module | None = field(default=None, repr=False, compare=False)
    load_model: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    # The run of the same architecture whose checkpoint was loaded for both: its parameter and FLOP counts and its
    # model's structure (layers, heads, encodings) are this run's; None when this run's own checkpoint was loaded.
    same_as: LoadedRun | None = field(default=None, repr=False, compare=False)
    image_shape: tuple[int, int, int] | None = None
    head_history: list[dict[str, Any]] = field(default_factory=list)
    locality_history: list[dict[str, Any]] = field(default_factory=list)  # per head, per epoch (0 = before training)
    n_params: float = math.nan
    flops_paper: float = math.nan
    flops_full: float = math.nan
    model_config: dict[str, Any] = field(default_factory=dict)  # the checkpoint's
    source_run_id: str | None = None  # pruned: the tune run it came from
    pruned_heads: set[tuple[int, int]] = field(default_factory=set)  # pruned: (layer, head) cut, 0-based indices
    # Compute (``analysis.compute``): the run's wall time from its start to its end in MLflow, every attempt of its
    # trial included (a retry continues the run); and the sum of its logged epochs' training passes.
    wall_s: float = math.nan
    train_s: float = math.nan
    # A seed past its variant's ``HISTORY_SEEDS``: its metrics only (no histories, no model; ``same_as`` its counts).
    metrics_only: bool = False

    @property
    def has_metrics(self) -> bool:
        return math.isfinite(self.test_acc)

    @property
    def model_loaded(self) -> bool:
        return self.__dict__.get("_model") is not None

    @property
    def has_model(self) -> bool:
        """A model loaded, or a checkpoint to load it from on first use of ``model``; loads nothing."""
        return self.model_loaded or self.load_model is not None

    @property
    def structure(self) -> nn.Module | None:
        """A loaded model of this run's architecture, to ask what it is made of (layers, heads, grid), never for its
        weights: this run's when loaded, else the one ``same_as`` loaded; loads this run's only when neither is."""
        if not self.model_loaded and self.same_as is not None:
            return self.same_as.model
        return self.model

    @property
    def config(self) -> dict[str, Any]:
        """The run's model fields, e.g. ``{"arch": "sa", "encoding": ..., "heads": 9, ...}``: its checkpoint's config,
        and what the run logged (``model.*`` params; all a failed run without a checkpoint has)."""
        logged = {key.removeprefix("model."): v for key, v in self.params.items() if key.startswith("model.")}
        return {**self.model_config, **logged}

    def note(self, text: str) -> None:
        self.reason = text if self.reason is None else f"{self.reason}; {text}"


def _model_on_first_use(run: LoadedRun) -> nn.Module | None:
    if run.load_model is not None:
        load, run.load_model = run.load_model, None
        load()
    return run.__dict__.get("_model")


def _set_model(run: LoadedRun, model: nn.Module | None) -> None:
    run.__dict__["_model"] = model


# ``model`` as a property over the dataclass field (its default and ``__init__`` argument stay): a thousand-run study
# loads the checkpoints its figures and claims use, not every run's (92 MiB each at the paper's size).
LoadedRun.model = property(_model_on_first_use, _set_model, doc="The trained model, loaded on first use.")  # type: ignore[assignment]


@dataclass
class LoadedStudy:
    runs: list[LoadedRun]
    tracking_uri: str
    experiment_id: str
    tune_parent_run_id: str
    prune_parent_run_id: str | None
    prune_rule: dict[str, Any] = field(default_factory=dict)  # the prune manifest's ``rule`` (mode, thresholds, ...)
    # The transform stage's rebuilt networks (fine-tuning runs), apart from ``runs``: the report gives them a section
    # of their own (``analysis.transform_report``) rather than rows of the paper's table.
    transformed: list[LoadedRun] = field(default_factory=list)
    transform: FineTuneManifest | None = None

    def frame(self) -> pd.DataFrame:
        """One row per run: the table's columns (``analysis.table.RUN_COLUMNS``) plus run_id, source, reason."""
        rows = [
            {
                "variant": r.variant,
                "seed": r.seed,
                "status": r.status,
                "test_acc": r.test_acc,
                "best_test_acc": r.best_test_acc,
                "val_selected_test_acc": r.val_selected_test_acc,
                "epochs": r.epochs,
                "params": r.n_params,
                "flops_paper": r.flops_paper,
                "flops_full": r.flops_full,
                "run_id": r.run_id,
                "source": r.source,
                "reason": r.reason or "",
            }
            for r in self.runs
        ]
        return pd.DataFrame(rows, columns=[*RUN_COLUMNS, "run_id", "source", "reason"])

    def curves(self) -> pd.DataFrame:
        """Test accuracy per epoch of the runs that completed: variant, seed, epoch, test_acc. A pruned model's
        curve starts at epoch 0 (accuracy right after pruning, before fine-tuning)."""
        frames = [
            r.history[["epoch", "test_acc"]].dropna().assign(variant=r.variant, seed=r.seed)
            for r in self.runs
            if r.status in COMPLETED and len(r.history)
        ]
        if not frames:
            return pd.DataFrame(columns=CURVE_COLUMNS)
        curves = pd.concat(frames, ignore_index=True)[CURVE_COLUMNS]
        return curves.astype({"seed": int, "epoch": int, "test_acc": float})

    def locality(self) -> pd.DataFrame:
        """Each layer's locality per epoch, the mean over its heads (what the run logged as
        ``locality/layer<l>/<metric>``), from the trial's per-head history of the runs that completed: variant, seed,
        epoch (0: before training; a pruned model's 0 is right after pruning), layer (from 1), the metrics."""
        frames = [
            locality_frame(r.locality_history).assign(variant=r.variant, seed=r.seed)
            for r in self.runs
            if r.status in COMPLETED and r.locality_history
        ]
        columns = ["variant", "seed", "epoch", "layer", *LOCALITY_METRICS]
        if not frames:
            return pd.DataFrame(columns=columns)
        heads = pd.concat(frames, ignore_index=True)
        keys = ["variant", "seed", "epoch", "layer"]
        return heads.groupby(keys, as_index=False, sort=False)[list(LOCALITY_METRICS)].mean()[columns]

    def configs(self) -> dict[str, dict[str, Any]]:
        """Variant -> its model fields (the first run that logged them; ``{}`` when none did), in manifest order."""
        configs: dict[str, dict[str, Any]] = {}
        for run in self.runs:
            if not configs.get(run.variant):
                configs[run.variant] = run.config
        return configs

    def by_variant(self, variant: str, usable: bool = True) -> list[LoadedRun]:
        """Runs of ``variant``, lowest seed first; ``usable``: only completed ones with a model (``has_model``: loaded,
        or loaded on first use)."""
        runs = [r for r in self.runs if r.variant == variant]
        if usable:
            runs = [r for r in runs if r.status in COMPLETED and r.has_model]
        return sorted(runs, key=lambda r: r.seed)

    def run(self, run_id: str) -> LoadedRun | None:
        return next((r for r in self.runs if r.run_id == run_id), None)


def cast_param(value: str) -> Any:
    """MLflow params are strings: ``"32"`` -> 32, ``"0.1"`` -> 0.1, ``"True"`` -> True, ``"None"`` -> None."""
    special = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}
    if value in special:
        return special[value]
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def val_selected(history: pd.DataFrame) -> float:
    """``test_acc`` at the epoch of highest ``val_acc`` (the earliest on a tie): the best epoch chosen without looking
    at the test set. NaN for a run without validation metrics."""
    logged = history.dropna(subset=["val_acc", "test_acc"]) if "val_acc" in history else history.iloc[0:0]
    if logged.empty:
        return math.nan
    return float(logged.loc[logged["val_acc"].idxmax(), "test_acc"])


def history_frame(points: dict[str, list[Any]]) -> pd.DataFrame:
    """Per step (= epoch) values of HISTORY_KEYS from each key's logged points; the latest value when a step was
    logged twice."""
    columns = {}
    for key in HISTORY_KEYS:
        ordered = sorted(points.get(key, []), key=lambda m: (m.step, m.timestamp))
        columns[key] = pd.Series({m.step: m.value for m in ordered}, dtype=float)
    frame = pd.DataFrame(columns).rename_axis("epoch").reset_index() if any(len(c) for c in columns.values()) else None
    if frame is None:
        return pd.DataFrame(columns=["epoch", *HISTORY_KEYS])
    return frame.astype({"epoch": int}).sort_values("epoch", ignore_index=True)


def local_artifacts(artifact_uri: str) -> Path | None:
    """A run's artifact folder when it lies on this machine's file system (a local sqlite store's ``file:`` URI), to
    be read in place; None for a server's proxied artifacts or a bucket (downloaded through MLflow)."""
    parsed = urllib.parse.urlparse(artifact_uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(urllib.request.url2pathname(parsed.path))
    return Path(artifact_uri) if parsed.scheme == "" else None


def _histories_fetched(store: Store, runs: dict[str, Any]) -> dict[str, dict[str, list[Any]]]:
    """Run id -> key -> the logged points of each HISTORY_KEYS metric the run has (its latest value says it has it):
    a bulk request per key and hundred runs."""
    histories: dict[str, dict[str, list[Any]]] = {run_id: {} for run_id in runs}
    for key in HISTORY_KEYS:
        if having := [run_id for run_id, run in runs.items() if key in run.data.metrics]:
            for run_id, points in store.metric_histories(key, having).items():
                histories[run_id][key] = points
    return histories


def _fill(record: LoadedRun, run: Any, points: dict[str, list[Any]]) -> None:
    """``record``'s params, tags, history and final numbers from its MLflow run and logged points."""
    record.params = {key: cast_param(value) for key, value in run.data.params.items()}
    record.tags = dict(run.data.tags)
    record.history = history_frame(points)
    if run.info.start_time and run.info.end_time:  # an interrupted run (still RUNNING) has no end: not counted
        record.wall_s = (run.info.end_time - run.info.start_time) / 1000
    record.train_s = float(record.history["epoch_time_s"].sum()) if len(record.history) else math.nan
    accs = record.history["test_acc"].dropna()
    if len(accs):
        record.test_acc = float(accs.iloc[-1])
        record.best_test_acc = float(accs.max())
        record.val_selected_test_acc = val_selected(record.history)
        record.epochs = float(record.history.loc[accs.index[-1], "epoch"])
    else:
        record.note("no test_acc logged")
    if record.status not in COMPLETED:
        record.note(f"trial {record.status}")


def _histories_wanted(model: nn.Module) -> list[str]:
    """The history files a trial writes beside ``checkpoint.pt`` for ``model``: per-head locality for a model with
    attention, head geometry for Gaussian heads (``pipeline.trial.checkpoint.write_checkpoint``)."""
    wanted = [LOCALITY_HISTORY_FILE] if attention_layers(model) else []
    return wanted + ([HEAD_HISTORY_FILE] if head_snapshot(model, 0) is not None else [])


def _checkpoint_folder(record: LoadedRun, cache_dir: Path, artifact_uri: str) -> tuple[Path, bool]:
    """Where the run's ``checkpoint/`` files are read, and whether in place: where they lie when the store's artifacts
    are on this machine (a copy would read every checkpoint twice: paper-size ones are 92 MiB), else the folder
    ``cache_dir/<run id>/checkpoint/`` they are fetched into."""
    in_place = local_artifacts(artifact_uri)
    if in_place is not None:
        return in_place / CHECKPOINT_ARTIFACT, True
    return cache_dir / str(record.run_id) / CHECKPOINT_ARTIFACT, False


def _load_model(store: Store, record: LoadedRun, artifact_uri: str, folder: Path, in_place: bool) -> dict[str, Any]:
    """``checkpoint.pt`` (fetched, one request, unless in place) and the model built from it; returns the checkpoint's
    contents, {} with a reason when the run has none."""
    if (
        not (folder / CHECKPOINT_FILE).is_file()
        if in_place
        else not store.download_files(artifact_uri, CHECKPOINT_ARTIFACT, [CHECKPOINT_FILE], folder)
    ):
        record.note(f"no {CHECKPOINT_ARTIFACT}/{CHECKPOINT_FILE} artifact in MLflow")
        return {}
    checkpoint = load_checkpoint(folder)
    channels, height, width = (int(v) for v in checkpoint["image_shape"])
    record.image_shape = (channels, height, width)
    record.model = model_from_payload(checkpoint)
    record.model_config = dict(checkpoint["model_config"])
    return checkpoint


def _read_histories(
    store: Store, record: LoadedRun, artifact_uri: str, folder: Path, in_place: bool, wanted: list[str]
) -> None:
    """The history files ``wanted`` (``_histories_wanted``), fetched (a request each, no folder listing) unless in
    place."""
    if not in_place:
        store.download_files(artifact_uri, CHECKPOINT_ARTIFACT, wanted, folder)
    record.checkpoint_dir = folder
    record.head_history = load_head_history(folder)
    record.locality_history = load_locality_history(folder)


def _download_checkpoint(store: Store, record: LoadedRun, cache_dir: Path, artifact_uri: str) -> dict[str, Any]:
    """The run's model from its ``checkpoint/`` artifact (``_checkpoint_folder``), then the histories its model has.
    Returns the checkpoint's contents ({} without one)."""
    folder, in_place = _checkpoint_folder(record, cache_dir, artifact_uri)
    checkpoint = _load_model(store, record, artifact_uri, folder, in_place)
    if checkpoint:
        _read_histories(store, record, artifact_uri, folder, in_place, _histories_wanted(record.model))
    return checkpoint


def _unusable(record: LoadedRun, err: Exception) -> None:
    record.model = None
    record.note(f"checkpoint unusable ({type(err).__name__}: {str(err).splitlines()[0][:200]})")


CHECKPOINT_ERRORS = (TrackingError, OSError, ValueError, KeyError, RuntimeError)  # unreadable or mismatched


def _checkpoint_into(store: Store, record: LoadedRun, cache_dir: Path, artifact_uri: str) -> dict[str, Any]:
    try:
        return _download_checkpoint(store, record, cache_dir, artifact_uri)
    except CHECKPOINT_ERRORS as err:
        _unusable(record, err)
        return {}


def _same_architecture(
    store: Store, record: LoadedRun, loaded: LoadedRun, wanted: list[str], cache_dir: Path, artifact_uri: str
) -> None:
    """``record`` read beside ``loaded``, a run of its architecture whose checkpoint was loaded: only its history files
    (``wanted``: what every per-run table needs) now, its model on first use of ``record.model``; its parameter and
    FLOP counts, image shape and model config are ``loaded``'s."""
    folder, in_place = _checkpoint_folder(record, cache_dir, artifact_uri)

    def load() -> None:
        try:
            _load_model(store, record, artifact_uri, folder, in_place)
        except CHECKPOINT_ERRORS as err:
            _unusable(record, err)

    try:
        _read_histories(store, record, artifact_uri, folder, in_place, wanted)
    except CHECKPOINT_ERRORS as err:
        _unusable(record, err)
        return
    record.load_model = load
    _counted_as(record, loaded)


def _metrics_only(record: LoadedRun, loaded: LoadedRun) -> None:
    """``record``, a seed past its variant's ``HISTORY_SEEDS``, beside ``loaded`` (its architecture's run whose
    checkpoint was read): nothing more fetched; its parameter and FLOP counts and structure are ``loaded``'s."""
    record.metrics_only = True
    _counted_as(record, loaded)


def _counted_as(record: LoadedRun, loaded: LoadedRun) -> None:
    """``record``'s parameter and FLOP counts, image shape, model config and structure (``same_as``): ``loaded``'s,
    the run of its architecture whose checkpoint was read."""
    record.same_as = loaded
    record.image_shape, record.model_config = loaded.image_shape, dict(loaded.model_config)
    record.n_params, record.flops_paper, record.flops_full = loaded.n_params, loaded.flops_paper, loaded.flops_full


def architecture(record: LoadedRun) -> str | None:
    """What makes two trained runs' models the same shape and cost: their logged ``model.*`` params. None for a run
    whose own checkpoint is read: a pruned or rebuilt model (its heads per layer are its own), one whose attention
    window follows its trained heads (its FLOPs are its own), one that logged no model params."""
    logged = {key: value for key, value in record.params.items() if key.startswith("model.")}
    if record.source != "tune" or not logged or logged.get("model.attention_window_eps") is not None:
        return None
    return json.dumps(logged, sort_keys=True, default=str)


def _measure(record: LoadedRun, checkpoint: dict[str, Any], flops: dict[str, FlopCount]) -> None:
    """``record``'s parameter and FLOP counts from its model. A FLOP count runs the model once (up to a CPU-second):
    counted once per architecture (``flops``), the same for every seed, except where the attention's window follows
    the trained heads (``attention_window_eps``)."""
    if record.model is None or record.image_shape is None:
        return
    try:
        record.n_params = float(count_parameters(record.model))
        architecture = [record.model_config, checkpoint.get("heads_per_layer"), record.image_shape]
        key = json.dumps(architecture, sort_keys=True, default=str)
        if key not in flops or record.model_config.get("attention_window_eps") is not None:
            flops[key] = count_flops(record.model, record.image_shape)
        record.flops_paper, record.flops_full = float(flops[key].paper), float(flops[key].full)
    except CHECKPOINT_ERRORS as err:
        _unusable(record, err)


DOWNLOADS = 8  # runs whose checkpoint files are fetched at once: each file waits on the network, not on this CPU


def fetch_all(
    store: Store, records: list[LoadedRun], cache_dir: Path, experiment_ids: tuple[str, ...] = ()
) -> list[LoadedRun]:
    """Fill each of ``records`` from its MLflow run; what cannot be had becomes its ``reason``. The runs are searched
    by id in ``experiment_ids`` (a request per hundred), their histories read in bulk (a request per metric and
    batch); a run not found there is asked for alone (another experiment, or not in MLflow: ``missing``). Then, per
    architecture (``architecture``), the lowest-seed run's checkpoint (the next one's when it does not load) with its
    model, parameters and FLOPs, and the history files (a request each) of the other runs up to each variant's
    ``HISTORY_SEEDS``-th completed seed, ``DOWNLOADS`` runs at a time: their models load on first use (a figure's or a
    claim's run); later seeds are ``metrics_only``. A study of a thousand seeds reads a handful of checkpoints and
    sixty runs' histories, not a thousand of either."""
    named = [r for r in records if r.run_id]
    found = store.runs([str(r.run_id) for r in named], list(experiment_ids))
    runs: dict[str, Any] = {}
    for record in records:
        if not record.run_id:
            record.status = MISSING if record.status in COMPLETED else record.status
            record.note("no MLflow run recorded in the manifest")
            continue
        try:
            runs[record.run_id] = found.get(record.run_id) or store.run(record.run_id)
        except TrackingError as err:
            record.status = MISSING
            record.note(f"run {record.run_id} not found at {store.uri} ({err.error_code})")
    histories = _histories_fetched(store, runs)
    fetched = [(r, runs[str(r.run_id)].info.artifact_uri) for r in named if str(r.run_id) in runs]
    for record, _ in fetched:
        _fill(record, runs[str(record.run_id)], histories[str(record.run_id)])
    groups: dict[str, list[tuple[LoadedRun, str]]] = {}
    for pair in sorted(fetched, key=lambda pair: pair[0].seed):
        key = architecture(pair[0])
        groups.setdefault(key if key is not None else f"run {pair[0].run_id}", []).append(pair)

    def first_loading(group: list[tuple[LoadedRun, str]]) -> tuple[LoadedRun | None, dict[str, Any], int]:
        for at, (record, artifact_uri) in enumerate(group):
            checkpoint = _checkpoint_into(store, record, cache_dir, artifact_uri)
            if record.model is not None:
                return record, checkpoint, at
        return None, {}, len(group)

    log.info("reading %d runs: one checkpoint per architecture (%d), the others' histories", len(fetched), len(groups))
    with ThreadPoolExecutor(DOWNLOADS) as pool:  # each record is its own: nothing shared but the store's client
        loaded = list(pool.map(first_loading, groups.values()))
        flops: dict[str, FlopCount] = {}  # per architecture
        for record, checkpoint, _ in loaded:
            if record is not None:
                _measure(record, checkpoint, flops)
        rest, read = [], Counter[str]()  # read: per variant, the completed runs whose histories are read
        for group, (first, _, at) in zip(groups.values(), loaded, strict=True):
            if first is None:
                continue
            read.update(record.variant for record, _ in group[: at + 1] if record.status in COMPLETED)
            wanted = _histories_wanted(first.model)  # the same files for the whole architecture
            for record, artifact_uri in group[at + 1 :]:
                if read[record.variant] >= HISTORY_SEEDS:
                    _metrics_only(record, first)
                    continue
                read[record.variant] += record.status in COMPLETED
                rest.append((record, first, wanted, artifact_uri))
        list(pool.map(lambda r: _same_architecture(store, r[0], r[1], r[2], cache_dir, r[3]), rest))
    return records


def fetch(store: Store, record: LoadedRun, cache_dir: Path) -> LoadedRun:
    """One run's ``fetch_all``."""
    return fetch_all(store, [record], cache_dir)[0]


def load_study(
    tune: TuneManifest,
    prune: FineTuneManifest | None,
    cache_dir: Path,
    transform: FineTuneManifest | None = None,
) -> LoadedStudy:
    """Every run named by ``tune`` (and ``prune``, ``transform``), fetched from the tune manifest's tracking URI (the
    prune manifest's, for its runs), checkpoints downloaded into ``cache_dir``."""
    store = Store(tune.tracking_uri)
    store.check_answers("the tune manifest's tracking_uri")
    runs = [LoadedRun(t.run_id, t.variant, int(t.seed), t.status, "tune") for t in tune.trials]
    fetch_all(store, runs, cache_dir, (tune.experiment_id,))
    if prune is not None:
        prune_store = store if prune.tracking_uri == tune.tracking_uri else Store(prune.tracking_uri)
        if prune_store is not store:
            prune_store.check_answers("the prune manifest's tracking_uri")
        pruned = []
        for model in prune.models:
            record = LoadedRun(model.run_id, model.variant + PRUNED_SUFFIX, int(model.seed), model.status, "prune")
            record.source_run_id = model.source_run_id
            record.pruned_heads = {
                (int(d["layer"]), int(d["head"])) for layer in model.decisions for d in layer if d.get("pruned")
            }
            pruned.append(record)
        fetch_all(prune_store, pruned, cache_dir, (prune.experiment_id,))
        for model, record in zip(prune.models, pruned, strict=True):
            if record.model is None and record.run_id:  # the manifest measured the pruned model itself
                record.n_params = float(model.params_after)
                record.flops_paper = float(model.flops_after.get("paper", math.nan))
                record.flops_full = float(model.flops_after.get("full", math.nan))
            runs.append(record)
        for skipped in prune.skipped or []:
            record = LoadedRun(
                skipped.get("run_id"),
                skipped.get("variant", "?") + PRUNED_SUFFIX,
                int(skipped.get("seed", -1)),
                "skipped",
                "prune",
            )
            record.note(f"not pruned: {skipped.get('reason', 'no reason given')}")
            runs.append(record)
    transformed = []
    for model in transform.models if transform is not None else []:
        record = LoadedRun(model.run_id, model.name, int(model.seed), model.status, "transform")
        record.source_run_id = model.source_run_id
        transformed.append(record)
    if transform is not None:
        fetch_all(Store(transform.tracking_uri), transformed, cache_dir, (transform.experiment_id,))
    for record in [*runs, *transformed]:
        if record.reason:
            log.warning("%s seed %d: %s", record.variant, record.seed, record.reason)
    return LoadedStudy(
        runs=runs,
        tracking_uri=tune.tracking_uri,
        experiment_id=tune.experiment_id,
        tune_parent_run_id=tune.parent_run_id,
        prune_parent_run_id=prune.parent_run_id if prune is not None else None,
        prune_rule=dict(prune.rule) if prune is not None else {},
        transformed=transformed,
        transform=transform,
    )


ANALYSIS_ROLE = "analysis"
# The colour the MLflow UI draws a run in: the tag its own colour picker writes (MLflow 3.17.2's UI reads and sets it).
RUN_COLOUR_TAG = "mlflow.runColor"


def colour_runs(study: LoadedStudy) -> int:
    """Give every run the study analysed its variant's figure colour in the MLflow UI (``RUN_COLOUR_TAG``); a colour
    a run has already (picked in the UI, or by an earlier analysis) is kept. Why: the UI colours a run from its id, so
    two variants often get nearly the same blue in its charts. Returns how many runs it coloured."""
    store = Store(study.tracking_uri)
    coloured = 0
    for record in [*study.runs, *study.transformed]:
        if not record.run_id or not record.tags or RUN_COLOUR_TAG in record.tags:  # no run fetched, or coloured
            continue
        colour = variant_style(record.variant).colour
        try:
            store.set_tag(record.run_id, RUN_COLOUR_TAG, colour)
        except TrackingError as err:  # a run in another store (a prune manifest's own tracking_uri): left as is
            log.info("MLflow: run %s not coloured (%s)", record.run_id, err.error_code)
            continue
        record.tags[RUN_COLOUR_TAG] = colour
        coloured += 1
    return coloured


def log_analysis_run(
    study: LoadedStudy,
    inputs_hash: str,
    files: dict[str, list[Path]],
    tables: dict[str, pd.DataFrame],
    metrics: dict[str, float],
) -> str:
    """Log the outputs as artifacts of ONE ``analysis`` run in the study's experiment; returns its id.

    ``files``: artifact folder -> local files (``log_artifact``); ``tables``: artifact file -> frame (``log_table``,
    shown as a table in the MLflow UI). The run is tagged with the tune (and prune) parent run ids and
    ``analysis.inputs_hash``: a re-run on the same inputs reuses its run (artifacts overwritten in place), a run
    on new inputs replaces (deletes) the earlier analysis runs of the same sweep, so they never pile up. It is not a
    child of the sweep's parent run (``mlflow.parentRunId``), which holds one child per trial.
    """
    store = Store(study.tracking_uri)
    query = f"tags.`analysis.role` = '{ANALYSIS_ROLE}' and "
    query += f"tags.`analysis.tune_parent_run_id` = '{study.tune_parent_run_id}'"
    earlier = store.search(study.experiment_id, query, max_results=100)
    same = [r for r in earlier if r.data.tags.get("analysis.inputs_hash") == inputs_hash]
    for run in earlier:
        if not same or run.info.run_id != same[0].info.run_id:
            store.delete_run(run.info.run_id)
            log.info("MLflow: replaced analysis run %s (other inputs)", run.info.run_id)
    tags = {
        "analysis.role": ANALYSIS_ROLE,
        "analysis.inputs_hash": inputs_hash,
        "analysis.tune_parent_run_id": study.tune_parent_run_id,
    }
    if study.prune_parent_run_id:
        tags["analysis.prune_parent_run_id"] = study.prune_parent_run_id
    reopened = same[0].info.run_id if same else None
    if reopened is not None:
        log.info("MLflow: reusing analysis run %s (same inputs)", reopened)
        name = ""
    else:  # named after the sweep it analyses (``analysis of tune sunny-bass``): several analyses are told apart
        name = f"analysis of {store.run(study.tune_parent_run_id).info.run_name}"
    run_id = store.write_run(study.experiment_id, reopened, name, tags, files, tables, metrics)
    if reopened is None:
        log.info("MLflow: analysis run %s", run_id)
    return run_id
