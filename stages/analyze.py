"""Tables, figures and a report from the runs the tune (and prune) manifests name, fetched from MLflow.

Reads:  params.yaml section data (the setting the report states) and data/prepared/ (its manifest: the test set's
        size, for the accuracies' binomial intervals, and the validation set's, for the setting; its test images,
        which the representations are compared on: CKA); results/tune/manifest.json (stages.tune);
        results/prune/manifest.json when present (stages.prune; without it the report says the pruned models wait);
        results/transform/manifest.json when present (stages.transform: the rebuilt ResNet18's section).
        Every run is fetched by id from the manifest's MLflow tracking URI and its checkpoint/ artifact downloaded
        through MLflow, so this runs anywhere the MLflow server answers (never from the manifests' local paths).
Writes (one row, entry, series and figures per variant the manifests name, the paper's or not; docs/study.md):
        results/tables/claims.csv               per claim (the paper's and ours): verdict by rule, statistic, test,
                                                setting, runs, device-seconds (analysis/claims.py): the report's
                                                first table
        results/tables/compute.csv              per run: device-seconds (every attempt) and training seconds
        results/tables/accuracy.{md,csv,tex}   every variant's accuracy and size, the paper's figures beside its models
        results/tables/runs.csv                 one row per run (with why a run is left out)
        results/tables/heads.csv                per run, layer and head: geometry and last measured locality
        results/tables/conv_like_heads.csv      per variant and layer: heads within a 3x3 kernel's reach
        results/tables/head_motion.csv          per Gaussian-encoding run, epoch and layer: displacement from init,
                                                heads at distinct shifts, ... (analysis/head_motion.py); every epoch
                                                of each variant's lowest seed, init and last epoch of other seeds
        results/figures/*.png                   Figs. 2, 4/8, Theorem 1, locality per layer during training, and per
                                                self-attention variant its contours or attention maps (Figs. 3, 6, 7,
                                                10 for the paper's) and convolution-likeness; per Gaussian encoding
                                                its head centres during training (Fig. 2 for SA quadratic)
        results/tables/transform_motion.csv     per rebuilt ResNet18 and converted layer: how far its heads moved
                                                from their exact kernel taps during fine-tuning
        results/tables/cka_<variant>.csv        per self-attention variant (and rebuilt ResNet18): linear CKA of each
                                                of its layers against each ResNet18 stage, on the test set
        results/analysis/metrics.json           per variant: params, FLOPs, the finding's numbers (a plain
                                                output: the accuracies DVC compares are the training stages')
        results/plots/accuracy.csv              variant, model, colour, seed, epoch, test_acc (`dvc plots show`)
        results/plots/locality.csv              ..., layer, mean_distance, entropy, peak_probability
        results/report.md                       the setting, the tables, the finding's numbers (head displacement,
                                                heads at distinct shifts, accuracy gap to ResNet18) beside Fig. 2,
                                                every figure with a sentence
Side effect: one MLflow run named `analysis` in the sweep's experiment holding these files as artifacts, tagged
with the tune (and prune) parent run ids; re-running on the same inputs reuses it, on new inputs replaces it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config import Params
from pipeline.finetune.manifest import read_finetune_manifest
from pipeline.finetune.prune import PrunedModel
from pipeline.finetune.transform import TransformedModel
from pipeline.io import check_store
from pipeline.sweep.location import adopt_default_store, store_root
from pipeline.sweep.manifest import read_tune_manifest
from stages._cli import main_for, make_parser

if TYPE_CHECKING:
    import torch

log = logging.getLogger("stages.analyze")
TUNE_MANIFEST = Path("results/tune/manifest.json")
PRUNE_MANIFEST = Path("results/prune/manifest.json")
TRANSFORM_MANIFEST = Path("results/transform/manifest.json")


def inputs_hash(data: dict, *manifests: Path) -> str:
    """What the analysis is a function of (besides its code): the setting and the manifests' contents."""
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode())
    for path in manifests:
        digest.update(path.read_bytes() if path.is_file() else b"<none>")
    return digest.hexdigest()[:16]


def test_set_size(prepared_dir: Path) -> int | None:
    """The prepared test set's size (its manifest's ``num_test``), for the accuracies' intervals; None, with a
    warning (the report says so too), when the prepared data is not on this machine."""
    manifest = prepared_dir / "manifest.json"
    if not manifest.is_file():
        log.warning("no %s: the report's accuracies get no intervals", manifest)
        return None
    return int(json.loads(manifest.read_text(encoding="utf-8"))["num_test"])


