"""``train.compile: whole-step``: the training step (forward, backward, optimiser) captured once as one CUDA graph.

At the paper's batch of 100 a fast GPU waits on the host: the eager step launches hundreds of kernels, and CUDA graphs
of the model alone (``reduce-overhead``) still leave the backward's bookkeeping and the optimiser to the host. Here the
compiled model's forward, its backward and the SGD update are recorded once with ``torch.cuda.graph`` and replayed
every full batch: one launch a step. What a replay reads lives in static buffers filled before it on the device (the
batch's indices, crops and flips, each parameter group's learning rate as a device tensor), so no step waits on the
host. The short last batch of an epoch runs the ordinary step (``loop.train_step``) on the same parameters and
momentum buffers.

Capturing needs a few warm-up steps; they run on copies' worth of state that is put back afterwards (parameters,
momentum buffers, module buffers, RNGs), so the trial trains from exactly where it was. Without capture
(``capture=False``: the CPU, the tests) the same body runs eagerly each call: what is tested there is the plumbing of
the static buffers and the device learning rate.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from pipeline.trial.augment import apply_augmentation
from pipeline.trial.checkpoint import restore_rng, rng_state
from pipeline.trial.device import autocast

if TYPE_CHECKING:
    from pipeline.config import TrainConfig
    from pipeline.trial.checkpoint import Trial
    from pipeline.trial.device_data import DeviceData

MODE = "whole-step"  # the ``train.compile`` value
WARMUP_STEPS = 3  # before capture: CUDA graphs want the allocator and every lazy state settled (torch's recipe)


def require_cuda(device: torch.device) -> None:
    """Refuse, naming the key, a whole-step trial on a device without CUDA graphs (before any training starts)."""
    if device.type != "cuda":
        raise ValueError(
            f"train.compile: {MODE} captures the training step with torch.cuda.graph and needs a CUDA device, "
            f"but the trial runs on {device.type} (set train.device: cuda, or another train.compile)"
        )


class WholeStep:
    """One training step of ``cfg.batch_size`` images over static device buffers, replayed as a CUDA graph.

    A call ``whole_step(index, augmentation)`` copies the batch's indices (B,) and crops/flips into the buffers, fills
    the learning rates from the optimiser's groups, replays, and returns the step's loss and correct count: device
    tensors that the next call overwrites (use them before it, as ``train_one_epoch`` does).
    """

    def __init__(
        self,
        trial: Trial,
        data: DeviceData,
        cfg: TrainConfig,
        amp_dtype: torch.dtype | None,
        *,
        capture: bool = True,
    ) -> None:
        device = data.train_labels.device
        if capture:
            require_cuda(device)
        if momentum_free := [g["name"] for g in trial.optimizer.param_groups if g["momentum"] == 0]:
            raise ValueError(f"train.compile: {MODE} expects SGD with momentum; groups {momentum_free} have none")
        self.trial, self.data, self.cfg, self.amp_dtype = trial, data, cfg, amp_dtype
        batch = cfg.batch_size
        self.index = torch.zeros(batch, dtype=torch.int64, device=device)  # (B,) into the training set
        self.offsets = torch.zeros(2, batch, dtype=torch.int64, device=device)  # (2, B) crop offsets
        self.flips = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
        self.lrs = [torch.tensor(float(g["lr"]), device=device) for g in trial.optimizer.param_groups]
        self.loss = torch.zeros((), device=device)
        self.hits = torch.zeros((), dtype=torch.int64, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        if capture:
            self._capture()

    def __call__(self, index: Tensor, augmentation: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
        self.index.copy_(index)
        if augmentation is not None:
            self.offsets.copy_(augmentation[0])
            self.flips.copy_(augmentation[1])
        for lr, group in zip(self.lrs, self.trial.optimizer.param_groups, strict=True):
            lr.fill_(group["lr"])  # a device-side fill: no sync
        if self.graph is not None:
            self.graph.replay()
        else:
            self.trial.optimizer.zero_grad(set_to_none=True)
            with self._device_lr():
                self._body()
        return self.loss, self.hits

    def _body(self) -> None:
        """What the graph records: the step on the static buffers, its loss and correct count into static outputs."""
        data, cfg = self.data, self.cfg

        images = data.train_images[self.index].float().div_(255)  # (B, C, H, W) in [0, 1]
        if cfg.augment:
            images = apply_augmentation(images, cfg.crop_padding, self.offsets, self.flips)
        labels = data.train_labels[self.index]  # (B,)
        with autocast(images.device, self.amp_dtype, cache=False):
            logits = self.trial.runner(data.normalise(images))  # (B, classes)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        self.trial.optimizer.step()
        self.loss.copy_(loss.detach())
        self.hits.copy_((logits.argmax(dim=1) == labels).sum())

    @contextmanager
    def _device_lr(self) -> Iterator[None]:
        """The optimiser's groups read their rate from ``self.lrs`` (fused SGD reads a tensor rate on the device; the
        default foreach SGD would ask the host for it) and are put back as they were, floats for the schedule and the
        checkpoint."""
        groups = self.trial.optimizer.param_groups
        saved = [(g["lr"], g["fused"], g["foreach"]) for g in groups]
        for group, lr in zip(groups, self.lrs, strict=True):
            group.update(lr=lr, fused=True, foreach=False)
        try:
            yield
        finally:
            for group, (lr, fused, foreach) in zip(groups, saved, strict=True):
                group.update(lr=lr, fused=fused, foreach=foreach)

    def _capture(self) -> None:
        """Warm up on a side stream, record the graph, then put back every state the warm-up changed."""
        trial, device = self.trial, self.index.device
        saved = _TrainingState.of(trial, device)
        self.index.copy_(torch.arange(self.cfg.batch_size, device=device) % self.data.train_labels.numel())
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with self._device_lr(), torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                trial.optimizer.zero_grad(set_to_none=True)
                self._body()
        torch.cuda.current_stream(device).wait_stream(side)
        trial.optimizer.zero_grad(set_to_none=True)  # the graph's backward allocates the gradients it then rewrites
        graph = torch.cuda.CUDAGraph()
        with self._device_lr(), torch.cuda.graph(graph):
            self._body()
        self.graph = graph
        self.grads = [p.grad for p in trial.model.parameters()]  # the graph's gradients: kept alive with it
        saved.restore(trial, device)


@dataclass
class _TrainingState:
    """Copies of a trial's parameters, module buffers, momentum buffers and RNG states, put back in place (a captured
    graph holds their addresses) by ``restore``."""

    tensors: dict[Tensor, Tensor]  # parameter or module buffer -> its copy
    momentum: dict[Tensor, Tensor | None]  # parameter -> a copy of its momentum buffer, None before the first step
    rng: dict

    @classmethod
    def of(cls, trial: Trial, device: torch.device) -> _TrainingState:
        model, state = trial.model, trial.optimizer.state
        with torch.no_grad():
            tensors = {t: t.detach().clone() for t in (*model.parameters(), *model.buffers())}
            momentum = {p: _clone(state.get(p, {}).get("momentum_buffer")) for p in model.parameters()}
        return cls(tensors, momentum, rng_state(trial.generator, device))

    def restore(self, trial: Trial, device: torch.device) -> None:
        with torch.no_grad():
            for tensor, saved in self.tensors.items():
                tensor.copy_(saved)
            for p, saved in self.momentum.items():
                buffer = trial.optimizer.state[p]["momentum_buffer"]
                # A buffer the trial had not made yet starts at zero: momentum x 0 + gradient is the gradient, what
                # SGD's first step stores (exactly, as long as the gradient is finite).
                buffer.zero_() if saved is None else buffer.copy_(saved)
        trial.optimizer.zero_grad(set_to_none=True)
        restore_rng(self.rng, trial.generator, device)


def _clone(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.clone()
