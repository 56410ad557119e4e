"""The checkpoint of a trial: its format, writing and loading, the model it holds, and the RNG state it carries.

A checkpoint directory holds ``checkpoint.pt`` (weights, optimiser, schedule, epoch, every RNG state, the model and
train configs, heads per layer, metrics so far, image shape and class count, and for a checkpoint taken between two
batches how far the epoch in progress got: ``EpochProgress``), for every self-attention model
``locality_history.json`` (each head's mean distance, entropy and peak probability per epoch, epoch 0 = before
training: ``pipeline.trial.locality``) and, for Gaussian heads, ``head_history.json`` (each head's centre and
``Sigma^-1`` per epoch). Everything in
``checkpoint.pt`` is a tensor or plain data, so it loads with ``torch.load(weights_only=True)``: opening a checkpoint
never runs pickled code. Prune and analysis read checkpoints through this module without the training loop.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from pipeline.config import ModelConfig, TrainConfig
from pipeline.models import build_model
from pipeline.trial.report import CHECKPOINT_FILE, HEAD_HISTORY_FILE, LOCALITY_HISTORY_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpochProgress:
    """How far an interrupted epoch got, for a checkpoint taken between two batches (on a drain notice): enough to
    finish that epoch exactly as an uninterrupted run does. The epoch's shuffle is drawn again from the data
    generator's state at the epoch's start; what the done batches changed (weights, optimiser, schedule, RNGs) is in
    the checkpoint already."""

    start_rng: torch.Tensor  # the data generator's state when the epoch began
    steps: int  # batches done
    loss_sum: float  # sum of the done batches' losses x their sizes (float32, exact as a Python float)
    correct: int
    lr: float  # the last done step's learning rate
    seconds: float = 0.0  # training time the epoch took so far

    def state(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> EpochProgress | None:
        return cls(**state) if state is not None else None


@dataclass
class Trial:
    """Everything that changes during a trial and is checkpointed."""

    model: nn.Module
    optimizer: torch.optim.SGD
    scheduler: LambdaLR
    generator: torch.Generator  # shuffling and augmentation (CPU)
    runner: nn.Module | None = None  # what forward passes call: ``model`` or its torch.compile wrapper
    # ``train.compile: whole-step``: a full batch's step replayed as one CUDA graph (``pipeline.trial.whole_step``)
    whole_step: Callable[[torch.Tensor, Any], tuple[torch.Tensor, torch.Tensor]] | None = None
    epoch: int = 0  # completed epochs
    metrics_history: list[dict[str, float]] = field(default_factory=list)
    head_history: list[dict[str, Any]] = field(default_factory=list)
    locality_history: list[dict[str, Any]] = field(default_factory=list)
    progress: EpochProgress | None = None  # the epoch in progress, when checkpointed between two batches

    def __post_init__(self) -> None:
        if self.runner is None:
            self.runner = self.model


def head_snapshot(model: nn.Module, epoch: int) -> dict[str, Any] | None:
    """Every head's centre and ``Sigma^-1`` per layer (Figure 2's trajectories); None if it has none."""
    geometry = model.head_geometry() if hasattr(model, "head_geometry") else None
    if geometry is None:
        return None
    layers = [{key: value.double().cpu().tolist() for key, value in layer.items()} for layer in geometry]  # exact
    return {"epoch": epoch, "layers": layers}


def rng_state(generator: torch.Generator, device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"data": generator.get_state(), "torch": torch.get_rng_state()}
    if device.type == "cuda":  # the training device's only: a resume may see fewer GPUs (Ray assigns one)
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], generator: torch.Generator, device: torch.device) -> None:
    generator.set_state(state["data"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    elif device.type == "cuda":  # a CPU checkpoint continued on a GPU: not bit-exact anyway, say so
        log.warning("checkpoint has no CUDA RNG state (written on the CPU); CUDA dropout continues from the seed")


def heads_of(model: nn.Module) -> list[int] | None:
    """Heads per layer of a self-attention model (pruned models differ from the config); None for ResNet."""
    heads = getattr(model, "heads_per_layer", None)
    return list(heads) if heads is not None else None


def write_checkpoint(
    directory: Path, trial: Trial, model_cfg: ModelConfig, train_cfg: TrainConfig, data_info: dict[str, Any]
) -> None:
    """``checkpoint.pt`` (loads with ``weights_only=True``), the histories the trial keeps: ``locality_history.json``
    (self-attention models) and ``head_history.json`` (Gaussian heads)."""
    device = next(trial.model.parameters()).device
    payload = {
        "model": trial.model.state_dict(),
        "optimizer": trial.optimizer.state_dict(),
        "scheduler": trial.scheduler.state_dict(),
        "epoch": trial.epoch,
        "rng": rng_state(trial.generator, device),
        "model_config": model_cfg.model_dump(),
        "train_config": train_cfg.model_dump(),
        "heads_per_layer": heads_of(trial.model),
        "metrics_history": [dict(m) for m in trial.metrics_history],
        "epoch_progress": trial.progress.state() if trial.progress is not None else None,
        **data_info,  # image_shape, num_classes
    }
    torch.save(payload, directory / CHECKPOINT_FILE)
    if trial.head_history:
        (directory / HEAD_HISTORY_FILE).write_text(json.dumps(trial.head_history))
    if trial.locality_history:
        (directory / LOCALITY_HISTORY_FILE).write_text(json.dumps(trial.locality_history))


class CorruptCheckpointError(ValueError):
    """``checkpoint.pt`` exists but does not load (truncated by a full disk or a killed copy, or not ours)."""


def load_checkpoint(checkpoint_dir: Path) -> dict:
    """The contents of ``checkpoint.pt`` in ``checkpoint_dir``, tensors on the CPU; a file that does not load raises
    ``CorruptCheckpointError`` naming it (torch's own message, e.g. "PytorchStreamReader failed", names no file)."""
    path = Path(checkpoint_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no checkpoint (expected a directory written by a trial)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as err:
        raise CorruptCheckpointError(f"{path}: corrupt checkpoint, does not load ({err})") from None


def checkpoint_loads(checkpoint_dir: Path) -> bool:
    """Whether ``checkpoint_dir`` holds a ``checkpoint.pt`` that loads: only such a checkpoint is restored or
    uploaded."""
    try:
        load_checkpoint(checkpoint_dir)
    except (FileNotFoundError, CorruptCheckpointError):
        return False
    return True


def load_head_history(checkpoint_dir: Path) -> list[dict[str, Any]]:
    """Per-epoch head geometry recorded so far; empty for models without Gaussian heads."""
    path = Path(checkpoint_dir) / HEAD_HISTORY_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def load_locality_history(checkpoint_dir: Path) -> list[dict[str, Any]]:
    """Per-epoch locality of every head recorded so far (``{"epoch", "layers": [{metric: [per head]}]}``); empty for
    models without attention."""
    path = Path(checkpoint_dir) / LOCALITY_HISTORY_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def build_for_data(
    model_cfg: ModelConfig, image_shape: Sequence[int], num_classes: int, heads_per_layer: list[int] | None
) -> nn.Module:
    channels, size, _ = image_shape
    return build_model(
        model_cfg, image_size=size, in_channels=channels, num_classes=num_classes, heads_per_layer=heads_per_layer
    )


def model_from_checkpoint(checkpoint_dir: Path) -> nn.Module:
    """The checkpoint's model (its own config and heads per layer, e.g. pruned), on the CPU, in eval mode."""
    return model_from_payload(load_checkpoint(checkpoint_dir))


def model_from_payload(checkpoint: dict) -> nn.Module:
    """The model of an already loaded checkpoint (``load_checkpoint``), for callers that also read its other fields."""
    model_cfg = ModelConfig.model_validate(checkpoint["model_config"])
    model = build_for_data(
        model_cfg, checkpoint["image_shape"], checkpoint["num_classes"], checkpoint["heads_per_layer"]
    )
    model.load_state_dict(checkpoint["model"])
    return model.eval()


def save_model_checkpoint(
    directory: Path,
    model: nn.Module,
    model_cfg: ModelConfig,
    *,
    image_shape: tuple[int, int, int],
    num_classes: int,
) -> None:
    """A weights-only checkpoint (e.g. of a pruned model) for ``init_from`` and ``model_from_checkpoint``."""
    payload = {
        "model": model.state_dict(),
        "model_config": model_cfg.model_dump(),
        "heads_per_layer": heads_of(model),
        "image_shape": list(image_shape),
        "num_classes": num_classes,
    }
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(payload, directory / CHECKPOINT_FILE)