def validation_set_size(prepared_dir: Path) -> int | None:
    """The prepared validation set's size (``num_val``), for the setting line; None without one (the authors'
    protocol, ``data.validation_fraction: 0``) or without the prepared data here."""
    manifest = prepared_dir / "manifest.json"
    if not manifest.is_file():
        return None
    return json.loads(manifest.read_text(encoding="utf-8")).get("num_val")


def stage(args: argparse.Namespace, params: Params) -> int:
    root = store_root(Path.cwd())  # the manifests' paths and the default store are the project's
    tune = read_tune_manifest(args.tune_manifest, root)  # bad input fails here, before anything is written
    prune = (
        read_finetune_manifest(args.prune_manifest, "prune", PrunedModel, root)
        if args.prune_manifest.is_file()
        else None
    )
    transform = (
        read_finetune_manifest(args.transform_manifest, "transform", TransformedModel, root)
        if args.transform_manifest.is_file()
        else None
    )
    check_store(tune.tracking_uri, args.tune_manifest)  # missing or corrupt: named, never a new empty store
    adopt_default_store(tune.tracking_uri, params.tracking.uri, root)  # a copied or moved project reads its own
    if prune is None:
        log.info("no %s: the pruned row and Fig. 7's marks wait for the prune stage", args.prune_manifest)
    # MLflow, torch and matplotlib are imported after the inputs are known good: --help and bad input stay fast.
    from analysis.runs import RUN_COLOUR_TAG, colour_runs, load_study, log_analysis_run
    from analysis.study import Layout, setting_of, write_outputs

    data = params.data.model_dump(mode="json")
    test_images = test_set_size(Path(params.data.prepared_dir))
    with tempfile.TemporaryDirectory(prefix="analysis-artifacts-") as cache:
        log.info(
            "step 1/3: fetching %d runs from %s",
            len(tune.trials) + len(prune.models if prune else []) + len(transform.models if transform else []),
            tune.tracking_uri,
        )
        study = load_study(tune, prune, Path(cache), transform)
        log.info("step 2/3: writing tables, figures and the report")
        setting = setting_of(data, study) | ({"test images": test_images} if test_images else {})
        if validation_images := validation_set_size(Path(params.data.prepared_dir)):  # where the best epoch is chosen
            setting["validation images"] = validation_images
        images, labels = normalised_test_set(Path(params.data.prepared_dir))
        outputs = write_outputs(study, setting, Layout(Path.cwd()), test_images, images, labels)
    if args.no_mlflow:
        return 0
    log.info("step 3/3: logging the outputs to MLflow")
    if coloured := colour_runs(study):
        log.info("MLflow: %d runs drawn in their variants' figure colours (tag %s)", coloured, RUN_COLOUR_TAG)
    metrics = {f"{v}.test_acc_mean": s["test_acc_mean"] for v, s in outputs.summary.items() if s["test_acc_mean"]}
    run_id = log_analysis_run(
        study,
        inputs_hash(data, args.tune_manifest, args.prune_manifest, args.transform_manifest),
        outputs.files,
        {"tables/accuracy.json": outputs.table, "tables/heads.json": outputs.heads},
        metrics,
    )
    log.info("analysis run %s in experiment %s (%s)", run_id, study.experiment_id, study.tracking_uri)
    return 0


def normalised_test_set(prepared_dir: Path) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The prepared test images, normalised as the models saw them (representations are compared on them: CKA), and
    their labels (the claims pair two models' answers per image); None, None, with a line saying so, when the data
    is not prepared here."""
    import torch  # here, not at the top: --help and bad input stay fast

    from pipeline.data.prepared import load_prepared
    from pipeline.trial.device_data import DeviceData

    if not (prepared_dir / "manifest.json").is_file():
        log.info("no prepared data at %s: the CKA section and the per-image pairing wait for it", prepared_dir)
        return None, None
    data = DeviceData.from_prepared(load_prepared(prepared_dir), torch.device("cpu"))
    return data.normalise(data.test_images.float().div(255)), data.test_labels


parser = make_parser(__doc__)
parser.add_argument("--tune-manifest", type=Path, default=TUNE_MANIFEST, help="default: %(default)s")
parser.add_argument("--prune-manifest", type=Path, default=PRUNE_MANIFEST, help="if present; default: %(default)s")
parser.add_argument("--transform-manifest", type=Path, default=TRANSFORM_MANIFEST, help="if present; %(default)s")
parser.add_argument("--no-mlflow", action="store_true", help="write the files only; log no analysis run to MLflow")
main = main_for(stage, parser)

if __name__ == "__main__":
    sys.exit(main())
