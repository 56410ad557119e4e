"""Prune and fine-tune: each planned model is evaluated right after pruning, saved, and fine-tuned as a Ray Tune trial.

Fine-tuning goes through the sweep's own machinery (``pipeline.sweep.run``): the same trainable (started from the
pruned weights, ``init_from``), retries from checkpoints, restore after Ctrl-C, GPU resources per trial, one MLflow
child run per model under a ``prune-<hash>`` parent run in the sweep's experiment. Each child run starts at step 0
with the accuracy right after pruning, so the MLflow UI shows the dip and the recovery on one chart (the paper's
Fig. 8), and carries the per-head decisions as a JSON artifact. The source run is tagged with its pruned child.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from ray import tune

from pipeline.config import AshaConfig, Params, params_hash, parse_params
from pipeline.data.prepared import PreparedData, content_hash
from pipeline.prune.manifest import STAGE, PrunedModel, PruneManifest
from pipeline.prune.plan import PrunePlan
from pipeline.sweep import tracking
from pipeline.sweep.identity import code_hash
from pipeline.sweep.manifest import ERROR, FINISHED, INTERRUPTED, TrialRecord, TuneManifest
from pipeline.sweep.plan import storage_dir
from pipeline.sweep.reuse import KEY_TAG, REUSE, TrialPlan, decide, find_runs, read_plan, write_plan
from pipeline.sweep.run import fit_tracked, trial_config, trial_run_info
from pipeline.sweep.storage import StoragePath, driver_dir
from pipeline.sweep.summary import register_best_models
from pipeline.sweep.tracking_buffer import flush_buffers
from pipeline.trial.checkpoint import save_model_checkpoint
from pipeline.trial.device import resolve_device
from pipeline.trial.loop import DeviceData, evaluate

log = logging.getLogger(__name__)


@dataclass
class PruneOutcome:
    manifest: PruneManifest
    interrupted: bool = False
    failed: bool = False


def finetune_params(params: Params) -> Params:
    """The sweep's params as the fine-tuning trials see them: lr x ``prune.lr_factor``, ``prune.epochs`` epochs, no
    ASHA (every pruned model trains to the end)."""
    cfg = params.prune
    train = params.train.model_copy(update={"lr": params.train.lr * cfg.lr_factor, "epochs": cfg.epochs})
    sweep = params.sweep.model_copy(update={"asha": AshaConfig(enabled=False)})
    return parse_params(params.model_copy(update={"train": train, "sweep": sweep}).model_dump(mode="json"))


def prune_key(params: Params, plan: PrunePlan) -> str:
    """Identity of one pruned and fine-tuned model: its source trial's identity (model, train config with seed, data,
    trial code, which holds the pruning rule) and the prune config. A finished fine-tuning run of the same key is
    reused; a source without a key (a manifest written before trial keys) is named by its run and the trial code."""
    source = plan.source.trial_key or {"run": plan.source.run_id, "code": code_hash()}
    return params_hash({"source": source, "prune": params.prune.model_dump(mode="json")})


def prune_decisions(params: Params, tune_manifest: TuneManifest, plans: list[PrunePlan]) -> dict[str, TrialPlan]:
    """Per planned model (by ``PrunePlan.key``): reuse its finished fine-tuning run, resume an unfinished one, or
    train (``pipeline.sweep.reuse``), looked up in the sweep's MLflow experiment."""
    keys = {plan.key: prune_key(params, plan) for plan in plans}
    found = find_runs(MlflowClient(tune_manifest.tracking_uri), tune_manifest.experiment_id, keys.values())
    epochs = finetune_params(params).train.epochs
    return {plan.key: decide(plan.source.variant, plan.source.seed, keys[plan.key], found[keys[plan.key]], epochs,
                             retrain=params.sweep.retrain) for plan in plans}  # fmt: skip


def prune_name(keys: list[str]) -> str:
    """``prune-<hash>`` of the pruned models' keys: the Ray experiment and MLflow parent run of one prune run."""
    return f"{STAGE}-{params_hash({'models': sorted(keys)})}"


def finetune_run_info(
    config: dict[str, Any], params_json: dict[str, Any], data_hash: str, plans: dict[str, dict]
) -> tracking.TrialInfo:
    """The fine-tuning run of one pruned model: the trial's run info plus where it came from and what was cut; its
    ``trial_key`` is the pruned model's identity (``prune_key``)."""
    info = trial_run_info(config, params_json, data_hash)
    plan = plans[f"{config['variant']}-seed{config['seed']}"]
    per_layer = {f"prune.pruned_heads.layer{i + 1}": str(n) for i, n in enumerate(plan["pruned_heads"])}
    return tracking.TrialInfo(
        run_name=f"{info.run_name}-pruned",
        params={**info.params, **per_layer, "prune.heads_per_layer": str(plan["heads_per_layer"]),
                "prune.source_run_id": plan["source_run_id"]},
        tags={**info.tags, KEY_TAG: plan["prune_key"], "source_run_id": plan["source_run_id"],
              "prune.pruned_heads": str(plan["pruned_heads"]), "prune.pruned_dir": plan["pruned_dir"]},
        start_metrics={"test_acc": plan["acc_after_pruning"], "test_loss": plan["loss_after_pruning"]},
        start_artifacts={"pruning_decisions.json": plan["decisions"]},
    )  # fmt: skip


