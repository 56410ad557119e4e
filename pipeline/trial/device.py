"""Where a trial runs and in which precision, decided in one place and recorded with every run.

``train.device: auto`` picks CUDA when present, else the CPU; ``train.amp: auto`` turns on bf16 autocast on
CUDA (fp32 master weights, fp32 loss) and never on the CPU, so a CPU run is plain fp32 and bit-reproducible.
The choice is hardware-dependent, so callers log ``device_tags``: a number without its device is
not comparable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
from collections.abc import Iterator

import torch

from pipeline.config import TrainConfig

log = logging.getLogger(__name__)


def resolve_device(cfg: TrainConfig) -> torch.device:
    """The training device. Asking for CUDA on a machine without it is an error, not a silent CPU run."""
    if cfg.device == "cpu":
        return torch.device("cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def flush_subnormals(device: torch.device) -> None:
    """On the CPU, compute subnormal floats (below 1.2e-38) as zero from now on: on this thread and on the intra-op
    threads torch starts later, which inherit the setting; a thread that already exists keeps its own (checked: with 2
    threads, flushing after the first parallel kernel flushed half of a product, before it all of it). So call it
    before the process runs any kernel, as ``run_trial`` does in a fresh Ray worker.

    Why: a sharpened quadratic head's probabilities far from its centre (exp of a large negative score) fall into that
    range, and x86 CPUs compute on subnormals many times slower. A trained SA quadratic's training step took twice
    the CPU time without the flush (0.19 against 0.095 s, batch 64, one thread), so the quadratic models' epochs
    doubled in time as their heads sharpened. Values that small weigh nothing next to a softmax's 1; the flag is the
    CPU's (CUDA kernels are unaffected)."""
    if device.type == "cpu":
        torch.set_flush_denormal(True)


def trial_train_config(cfg: TrainConfig, gpu_ids: list, cpu_fallback: bool) -> TrainConfig:
    """``cfg`` for a trial that Ray gave ``gpu_ids``: on the CPU when it got none; an error naming the option when it
    got some but torch finds no CUDA (unless ``cpu_fallback``: ``sweep.resources.cpu_fallback``), instead of
    training silently on the CPU a sweep that asked for GPUs."""
    if not gpu_ids:  # use the GPU Ray assigned, or none at all
        if cfg.device == "cuda":
            raise ValueError("train.device is 'cuda' but Ray assigned this trial no GPU (sweep.resources.gpu)")
        return cfg.model_copy(update={"device": "cpu"})
    if torch.cuda.is_available():
        return cfg
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    problem = f"Ray assigned this trial GPU {gpu_ids} (CUDA_VISIBLE_DEVICES={visible}) but torch finds no CUDA device"
    if not cpu_fallback or cfg.device == "cuda":
        raise ValueError(
            f"{problem} (torch {torch.__version__}, built for CUDA {torch.version.cuda}); install a CUDA build of "
            "torch on the node, or set sweep.resources.cpu_fallback: true to train such trials on the CPU"
        )
    log.warning("%s; training on the CPU (sweep.resources.cpu_fallback: true)", problem)
    return cfg.model_copy(update={"device": "cpu"})


def gpu_tags(gpu_ids: list) -> dict[str, str]:
    """The GPUs Ray gave a trial and what the process sees of them (for MLflow tags); none for a CPU trial."""
    if not gpu_ids:
        return {}
    return {
        "ray.gpu_ids": ",".join(map(str, gpu_ids)),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """bf16 on CUDA when ``amp`` is ``auto`` (no loss scaling needed, unlike fp16); None means plain fp32."""
    return torch.bfloat16 if device.type == "cuda" and cfg.amp == "auto" else None


@contextlib.contextmanager
def autocast(device: torch.device, dtype: torch.dtype | None, *, cache: bool = True) -> Iterator[None]:
    """Mixed precision for the forward pass only; a no-op when ``dtype`` is None. ``cache=False`` inside a CUDA graph
    capture, as torch's CUDA-graph notes ask: casts cached during capture would outlive it."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=cache):
        yield


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work (a no-op on the CPU), so that wall-clock time covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_tags(cfg: TrainConfig) -> dict[str, str]:
    """String tags naming the hardware and precision a trial with ``cfg`` runs on (for MLflow tags)."""
    device = resolve_device(cfg)
    dtype = autocast_dtype(cfg, device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine() or "cpu"
    return {
        "device": device.type,
        "device_name": name,
        "precision": "bf16-autocast" if dtype is not None else "fp32",
        "torch_version": torch.__version__,
        "cuda_version": str(torch.version.cuda) if device.type == "cuda" else "none",
        "torch_threads": str(torch.get_num_threads()),
        "subnormals": "flushed to zero" if device.type == "cpu" else "kept",  # flush_subnormals
    }
