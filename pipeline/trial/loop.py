"""One trial: train a model of the paper on prepared data, reporting metrics and a checkpoint every epoch.

The schedule is the paper's (App. A.4): SGD with momentum, weight decay except on the Gaussian encodings'
centres and spreads, cosine decay after a linear warm-up over ``warmup_fraction`` of training. ``schedule:
epoch`` reproduces the authors' code, which steps that schedule once per epoch (so epoch 0 trains at lr 0);
``schedule: step`` updates it every optimiser step.

The whole dataset stays in memory on the training device (uint8), and shuffling and augmentation are batched tensor
ops drawn from one explicit CPU ``torch.Generator``, a whole epoch's at its start: no DataLoader workers, the same
draws on CPU and GPU, and no step waiting on the host. Every RNG state (that generator, torch's global CPU generator
used by dropout, CUDA's when used) is checkpointed, so a run resumed from epoch k's checkpoint ends with bit-for-bit
the weights of an uninterrupted run on the CPU. A caller's ``stop`` check, asked before every batch, ends a trial
mid-epoch with a checkpoint of the epoch in progress (``EpochProgress``): resumed from it, the trial finishes that
epoch from the next batch, again bit for bit. That is how a trial leaves a node being drained
(``pipeline.trial.preemption``) losing no finished batch.

``run_trial`` knows nothing about Ray or MLflow: the caller's ``reporter`` receives each epoch's scalar
metrics and a checkpoint directory that is valid only during the call (Ray copies it; a test may just read
it).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from pipeline.config import ModelConfig, TrainConfig
from pipeline.data.subset import class_balanced_subset
from pipeline.trial.augment import apply_augmentation, draw_augmentation
from pipeline.trial.checkpoint import (
    EpochProgress,
    Trial,
    build_for_data,
    head_snapshot,
    load_checkpoint,
    load_head_history,
    load_locality_history,
    restore_rng,
    rng_state,
    write_checkpoint,
)
from pipeline.trial.device import (
    autocast,
    autocast_dtype,
    device_tags,
    flush_subnormals,
    resolve_device,
    synchronize,
)
from pipeline.trial.device_data import DeviceData
from pipeline.trial.locality import layer_summary, measure_locality
from pipeline.trial.report import INITIAL_PREFIX, METRIC_KEYS, VALIDATION_KEYS
from pipeline.trial.whole_step import MODE as WHOLE_STEP
from pipeline.trial.whole_step import WholeStep, require_cuda

if TYPE_CHECKING:
    from pipeline.data.prepared import PreparedData

log = logging.getLogger(__name__)

Reporter = Callable[[dict[str, float], Path], None]  # (epoch metrics, checkpoint dir valid only during the call)
Stopped = Callable[[Path], None]  # (a mid-epoch checkpoint dir valid only during the call)


class EpochInterrupted(Exception):
    """``train_one_epoch`` stopped between two batches because its ``stop`` check said so; ``progress`` is how far the
    epoch got (its ``seconds`` are the caller's to fill in)."""

    def __init__(self, progress: EpochProgress) -> None:
        super().__init__(f"stopped after {progress.steps} batches of the epoch")
        self.progress = progress


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite; training on from there would only produce garbage."""

    def __init__(self, epoch: int, step: int, loss: float) -> None:
        super().__init__(
            f"training diverged: loss is {loss} at epoch {epoch}, step {step} of that epoch "
            "(lower train.lr, or check the inputs and their normalisation)"
        )
        self.epoch, self.step, self.loss = epoch, step, loss

    def __reduce__(self) -> tuple[Any, ...]:  # Ray pickles trial errors; the default would lose the arguments
        return (DivergedError, (self.epoch, self.step, self.loss))


# ----------------------------------------------------------------------------------------------------
# Optimiser and schedule
# ----------------------------------------------------------------------------------------------------


class WarmupCosine:
    """Learning-rate factor at schedule position ``t`` (optimiser step or epoch): linear warm-up, then cosine.

    The authors' formula: ``t / T_warmup`` while ``t < T_warmup = int(total * warmup_fraction)``, then
    ``(1 + cos(pi * progress)) / 2``. A class rather than a closure so that ``LambdaLR.state_dict`` stores it.
    """

    def __init__(self, total: int, warmup_fraction: float) -> None:
        self.total = total
        self.warmup = int(total * warmup_fraction)

    def __call__(self, t: int) -> float:
        if t < self.warmup:
            return t / self.warmup
        progress = min(1.0, (t - self.warmup) / max(1, self.total - self.warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.SGD:
    """SGD with two parameter groups: ``decay``, and ``no_decay`` for ``model.no_weight_decay()`` (the Gaussian
    encodings' centres and spreads), which also trains at ``lr x positional_lr_factor``."""
    skip = model.no_weight_decay()
    named = dict(model.named_parameters())
    unknown = skip - named.keys()
    assert not unknown, f"no_weight_decay names parameters the model does not have: {sorted(unknown)}"
    groups = [
        {
            "name": "decay",
            "weight_decay": cfg.weight_decay,
            "params": [p for n, p in named.items() if n not in skip],
        },
        {
            "name": "no_decay",
            "weight_decay": 0.0,
            "lr": cfg.lr * cfg.positional_lr_factor,
            "params": [p for n, p in named.items() if n in skip],
        },
    ]
    return torch.optim.SGD([g for g in groups if g["params"]], lr=cfg.lr, momentum=cfg.momentum)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, steps_per_epoch: int) -> LambdaLR:
    """Warm-up + cosine over the whole run, in optimiser steps (``schedule: step``) or epochs (``epoch``)."""
    total = cfg.epochs * steps_per_epoch if cfg.schedule == "step" else cfg.epochs
    return LambdaLR(optimizer, WarmupCosine(total, cfg.warmup_fraction))


# ----------------------------------------------------------------------------------------------------
# One epoch of training, one evaluation
# ----------------------------------------------------------------------------------------------------


def train_one_epoch(
    trial: Trial,
    data: DeviceData,
    cfg: TrainConfig,
    amp_dtype: torch.dtype | None,
    stop: Callable[[], bool] | None = None,
) -> dict[str, float]:
    """One pass over the shuffled training set; returns mean loss, accuracy and the last step's lr.

    No step makes the host wait for the device: the shuffle and the augmentation of the whole epoch are drawn at its
    start and moved to the device once, and each step's loss is kept on the device. The epoch's end (or a ``stop``)
    is the sync point where a non-finite loss is looked for: then ``DivergedError`` names the first such step, and the
    trial fails before anything of the epoch is reported or checkpointed (the weights past that step are garbage,
    never kept).

    A trial holding ``progress`` (resumed from a mid-epoch checkpoint) finishes that epoch: the same shuffle and
    augmentation, from the next batch. ``stop``, asked before every batch, raises ``EpochInterrupted`` when it returns
    True. ``trial.whole_step`` (``train.compile: whole-step``), when set, runs every full batch as one CUDA graph.
    """
    model, optimizer, scheduler = trial.model, trial.optimizer, trial.scheduler
    model.train()
    device = data.train_labels.device
    n = data.train_labels.numel()
    progress = trial.progress
    start_rng = progress.start_rng if progress is not None else trial.generator.get_state()
    trial.generator.set_state(start_rng)  # a resumed epoch draws again what its first run drew
    order = torch.randperm(n, generator=trial.generator).to(device)  # (N,)
    sizes = [min(cfg.batch_size, n - start) for start in range(0, n, cfg.batch_size)]
    if cfg.augment:
        offsets, flips = (
            t.to(device) for t in draw_augmentation(sizes, cfg.crop_padding, trial.generator, hflip=cfg.hflip)
        )
    loss_sum = torch.tensor(progress.loss_sum if progress else 0.0, device=device)  # float32, as the sum was
    correct = torch.tensor(progress.correct if progress else 0, dtype=torch.int64, device=device)
    losses = torch.zeros(len(sizes), device=device)  # each step's loss: the divergence check reads them at the end
    lr = progress.lr if progress else optimizer.param_groups[0]["lr"]
    done = progress.steps if progress else 0
    for step, start in enumerate(range(0, n, cfg.batch_size)):
        if step < done:
            continue
        if stop is not None and stop():
            _check_finite(losses[done:step], trial.epoch + 1, done)
            raise EpochInterrupted(EpochProgress(start_rng, step, loss_sum.item(), int(correct.item()), lr))
        batch = slice(start, start + cfg.batch_size)
        augmentation = (offsets[:, batch], flips[batch]) if cfg.augment else None
        lr = optimizer.param_groups[0]["lr"]
        if trial.whole_step is not None and sizes[step] == cfg.batch_size:
            loss, hits = trial.whole_step(order[batch], augmentation)
        else:
            loss, hits = train_step(trial, data, cfg, amp_dtype, order[batch], augmentation)
        if cfg.schedule == "step":
            scheduler.step()
        losses[step] = loss
        loss_sum += loss * sizes[step]
        correct += hits
    _check_finite(losses[done:], trial.epoch + 1, done)
    if cfg.schedule == "epoch":
        scheduler.step()
    return {"train_loss": loss_sum.item() / n, "train_acc": correct.item() / n, "lr": lr}


def train_step(
    trial: Trial,
    data: DeviceData,
    cfg: TrainConfig,
    amp_dtype: torch.dtype | None,
    index: Tensor,
    augmentation: tuple[Tensor, Tensor] | None,
) -> tuple[Tensor, Tensor]:
    """One optimiser step on the training images at ``index`` (B,), with their crops and flips (``augmentation``):
    returns the loss (detached) and the number of correct predictions, both on the device, without a host sync."""
    images = data.train_images[index].float().div_(255)  # (B, C, H, W) in [0, 1]
    if augmentation is not None:
        images = apply_augmentation(images, cfg.crop_padding, *augmentation)
    labels = data.train_labels[index]  # (B,)
    with autocast(images.device, amp_dtype):
        logits = trial.runner(data.normalise(images))  # (B, classes)
    loss = F.cross_entropy(logits.float(), labels)
    trial.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    trial.optimizer.step()
    return loss.detach(), (logits.argmax(dim=1) == labels).sum()


def _check_finite(losses: Tensor, epoch: int, first_step: int) -> None:
    """Raise ``DivergedError`` for the first non-finite of ``losses`` (steps ``first_step``... of the epoch): the one
    host sync of the divergence check, at the epoch's end."""
    finite = torch.isfinite(losses)
    if not bool(finite.all()):
        bad = int((~finite).nonzero()[0, 0])
        raise DivergedError(epoch, first_step + bad, float(losses[bad]))


@torch.no_grad()  # not inference_mode: encodings cache offset tensors that training later uses in autograd
def evaluate(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    data: DeviceData,
    batch_size: int,
    amp_dtype: torch.dtype | None,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` (in eval mode) on uint8 ``images`` (N, C, H, W)."""
    model.eval()
    loss_sum = torch.zeros((), device=images.device)
    correct = torch.zeros((), dtype=torch.int64, device=images.device)
    for start in range(0, labels.numel(), batch_size):
        batch = data.normalise(images[start : start + batch_size].float().div_(255))  # (B, C, H, W)
        target = labels[start : start + batch_size]
        with autocast(images.device, amp_dtype):
            logits = model(batch).float()  # (B, classes)
        loss_sum += F.cross_entropy(logits, target, reduction="sum")
        correct += (logits.argmax(dim=1) == target).sum()
    return loss_sum.item() / labels.numel(), correct.item() / labels.numel()


# ----------------------------------------------------------------------------------------------------
# The trial
# ----------------------------------------------------------------------------------------------------


def _start(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    data: PreparedData,
    device: torch.device,
    *,
    resume: dict | None,
    init: dict | None,
    heads_per_layer: list[int] | None,
) -> Trial:
    """Build model, optimiser, scheduler and generator: fresh (seeded), from ``init`` weights, or resumed."""
    torch.manual_seed(train_cfg.seed)  # model init and dropout; also seeds CUDA
    source = resume or init
    if heads_per_layer is None and source is not None:
        heads_per_layer = source["heads_per_layer"]
    model = build_for_data(model_cfg, data.image_shape, data.num_classes, heads_per_layer)
    if source is not None:
        model.load_state_dict(source["model"])
    model.to(device)
    optimizer = build_optimizer(model, train_cfg)
    steps_per_epoch = math.ceil(data.train_labels.numel() / train_cfg.batch_size)
    scheduler = build_scheduler(optimizer, train_cfg, steps_per_epoch)
    generator = torch.Generator().manual_seed(train_cfg.seed)
    trial = Trial(model, optimizer, scheduler, generator)
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        restore_rng(resume["rng"], generator, device)
        trial.epoch = resume["epoch"]
        trial.metrics_history = list(resume["metrics_history"])
        trial.progress = EpochProgress.from_state(resume.get("epoch_progress"))  # older checkpoints have none
    return trial


def _compile(trial: Trial, data: DeviceData, cfg: TrainConfig, amp_dtype: torch.dtype | None) -> float:
    """``train.compile``: wrap the model and compile its train and eval graphs now, so epoch times exclude it.

    The warm-up runs a forward/backward for every training batch shape of an epoch (the full batch and a partial last
    one) and an evaluation over the full and last eval batch shapes, then puts back every state it touched (RNGs for
    dropout, buffers such as BatchNorm statistics, gradients), so training is unchanged.
    Returns the compilation time in seconds.
    """
    model, device = trial.model, data.train_labels.device
    # Dynamo's compiled-code cache lives as long as the process, and Tune reuses a worker for the next trial
    # (reuse_actors): without a reset, graphs of earlier trials' models fill the recompile limit and a later
    # trial silently runs eagerly.
    torch._dynamo.reset()
    # true: torch's default mode; whole-step: the default mode, inside the step's own CUDA graph
    mode = cfg.compile if isinstance(cfg.compile, str) and cfg.compile != WHOLE_STEP else None
    trial.runner = torch.compile(model, mode=mode)  # shares model's parameters; the checkpoint keeps the eager names
    rng = rng_state(trial.generator, device)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    started = time.perf_counter()
    model.train()
    # Every batch shape an epoch will see: the full batch and, when the set does not divide, the last one. Each
    # backward's gradients are dropped before the next pass: a second backward adding into the first's would make it
    # read what a CUDA graph's replay has since overwritten ("accessing tensor output of CUDAGraphs that has been
    # overwritten", the graphed SA step inside run_trial on an H200).
    n_train = data.train_labels.numel()
    for size in sorted({min(cfg.batch_size, n_train), n_train % cfg.batch_size} - {0}, reverse=True):
        images = data.normalise(data.train_images[:size].float().div(255))  # (size, C, H, W)
        with autocast(device, amp_dtype):
            logits = trial.runner(images)
        F.cross_entropy(logits.float(), data.train_labels[:size]).backward()
        model.zero_grad(set_to_none=True)
    for images, labels in _eval_sets(data).values():  # a full and the last eval batch of each set
        n_eval = min(len(labels), cfg.eval_batch_size + len(labels) % cfg.eval_batch_size)
        evaluate(trial.runner, images[:n_eval], labels[:n_eval], data, cfg.eval_batch_size, amp_dtype)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    restore_rng(rng, trial.generator, device)
    if cfg.compile == WHOLE_STEP and n_train >= cfg.batch_size:  # its own warm-up, state put back likewise
        trial.whole_step = WholeStep(trial, data, cfg, amp_dtype)
    synchronize(device)
    seconds = time.perf_counter() - started
    return seconds


def _check_resumable(checkpoint: dict, model_cfg: ModelConfig, train_cfg: TrainConfig) -> None:
    """A checkpoint only continues the run it came from; anything else is silently a different experiment."""
    if checkpoint["model_config"] != model_cfg.model_dump():
        raise ValueError("resume_from: the checkpoint's model_config differs from the trial's")
    free = {"device", "eval_batch_size"}  # may change between machines without changing the experiment
    saved = {k: v for k, v in checkpoint["train_config"].items() if k not in free}
    saved.setdefault("data_fraction", 1.0)  # a checkpoint from before the field trained on all the data
    if saved != {k: v for k, v in train_cfg.model_dump().items() if k not in free}:
        raise ValueError(f"resume_from: the checkpoint's train_config differs from the trial's (except {sorted(free)})")


def _eval_sets(data: DeviceData) -> dict[str, tuple[Tensor, Tensor]]:
    """The sets evaluated after every epoch, by metric prefix: the test set, and the validation set when there is."""
    sets = {"test": (data.test_images, data.test_labels)}
    if data.val_images is not None and data.val_labels is not None:
        sets["val"] = (data.val_images, data.val_labels)
    return sets


def _log_epoch(metrics: dict[str, float], epochs: int) -> None:
    validation = f"  val acc {metrics['val_acc']:.4f}" if "val_acc" in metrics else ""
    log.info(
        "epoch %d/%d  train loss %.4f acc %.4f  test loss %.4f acc %.4f%s  lr %.5f  %.1f s  %.0f img/s",
        metrics["epoch"],
        epochs,
        *(metrics[key] for key in ("train_loss", "train_acc", "test_loss", "test_acc")),
        validation,
        metrics["lr"],
        metrics["epoch_time_s"],
        metrics["images_per_s"],
    )


def _record_locality(trial: Trial, data: DeviceData) -> dict[str, float]:
    """Measure every head's locality now (``pipeline.trial.locality``), keep it in the trial's history and return the
    per-layer summary for the epoch's report (empty for a model without attention)."""
    per_layer = measure_locality(trial.model, data.locality_batch())  # the eager model: hooks see its layers
    if per_layer is None:
        return {}
    trial.locality_history.append({"epoch": trial.epoch, "layers": per_layer})
    return layer_summary(per_layer)


def run_trial(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    data: PreparedData,
    reporter: Reporter,
    *,
    resume_from: Path | None = None,
    init_from: Path | None = None,
    heads_per_layer: list[int] | None = None,
    stop: Callable[[], bool] | None = None,
    stopped: Stopped | None = None,
) -> dict[str, float]:
    """Train for ``train_cfg.epochs`` epochs, calling ``reporter(metrics, checkpoint_dir)`` after each one.

    Args:
        resume_from: a checkpoint directory written by this module; training continues after its epoch with
            every state (weights, optimiser, schedule, RNGs, metrics and head history) restored.
        init_from: a checkpoint directory whose weights (and heads per layer) start a *new* run, e.g.
            fine-tuning a pruned model; optimiser, schedule and epoch count start afresh.
        heads_per_layer: heads of each attention layer, overriding ``model_cfg.heads`` (and ``init_from``'s).
        stop: asked before every batch; when it returns True the trial writes a checkpoint of the epoch in progress,
            hands it to ``stopped(checkpoint_dir)`` and returns (``resume_from`` that checkpoint finishes the epoch).

    ``train_cfg.data_fraction`` < 1 trains on that class-balanced fraction of ``data``'s training set, drawn from
    ``train_cfg.seed`` (``pipeline.data.subset``); the test set and the locality batch stay whole.

    Metrics (``METRIC_KEYS``, scalars): ``epoch`` counts completed epochs (an int, from 1); ``train_loss`` and
    ``train_acc`` average the epoch's training batches (dropout and augmentation on); ``test_*`` come from one
    evaluation in eval mode after the epoch, and so do ``val_acc`` and ``val_loss`` (``VALIDATION_KEYS``, after
    ``METRIC_KEYS``) when the prepared data has a validation set; ``lr`` is the rate of the epoch's last optimiser step;
    ``epoch_time_s`` times the training pass alone (no evaluation, no checkpoint) and ``images_per_s`` is the
    number of training images over it. A self-attention model adds ``locality/layer<l>/<metric>`` (each layer's
    mean over its heads, ``pipeline.trial.locality``; per head in the checkpoint's locality history), and its first
    epoch's report the same measured before training under ``initial/`` (``report.initial_metrics``). Returns the
    final epoch's metrics (the resumed checkpoint's when nothing was left to train).
    """
    if resume_from is not None and init_from is not None:
        raise ValueError("pass resume_from (continue a run) or init_from (start a new one), not both")
    device = resolve_device(train_cfg)
    if train_cfg.compile == WHOLE_STEP:
        require_cuda(device)
    flush_subnormals(device)
    amp_dtype = autocast_dtype(train_cfg, device)
    resume = load_checkpoint(resume_from) if resume_from is not None else None
    if resume is not None:
        _check_resumable(resume, model_cfg, train_cfg)
    init = load_checkpoint(init_from) if init_from is not None else None
    if train_cfg.data_fraction < 1.0:  # epochs shrink with it: the schedule's steps per epoch count the subset
        data = class_balanced_subset(data, train_cfg.data_fraction, train_cfg.seed)
        log.info(
            "training on %d images (train.data_fraction %g of every class)",
            len(data.train_labels),
            train_cfg.data_fraction,
        )
    trial = _start(model_cfg, train_cfg, data, device, resume=resume, init=init, heads_per_layer=heads_per_layer)
    on_device = DeviceData.from_prepared(data, device)
    initial: dict[str, float] = {}  # epoch 0's locality summary, sent once with epoch 1's report
    if resume_from is not None:
        trial.head_history = load_head_history(resume_from)
        trial.locality_history = load_locality_history(resume_from)
    else:
        if (snapshot := head_snapshot(trial.model, 0)) is not None:
            trial.head_history = [snapshot]
        initial = _record_locality(trial, on_device)  # epoch 0: before training (a pruned model: after pruning)
    data_info = {"image_shape": list(data.image_shape), "num_classes": data.num_classes}
    log.info("trial on %s; epochs %d..%d", device_tags(train_cfg), trial.epoch + 1, train_cfg.epochs)
    if train_cfg.compile:
        log.info(
            "torch.compile: train and eval graphs compiled in %.1f s",
            _compile(trial, on_device, train_cfg, amp_dtype),
        )

    assert (stop is None) == (stopped is None), "stop and stopped go together"
    while trial.epoch < train_cfg.epochs:
        synchronize(device)
        started = time.perf_counter()
        spent = trial.progress.seconds if trial.progress is not None else 0.0  # before a mid-epoch checkpoint
        try:
            metrics = train_one_epoch(trial, on_device, train_cfg, amp_dtype, stop)  # .item() at the end syncs
        except EpochInterrupted as interrupted:
            trial.progress = replace(interrupted.progress, seconds=spent + time.perf_counter() - started)
            log.info("stopped after %d batches of epoch %d", trial.progress.steps, trial.epoch + 1)
            with tempfile.TemporaryDirectory(prefix="trial-checkpoint-") as tmp:
                write_checkpoint(Path(tmp), trial, model_cfg, train_cfg, data_info)
                stopped(Path(tmp))  # type: ignore[misc]  # set with stop (asserted)
            return dict(trial.metrics_history[-1]) if trial.metrics_history else {}
        seconds = spent + time.perf_counter() - started
        trial.progress = None
        trial.epoch += 1
        for prefix, (images, labels) in _eval_sets(on_device).items():
            loss, acc = evaluate(trial.runner, images, labels, on_device, train_cfg.eval_batch_size, amp_dtype)
            metrics |= {f"{prefix}_loss": loss, f"{prefix}_acc": acc}
        n_train = on_device.train_labels.numel()
        metrics |= {"epoch_time_s": seconds, "images_per_s": n_train / seconds}
        keys = METRIC_KEYS[1:] + (VALIDATION_KEYS if on_device.val_labels is not None else ())
        metrics = {"epoch": trial.epoch} | {key: float(metrics[key]) for key in keys}  # epoch stays an int
        metrics |= _record_locality(trial, on_device)
        if trial.epoch == 1:
            metrics |= {INITIAL_PREFIX + key: value for key, value in initial.items()}  # MLflow step 0
        trial.metrics_history.append(metrics)
        if (snapshot := head_snapshot(trial.model, trial.epoch)) is not None:
            trial.head_history.append(snapshot)
        _log_epoch(metrics, train_cfg.epochs)
        with tempfile.TemporaryDirectory(prefix="trial-checkpoint-") as tmp:
            write_checkpoint(Path(tmp), trial, model_cfg, train_cfg, data_info)
            reporter(dict(metrics), Path(tmp))
    return dict(trial.metrics_history[-1]) if trial.metrics_history else {}


__all__ = [
    "DivergedError",
    "EpochInterrupted",
    "Reporter",
    "Stopped",
    "WarmupCosine",
    "build_optimizer",
    "build_scheduler",
    "evaluate",
    "run_trial",
    "train_one_epoch",
    "train_step",
]