def _evaluate(plan: PrunePlan, data: DeviceData, params: Params) -> tuple[float, float]:
    """Test loss and accuracy of the pruned model before any fine-tuning (the dip of Fig. 8)."""
    device = data.test_labels.device
    model = plan.model.to(device)
    loss, accuracy = evaluate(model, data.test_images, data.test_labels, data, params.train.eval_batch_size, None)
    plan.model = model.cpu()
    return loss, accuracy


def run_prune(params: Params, data: PreparedData, project_root: Path, tune_manifest: TuneManifest,
              plans: list[PrunePlan], skipped: list[dict[str, str]]) -> PruneOutcome:  # fmt: skip
    """Fine-tune every planned model whose identity has no finished fine-tuning run yet (evaluated and saved first);
    the manifest names each model's fine-tuning run, reused or new."""
    rule = {**params.prune.model_dump(mode="json"), "finetune_lr": params.train.lr * params.prune.lr_factor}
    if not plans:
        log.info("nothing to prune (no finished trial of %s)", params.prune_variants())
        empty = PruneManifest("", "", tune_manifest.experiment_name, tune_manifest.tracking_uri,
                              tune_manifest.experiment_id, "", rule, [], skipped)  # fmt: skip
        return PruneOutcome(empty)
    storage = storage_dir(params, project_root)
    local = driver_dir(storage, project_root)  # what the driver keeps on its own disk (the outage buffer)
    flush_buffers(storage, local)  # what an outage left buffered, before reuse reads runs
    keys = {plan.key: prune_key(params, plan) for plan in plans}
    name = prune_name(list(keys.values()))
    path = storage / name
    uri = tune_manifest.tracking_uri
    client = MlflowClient(uri)
    tuned = finetune_params(params)
    restore = tune.Tuner.can_restore(str(path))
    # A restored prune run continues its own plan (its Tune experiment holds exactly those trials).
    decided = read_plan(path) if restore else None
    decided = decided or list(prune_decisions(params, tune_manifest, plans).values())
    by_plan = {f"{d.variant}-seed{d.seed}": d for d in decided}
    to_train = [plan for plan in plans if by_plan[plan.key].action != REUSE]
    log.info("prune %s: %s", name, ", ".join(f"{p.key}: {by_plan[p.key].describe()}" for p in plans))

    device = resolve_device(params.train)
    on_device = DeviceData.from_prepared(data, device) if to_train else None
    summaries: dict[str, dict] = {}
    trials = []
    for plan in to_train:
        loss, accuracy = _evaluate(plan, on_device, params)
        pruned_dir = path / "pruned" / plan.key  # where every node's fine-tuning trial reads it (init_from)
        _save_pruned(pruned_dir, plan, params)
        log.info("%s: heads cut per layer %s; params %s -> %s; test acc %.4f -> %.4f right after pruning", plan.key,
                 plan.pruned_heads, f"{plan.params_before:,}", f"{plan.params_after:,}",
                 plan.source.metrics.get("test_acc", float("nan")), accuracy)  # fmt: skip
        summaries[plan.key] = {
            "source_run_id": str(plan.source.run_id), "pruned_heads": plan.pruned_heads,
            "heads_per_layer": plan.heads_per_layer, "acc_after_pruning": accuracy, "loss_after_pruning": loss,
            "decisions": plan.decisions, "pruned_dir": str(pruned_dir), "prune_key": keys[plan.key],
        }  # fmt: skip
        trials.append({**trial_config(by_plan[plan.key]), "init_from": str(pruned_dir)})

    experiment = client.get_experiment(tune_manifest.experiment_id).name
    commit = tracking.git_commit(project_root)
    base_tags = {"dvc_stage": STAGE, "params_hash": name.removeprefix(f"{STAGE}-"), "git_commit": commit}
    sweep = tracking.open_sweep_run(
        uri, experiment, path, run_name=name,
        tags={**base_tags, "ray.experiment_path": str(path), "sweep.role": "parent",
              "prune.source_sweep_run_id": tune_manifest.parent_run_id},
        params=tracking.flatten({"prune": rule, "sources": len(plans)}), project_root=project_root,
        default_store=params.tracking.uri is None,
    )  # fmt: skip
    write_plan(path, decided)
    run_info = functools.partial(finetune_run_info, params_json=tuned.model_dump(mode="json"),
                                 data_hash=content_hash(data), plans=summaries)  # fmt: skip
    callback = tracking.MlflowTrialCallback(sweep, run_info, base_tags, tuned.train.epochs, None, local / name, storage)
    records = fit_tracked(tuned, data, path, sweep, callback, restore=restore, trials=trials) if trials else []
    by_key = {f"{r.variant}-seed{r.seed}": r for r in records}
    models = [
        _pruned_model(plan, summaries[plan.key], by_key.get(plan.key)) if plan.key in summaries
        else _reused_model(plan, client, by_plan[plan.key])
        for plan in plans
    ]  # fmt: skip
    for model in models:
        model.prune_key = keys[f"{model.variant}-seed{model.seed}"]
        if model.run_id and model.source_run_id and not model.reused:
            client.set_tag(model.source_run_id, "prune.child_run_id", model.run_id)
    manifest = PruneManifest(name, str(path), tune_manifest.experiment_name, uri, tune_manifest.experiment_id,
                             sweep.parent_run_id, rule, models, skipped)  # fmt: skip
    outcome = PruneOutcome(
        manifest, any(m.status == INTERRUPTED for m in models), any(m.status == ERROR for m in models)
    )
    if outcome.interrupted:
        closed = tracking.close_interrupted(callback)
        log.warning("fine-tuning interrupted: %d run(s) marked KILLED; re-run to restore it from %s", closed, path)
    else:
        listed = [{**by_plan[f"{m.variant}-seed{m.seed}"].to_dict(), "run_id": m.run_id} for m in models]
        tracking.record_sweep_trials(sweep, listed, callback.buffer)
        register_best_models(uri, experiment, records, suffix="_pruned")
        tracking.finish_sweep(sweep, "FAILED" if outcome.failed else "FINISHED",
                              {"prune.models": str(len(models)),
                               "prune.models_reused": str(sum(m.reused for m in models))}, callback.buffer)  # fmt: skip
    return outcome


