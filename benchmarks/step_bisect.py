"""Which step path departs from eager: ten training steps through each, from the same weights and batches.

SA quadratic 9's CUDA-graphed throughput path diverged to NaN at step 5-8 on every H200 run since the model became one
compiled graph, while its eager path never did; nobody had run the one-graph model compiled without graphs. This runs
the trainer's own step (``pipeline.trial.loop.train_step``; ``pipeline.trial.whole_step`` for the captured step) along
the paths in the order they add machinery, and names the first whose losses leave eager's, and by how much per step:

  eager       the model as it is
  compiled    ``torch.compile`` (default mode): the compiler's numerics, no graphs
  graphed     ``torch.compile(mode="reduce-overhead")``: the model's forward and backward replayed as CUDA graphs
  whole-step  ``train.compile: whole-step``: forward, backward and SGD captured as one CUDA graph

Dropout off (each path would draw its own masks), no augmentation, trained-like Gaussian heads (as the throughput
section measures), the schedule's warm-up as in ``benchmarks.train_throughput``. The last two paths need CUDA; at tiny
CPU sizes ``compiled`` uses the ``aot_eager`` backend (Dynamo and AOTAutograd without code generation), so the check
of the command costs seconds, not an inductor build.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import torch

from benchmarks.common import synthetic_device_data
from pipeline.config import ModelConfig, TrainConfig
from pipeline.measure.speed import set_gaussian_heads
from pipeline.models import build_model
from pipeline.trial.checkpoint import Trial
from pipeline.trial.loop import build_optimizer, build_scheduler, train_step
from pipeline.trial.whole_step import WholeStep

PATHS = ("eager", "compiled", "graphed", "whole-step")
CUDA_ONLY = ("graphed", "whole-step")
STEPS = 10
# A path departs from eager at the first step whose loss is non-finite (eager's being finite) or off eager's by more
# than this, relative: bf16 autocast rounds differently per kernel fusion, fp32 should agree closely.
TOLERANCE = {"bf16": 5e-2, "fp32": 1e-3}


def run_path(
    path: str,
    model: torch.nn.Module,
    batches: Any,
    cfg: TrainConfig,
    amp: torch.dtype | None,
    backend: str = "inductor",
) -> list[float]:
    """The ``cfg.batch_size``-image losses of ``STEPS`` steps of ``path`` on a copy of ``model``, in order."""
    model = copy.deepcopy(model)
    torch._dynamo.reset()  # as train.compile does: no earlier path's graphs
    runner = model
    if path == "compiled":
        runner = torch.compile(model, backend=backend)
    elif path in ("graphed", "whole-step"):
        runner = torch.compile(model, mode="reduce-overhead" if path == "graphed" else None)
    optimizer = build_optimizer(model, cfg)
    trial = Trial(model, optimizer, build_scheduler(optimizer, cfg, STEPS), torch.Generator(), runner=runner)
    whole = WholeStep(trial, batches, cfg, amp) if path == "whole-step" else None
    model.train()
    losses = []
    for step in range(STEPS):
        index = torch.arange(step * cfg.batch_size, (step + 1) * cfg.batch_size, device=batches.train_labels.device)
        if whole is not None:
            loss, _ = whole(index, None)
            loss = loss.clone()  # the next replay overwrites it
        else:
            loss, _ = train_step(trial, batches, cfg, amp, index, None)
        trial.scheduler.step()
        losses.append(loss)
    return torch.stack(losses).tolist()  # the one sync


def departures(losses: dict[str, list[float]], tolerance: float) -> dict[str, Any]:
    """Per path (eager first): each step's |loss - eager's| / |eager's| (inf where only one is finite) and the first
    step past ``tolerance``; and the first path that departs, in the order given."""
    eager = losses["eager"]
    paths, first = {}, None
    for path, values in losses.items():
        diffs = [_relative(a, b) for a, b in zip(values, eager, strict=True)]
        step = next((i for i, d in enumerate(diffs) if d > tolerance), None)
        non_finite = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        paths[path] = {"losses": values, "rel_diff": diffs, "departs_at": step, "first_non_finite": non_finite}
        if first is None and step is not None:
            first = path
    return {"first_departing_path": first, "tolerance": tolerance, "paths": paths}


def _relative(value: float, reference: float) -> float:
    if math.isfinite(value) != math.isfinite(reference):
        return math.inf
    if not math.isfinite(value):
        return 0.0  # both non-finite: eager itself diverged there
    return abs(value - reference) / max(abs(reference), 1e-12)


def bisect(
    model_cfg: ModelConfig,
    device: torch.device,
    batch_size: int,
    paths: tuple[str, ...] = PATHS,
    backend: str = "inductor",
    budget: Any = None,
    image_size: int = 32,
) -> dict[str, Any]:
    """Every path of ``paths`` (eager always first) on one model and ten batches; ``budget()``, when given, says
    whether another path still fits (a path that does not is listed under ``skipped``)."""
    amp = torch.bfloat16 if device.type == "cuda" else None
    cfg = TrainConfig(batch_size=batch_size, eval_batch_size=batch_size, crop_padding=4, epochs=1, augment=False)
    torch.manual_seed(0)
    no_dropout = model_cfg.model_copy(update={"dropout": 0.0, "attention_dropout": 0.0})
    model = build_model(no_dropout, image_size=image_size).to(device)
    set_gaussian_heads(model, (1.0, 10.0), jitter=0.1)  # a no-op for other encodings
    generator = torch.Generator().manual_seed(0)
    batches = synthetic_device_data(device, STEPS * batch_size, batch_size, generator, image_size=image_size)
    losses, seconds, skipped, failed = {}, {}, {}, {}
    order = ("eager", *(p for p in paths if p != "eager"))
    for path in order:
        if path in CUDA_ONLY and device.type != "cuda":
            skipped[path] = "needs CUDA"
            continue
        if budget is not None and not budget():
            skipped[path] = "out of time"
            continue
        started = time.monotonic()
        try:
            losses[path] = run_path(path, model, batches, cfg, amp, backend)
        except Exception as error:  # a path that cannot run departs too; the others still run
            failed[path] = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
        seconds[path] = round(time.monotonic() - started, 1)
    if "eager" not in losses:
        raise RuntimeError(f"the eager path did not run: {failed.get('eager') or skipped.get('eager')}")
    result = departures(losses, TOLERANCE["bf16" if amp is not None else "fp32"])
    for path, row in result["paths"].items():
        row["seconds"] = seconds[path]
    ran = [p for p in order if p in failed or result["paths"].get(p, {}).get("departs_at") is not None]
    return result | {
        "first_departing_path": ran[0] if ran else None,  # a failure counts, in the paths' order
        "precision": "bf16 autocast" if amp is not None else "fp32",
        "batch_size": batch_size,
        "compiled_backend": backend,
        "failed": failed,
        "skipped": skipped,
    }
