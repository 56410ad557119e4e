"""What one trial of each variant needs, estimated before anything starts: parameters and memory at the batch size.

Values inside the config's bounds can still be far too big (``model.hidden: 60000``): the dry run prints the estimate
and a local sweep refuses a trial that cannot fit in this machine's memory, naming the keys, before Ray's memory
monitor kills it. The model runs forward on PyTorch's ``meta`` device (nothing allocated) at two batch sizes,
counting what autograd keeps; memory = weights, gradients and momentum (3 x 4 bytes per parameter) + the kept
activations at ``train.batch_size``. An estimate to refuse what cannot fit (``benchmarks.train_throughput`` measures).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.config import Params

MIB = 2**20
OPTIMISER_COPIES = 3  # weights, gradients, SGD momentum, fp32 each
TRACE_BATCH = 2


@dataclass(frozen=True)
class TrialEstimate:
    variant: str
    parameters: int
    state_bytes: int  # weights, gradients and momentum
    activation_bytes: int | None  # kept for the backward pass at train.batch_size; None: could not be traced
    batch_size: int

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + (self.activation_bytes or 0)

    def words(self) -> str:
        activations = (
            f"{self.activation_bytes / MIB:,.0f} MiB activations at batch {self.batch_size}"
            if self.activation_bytes is not None
            else "activations not estimated"
        )
        return (
            f"{self.variant}: {self.parameters / 1e6:,.2f} M parameters, about {self.total_bytes / MIB:,.0f} MiB per "
            f"trial ({self.state_bytes / MIB:,.0f} MiB weights, gradients and momentum; {activations})"
        )


def data_shape(params: Params, project_root: Path) -> tuple[tuple[int, int, int], int]:
    """(channels, height, width) and classes: the prepared data's when prepared, else what ``data`` will give."""
    manifest = project_root / params.data.prepared_dir / "manifest.json"
    if manifest.is_file():
        prepared = json.loads(manifest.read_text())
        if "image_shape" in prepared and "num_classes" in prepared:
            return tuple(prepared["image_shape"]), int(prepared["num_classes"])  # type: ignore[return-value]
    channels = 1 if params.data.dataset == "digits" else 3
    return (channels, params.data.image_size, params.data.image_size), 10


def estimate_trial(params: Params, variant: str, shape: tuple[int, int, int], classes: int) -> TrialEstimate:
    """On the ``meta`` device rather than torch.compile's fake tensor mode: the same shapes and bytes, 0.5 CPU-s less
    per dry run and local sweep (the default's five variants: 2.44 -> 1.92 s)."""
    from pipeline.trial.checkpoint import build_for_data

    def kept_for_backward(model: torch.nn.Module, batch: int) -> int:
        kept: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            base = tensor._base if tensor._base is not None else tensor  # a view kept with its base counts once
            kept[id(base)] = base.numel() * base.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(torch.zeros(batch, *shape, device="meta"))
        return sum(kept.values())

    batch_size = params.train_for(variant).batch_size  # a variant may train at its own (train.batch_size)
    with torch.device("meta"):
        model = build_for_data(params.model_for(variant), shape, classes, None)
        parameters = sum(p.numel() for p in model.parameters())
        try:
            model.train()
            # Two batch sizes (batch norm needs two images at least): what grows per image, and what is kept once
            # per step whatever the batch (position-only attention probabilities).
            small, large = kept_for_backward(model, TRACE_BATCH), kept_for_backward(model, 2 * TRACE_BATCH)
            per_image = (large - small) // TRACE_BATCH
            activations: int | None = max(small - per_image * TRACE_BATCH, 0) + per_image * batch_size
        except Exception:  # noqa: BLE001 - an op that cannot be traced: the estimate goes without activations
            activations = None
    return TrialEstimate(variant, parameters, parameters * 4 * OPTIMISER_COPIES, activations, batch_size)


def estimate_trials(params: Params, project_root: Path) -> list[TrialEstimate]:
    shape, classes = data_shape(params, project_root)
    return [estimate_trial(params, variant, shape, classes) for variant in params.sweep.variants]


def machine_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_trials_fit(params: Params, project_root: Path, memory: int | None = None) -> None:
    """A trial that cannot fit in this machine's memory (a local Ray) is refused, naming its variant and the keys."""
    memory = memory or machine_memory()
    for trial in estimate_trials(params, project_root):
        if trial.total_bytes > memory:
            raise ValueError(
                f"variants.{trial.variant} (model.*) / train.batch_size: one trial needs about "
                f"{trial.total_bytes / 2**30:,.1f} GiB ({trial.words()}), more than this machine's "
                f"{memory / 2**30:,.1f} GiB; make the model or the batch smaller"
            )