def _save_pruned(where: StoragePath, plan: PrunePlan, params: Params) -> None:
    """The pruned model as a checkpoint folder at ``where``: written in place, or staged on this disk and uploaded
    when the storage is a bucket."""

    def save(folder: Path) -> None:
        save_model_checkpoint(folder, plan.model, params.model_for(plan.source.variant), image_shape=plan.image_shape,
                              num_classes=plan.num_classes)  # fmt: skip

    if not where.remote:
        save(where.local)
        return
    with tempfile.TemporaryDirectory(prefix="pruned-") as staging:
        save(Path(staging))
        where.upload(Path(staging))


def _reused_model(plan: PrunePlan, client: MlflowClient, decided: TrialPlan) -> PrunedModel:
    """A pruned model whose fine-tuning already finished in an earlier prune run: its figures come from that run (the
    accuracy right after pruning is its step-0 metric)."""
    run = client.get_run(str(decided.run_id))
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "test_acc")}
    metrics = {**run.data.metrics, "epoch": float(decided.epoch)}
    return PrunedModel(
        source_run_id=str(plan.source.run_id), source_trial_id=plan.source.trial_id, variant=plan.source.variant,
        seed=plan.source.seed, run_id=run.info.run_id, run_name=run.info.run_name, status=FINISHED,
        epochs_completed=decided.epoch, pruned_heads=plan.pruned_heads, heads_per_layer=plan.heads_per_layer,
        params_before=plan.params_before, params_after=plan.params_after, flops_before=plan.flops_before,
        flops_after=plan.flops_after, acc_before_pruning=float(plan.source.metrics.get("test_acc", float("nan"))),
        acc_after_pruning=history.get(0, float("nan")), acc_after_finetune=run.data.metrics.get("test_acc"),
        pruned_checkpoint_dir=run.data.tags.get("prune.pruned_dir", ""), checkpoint_dir=decided.checkpoint_dir,
        decisions=plan.decisions, metrics=metrics, reused=True,
    )  # fmt: skip


def _pruned_model(plan: PrunePlan, summary: dict, record: TrialRecord | None) -> PrunedModel:
    metrics = record.metrics if record else {}
    return PrunedModel(
        source_run_id=str(plan.source.run_id), source_trial_id=plan.source.trial_id, variant=plan.source.variant,
        seed=plan.source.seed, run_id=record.run_id if record else None, run_name=record.run_name if record else None,
        status=record.status if record else INTERRUPTED, epochs_completed=record.epochs_completed if record else 0,
        pruned_heads=plan.pruned_heads, heads_per_layer=plan.heads_per_layer, params_before=plan.params_before,
        params_after=plan.params_after, flops_before=plan.flops_before, flops_after=plan.flops_after,
        acc_before_pruning=float(plan.source.metrics.get("test_acc", float("nan"))),
        acc_after_pruning=summary["acc_after_pruning"], acc_after_finetune=metrics.get("test_acc"),
        pruned_checkpoint_dir=summary["pruned_dir"], checkpoint_dir=record.checkpoint_dir if record else None,
        decisions=plan.decisions, metrics=metrics,
    )  # fmt: skip
