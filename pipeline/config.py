"""Typed, validated configuration: ``params.yaml`` -> frozen pydantic models -> code.

Config flows one way. ``load_params`` is the only place that reads ``params.yaml``; every error names the file and
the dotted key (``model.heads``), and it is raised before any data is loaded or Ray / MLflow start. Library functions
take the narrowest section they need (``ModelConfig``, ``TrainConfig``), never the whole tree or an argparse namespace.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from pipeline.encodings import (
    DEFAULT_ENCODING,
    ENCODINGS,
    PAPER_VARIANT_FIELDS,
    encoding_fields,
    gaussian_encodings,
    spec_for,
)

PositiveInt = Annotated[int, Field(gt=0)]
Probability = Annotated[float, Field(ge=0.0, lt=1.0)]
Seed = Annotated[int, Field(ge=0, lt=2**32)]  # what every RNG here (torch, numpy, Ray's searcher) accepts
# The encodings and attention kinds of ``pipeline.encodings.ENCODINGS``, whose entries also declare their config
# fields (added to ``ModelConfig`` below). The registry imports neither torch nor the models, which import config.
EncodingName = Literal.__getitem__(tuple(ENCODINGS))


class ConfigError(ValueError):
    """A params file is missing, unreadable or invalid; the message names the file and the key."""


class _Section(BaseModel):
    """Frozen, strict about unknown keys and types: a typo in params.yaml must fail, not become a default.
    Infinite numbers (YAML's ``.inf``, or ``1e400``) are refused too: every trial would diverge."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class DataConfig(_Section):
    """Which dataset to prepare and where it comes from."""

    dataset: Literal["digits", "cifar10"] = "digits"
    # cifar10: path to ``cifar-10-python.tar.gz`` or to its extracted ``cifar-10-batches-py`` folder.
    cifar10_path: str | None = None
    # Check the archive against torchvision's published MD5s. Only tests that write a tiny archive switch it off.
    verify_checksum: bool = True
    # digits (8x8 grey, scikit-learn's bundled copy) are resized to image_size x image_size x 3.
    image_size: PositiveInt = 32
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    # Beyond the paper's protocol: the share of each class's training images held out as a validation set
    # (``pipeline.data.validation``), on which the analysis selects the best epoch. 0 = no validation set: the
    # authors' protocol, which selects the best epoch on the test set.
    validation_fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    prepared_dir: str = "data/prepared"

    @model_validator(mode="after")
    def _cifar_needs_path(self) -> DataConfig:
        if self.dataset == "cifar10" and not self.cifar10_path:
            raise ValueError("data.cifar10_path is required when data.dataset is 'cifar10'")
        return self


# Upper bounds that only refuse absurd values (a typo's extra zeros) before any work starts; each is orders of
# magnitude above what a run can use (the paper: 9-16 heads, hidden 400, 6 layers, FFN 512, 300 epochs, batch 100).
SmallCount = Annotated[int, Field(gt=0, le=1024)]  # heads, layers, downsampling
Width = Annotated[int, Field(gt=0, le=65536)]  # hidden, FFN, embedding and channel widths
Epochs = Annotated[int, Field(gt=0, le=100_000)]
BatchSize = Annotated[int, Field(gt=0, le=1_000_000)]


class _ModelFields(_Section):
    """The fields every model has; ``ModelConfig`` adds those its encodings declare (``pipeline.encodings``)."""

    # t_resnet18: ResNet18 with its 3x3 convolutions as Theorem 1's attention (pipeline.models.transformed_resnet);
    # only the transform section builds it, from a trained resnet18 (a variant cannot train it from scratch).
    arch: Literal["sa", "resnet18", "t_resnet18"] = "sa"
    # Positional encoding (or attention kind) of the attention scores; see pipeline.encodings.ENCODINGS.
    encoding: EncodingName = DEFAULT_ENCODING
    # Beyond the paper: add query-key content scores to the positional ones (Ramachandran et al., Bello et al.), per
    # head at the head's width (pipeline.models.content). The paper's scores read positions only (Sec. 4.3, point iii).
    content: bool = False
    heads: SmallCount = 9
    hidden: Width = 400
    layers: SmallCount = 6
    ffn: Width = 512
    dropout: Probability = 0.1
    attention_dropout: Probability = 0.1
    layer_norm_eps: Annotated[float, Field(gt=0.0)] = 1e-12
    # Side of the invertible (space-to-depth) downsampling applied to the image before the embedding.
    downsample: SmallCount = 2
    # ResNet18 baseline: channels of the first stage (64 = He et al.; smaller only for smoke runs).
    resnet_width: Width = 64
    # Beyond the paper: None = exact dense attention (the paper's). A value eps makes each head attend only within
    # the window of shifts holding >= 1 - eps of its probability mass for every query (pipeline.models.local_attention;
    # e.g. 1e-6). Not used by resnet18.
    attention_window_eps: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None

    @field_validator("content")
    @classmethod
    def _content_needs_attention(cls, content: bool, info: ValidationInfo) -> bool:
        if not content:
            return content
        if info.data.get("arch") != "sa":
            raise ValueError(
                f"true needs self-attention (arch: sa); {info.data.get('arch')} has no attention scores to add to"
            )
        encoding = info.data.get("encoding")
        if encoding is not None and spec_for(encoding).reads_content:
            raise ValueError(f"true adds content scores, which the {encoding!r} encoding already computes")
        return content

    @field_validator("attention_window_eps")
    @classmethod
    def _window_needs_position_only(cls, eps: float | None, info: ValidationInfo) -> float | None:
        encoding = info.data.get("encoding")
        reads_content = info.data.get("content") or (encoding is not None and spec_for(encoding).reads_content)
        if eps is not None and reads_content:
            raise ValueError(
                "truncation needs position-only probabilities (one window for every image); "
                "this model's scores read the content (model.content or its encoding)"
            )
        return eps


# The model's config: the common fields above, then every field an encoding declares (``pipeline.encodings``), each
# with its own default, so a new encoding's fields need no edit here.
ModelConfig = create_model(
    "ModelConfig",
    __base__=_ModelFields,
    __module__=__name__,
    __doc__="Architecture of one model. The defaults are the paper's (Section 4.1, Appendix A.4).",
    **encoding_fields(),
)


class TrainConfig(_Section):
    """One trial's optimisation schedule. Defaults are the paper's (Appendix A.4, Table 2)."""

    epochs: Epochs = 300
    batch_size: BatchSize = 100
    eval_batch_size: BatchSize = 500
    lr: Annotated[float, Field(gt=0.0, le=1000.0)] = 0.1
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    weight_decay: Annotated[float, Field(ge=0.0, le=100.0)] = 1e-4
    # Beyond the paper: the Gaussian encodings' centres and spreads (the optimiser's no-weight-decay group) train at
    # lr x positional_lr_factor. 1 is the paper's single rate; a larger factor lets heads travel to their kernel
    # positions within a short schedule, which the rest of the network at that rate would not survive.
    positional_lr_factor: Annotated[float, Field(gt=0.0, le=1e6)] = 1.0
    warmup_fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.05
    # "step": cosine/warm-up updated every optimiser step (better). "epoch": the authors' code, which steps the
    # schedule once per epoch, so epoch 0 trains at lr 0.
    schedule: Literal["step", "epoch"] = "step"
    augment: bool = True
    crop_padding: Annotated[int, Field(ge=0)] = 4
    # Random horizontal flips (part of ``augment``). Right for CIFAR-10; off for digits, whose mirror images are
    # other shapes.
    hflip: bool = True
    # "auto" picks CUDA when present; recorded with every run.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # bf16 autocast on CUDA ("auto") or never ("off"). CPU always runs fp32.
    amp: Literal["auto", "off"] = "auto"
    # torch.compile the model for training and evaluation (compile time is logged separately from epoch times):
    # true compiles with torch's default mode; "reduce-overhead" also replays each step as CUDA graphs (one launch
    # instead of hundreds: the paper's batch of 100 leaves a fast GPU waiting on the host), "max-autotune" searches
    # kernels too (both torch.compile's own ``mode`` names). "whole-step" (CUDA only) compiles with the default mode
    # and captures the whole training step, forward, backward and SGD update, as one CUDA graph replayed every full
    # batch (``pipeline.trial.whole_step``).
    compile: bool | Literal["reduce-overhead", "max-autotune", "whole-step"] = False
    seed: Seed = 0
    # Beyond the paper: train on this fraction of every class of the prepared training set (ConViT's
    # ``--sampling_ratio``), drawn by ``pipeline.data.subset``; the test set never shrinks. 1.0 = all of it.
    data_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0


# Train fields a variant or a grid axis may not set: they are per sweep (the schedule's length is ASHA's ``max_t``
# and every trial's report count; the seeds are ``sweep.seeds``), so one variant cannot differ in them.
PER_SWEEP_TRAIN_FIELDS = {
    "epochs": "train.epochs is per sweep (ASHA's max_t and the trials' schedule); set it in the train section",
    "seed": "train.seed is per trial, from sweep.seeds; list the seeds there",
}
TRAIN_PREFIX = "train."  # a variant's or grid's key naming a train field, as written in params.yaml: ``train.lr``


def _check_train_key(key: str, value: Any) -> None:
    """Refuse a ``train.<field>`` key of a variant or grid that is not a train field, is per sweep, or has a bad value;
    the message starts ``.train.<field>:`` so the caller's location prefixes it."""
    field = key.removeprefix(TRAIN_PREFIX)
    if field in PER_SWEEP_TRAIN_FIELDS:
        raise ValueError(f".{key}: not per variant: {PER_SWEEP_TRAIN_FIELDS[field]}")
    if field not in TrainConfig.model_fields:
        settable = [f for f in TrainConfig.model_fields if f not in PER_SWEEP_TRAIN_FIELDS]
        raise ValueError(f".{key}: not a train field; valid: {', '.join(TRAIN_PREFIX + f for f in settable)}")
    try:
        TrainConfig.model_validate({field: value})
    except ValidationError as err:
        raise ValueError(f".{key}: value {value!r}: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def _split_fields(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model fields, train fields without their ``train.`` prefix) of a variant's or grid's keys."""
    model = {k: v for k, v in fields.items() if not k.startswith(TRAIN_PREFIX)}
    train = {k.removeprefix(TRAIN_PREFIX): v for k, v in fields.items() if k.startswith(TRAIN_PREFIX)}
    return model, train


# A variant's name becomes a file name (figures), an MLflow run and registered-model name and a DVC metrics key.
VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _first_problem(err: ValidationError) -> str:
    """``.field: message`` of a ModelConfig validation error: the key relative to where the caller validates."""
    problem = err.errors()[0]
    key = ".".join(str(part) for part in problem["loc"])
    return f".{key}: {problem['msg'].removeprefix('Value error, ')}"


class VariantConfig(_Section):
    """A named model of the sweep: its ``arch`` and the ``model`` fields that differ from the shared ``model`` section,
    e.g. ``{arch: sa, encoding: learned, heads: 4, hidden: 64}``, and the ``train`` fields it trains with differently,
    each written ``train.<field>`` (``{arch: sa, encoding: gpsa, heads: 9, train.lr: 0.01}``).

    Any field of ``ModelConfig`` may be set, so a study varies widths, depth or local attention as easily as the paper's
    encodings and head counts; any field of ``TrainConfig`` but the per-sweep ``epochs`` and ``seed`` too, so a model
    that needs its own optimiser settings, or a data-size study (``train.data_fraction``), is a variant like the others.
    The fields are kept as written (pydantic's ``model_extra``) and checked against ``ModelConfig`` / ``TrainConfig``
    here, so a misspelt field or a bad value fails naming ``variants.<name>.<field>``; ``apply`` and ``apply_train``
    validate the merged section once more. The two sections stay the one declaration of what a field is.
    """

    model_config = ConfigDict(**{**_Section.model_config, "extra": "allow"})

    arch: Literal["sa", "resnet18"]

    @property
    def fields(self) -> dict[str, Any]:
        """The model fields this variant sets, ``arch`` first."""
        return {"arch": self.arch, **_split_fields(self.model_extra or {})[0]}

    @property
    def train_fields(self) -> dict[str, Any]:
        """The train fields this variant sets, by field name (``{"lr": 0.01}``); empty for most variants."""
        return _split_fields(self.model_extra or {})[1]

    def apply(self, base: ModelConfig) -> ModelConfig:
        """``base`` (the shared ``model`` section) with this variant's fields."""
        return ModelConfig.model_validate({**base.model_dump(), **self.fields})

    def apply_train(self, base: TrainConfig) -> TrainConfig:
        """``base`` (the shared ``train`` section) with this variant's train fields; ``base`` itself without any."""
        if not self.train_fields:
            return base
        return TrainConfig.model_validate({**base.model_dump(), **self.train_fields})

    @model_validator(mode="after")
    def _model_fields(self) -> VariantConfig:
        for key, value in (self.model_extra or {}).items():
            if key.startswith(TRAIN_PREFIX):
                _check_train_key(key, value)
        unknown = sorted(set(self.fields) - set(ModelConfig.model_fields))
        if unknown:
            raise ValueError(f".{unknown[0]}: not a model field; valid: {', '.join(ModelConfig.model_fields)}")
        try:
            ModelConfig.model_validate(self.fields)
        except ValidationError as err:
            raise ValueError(_first_problem(err)) from None
        if self.arch == "sa" and "encoding" not in self.fields:
            raise ValueError("an 'sa' variant needs an encoding")
        return self


class GridConfig(_Section):
    """Axes over model or train fields whose product is a set of named variants (``grid.<name>`` in params.yaml).

    ``axes`` maps a ``ModelConfig`` field, or a ``TrainConfig`` field written ``train.<field>`` (as in a variant), to
    the values it takes; every other key is a field shared by the grid's variants (``arch`` is required, as for a
    variant). The variants are the product of the axes in the order written, first axis outermost, and are named
    ``<grid>_<part>_<part>...``: a string value as it is (``quadratic``), any other value after its field without
    ``train.`` (``heads4``, ``hidden64``, ``lr0.01``, ``data_fraction0.25``): readable, and stable when an axis gains a
    value. ``name`` replaces that pattern with a template over the axes (``"sa_{encoding}_{heads}"``; a train axis is
    named there without its prefix too, ``"{data_fraction}"``, since a dotted name is no template field).
    """

    model_config = ConfigDict(**{**_Section.model_config, "extra": "allow"})

    axes: dict[str, list[Any]]
    name: str | None = None

    @field_validator("axes")
    @classmethod
    def _axes_of_model_fields(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not axes:
            raise ValueError("at least one axis is required, e.g. {heads: [4, 9]}")
        for field, values in axes.items():
            if not field.startswith(TRAIN_PREFIX) and field not in ModelConfig.model_fields:
                raise ValueError(
                    f".{field}: not a model field (a train field is written train.<field>); "
                    f"valid: {', '.join(ModelConfig.model_fields)}"
                )
            if not values:
                raise ValueError(f".{field}: at least one value is required")
            if repeated := [v for i, v in enumerate(values) if v in values[:i]]:
                raise ValueError(f".{field}: listed more than once: {repeated}")
            for value in values:
                if field.startswith(TRAIN_PREFIX):
                    _check_train_key(field, value)
                    continue
                try:
                    ModelConfig.model_validate({field: value})
                except ValidationError as err:
                    raise ValueError(f".{field}: value {value!r}: {err.errors()[0]['msg']}") from None
        return axes

    @model_validator(mode="after")
    def _fixed_model_fields(self) -> GridConfig:
        fixed = self.model_extra or {}
        if both := sorted(set(fixed) & set(self.axes)):
            raise ValueError(f".{both[0]}: set both as an axis and as a fixed field of the grid")
        for key, value in fixed.items():
            if key.startswith(TRAIN_PREFIX):
                _check_train_key(key, value)
        model_fixed = _split_fields(fixed)[0]
        if unknown := sorted(set(model_fixed) - set(ModelConfig.model_fields)):
            raise ValueError(f".{unknown[0]}: not a model field; valid: {', '.join(ModelConfig.model_fields)}")
        try:
            ModelConfig.model_validate(model_fixed)
        except ValidationError as err:
            raise ValueError(_first_problem(err)) from None
        return self

    def expand(self, grid: str) -> dict[str, VariantConfig]:
        """The grid's variants by name. Raises ``ValueError`` with a message relative to ``grid.<grid>``."""
        fixed = dict(self.model_extra or {})
        if "arch" not in fixed and "arch" not in self.axes:
            raise ValueError(".arch: required (sa or resnet18), as a fixed field or an axis")
        variants: dict[str, VariantConfig] = {}
        fields = list(self.axes)
        for values in itertools.product(*self.axes.values()):
            point = dict(zip(fields, values, strict=True))
            name = self._name(grid, point)
            if name in variants:
                raise ValueError(f".name: {name!r} names two variants of the grid; use every axis in the template")
            try:
                variants[name] = VariantConfig.model_validate({**fixed, **point})
            except ValidationError as err:
                message = err.errors()[0]["msg"].removeprefix("Value error, ")
                raise ValueError(f": variant {name!r} ({point}): {message.lstrip('.')}") from None
        return variants

    def _name(self, grid: str, point: dict[str, Any]) -> str:
        if self.name is None:
            parts = [
                value if isinstance(value, str) else f"{field.removeprefix(TRAIN_PREFIX)}{_token(value)}"
                for field, value in point.items()
            ]
            name = "_".join([grid, *parts])
        else:
            try:
                name = self.name.format(
                    grid=grid, **{field.removeprefix(TRAIN_PREFIX): v for field, v in point.items()}
                )
            except (KeyError, IndexError, ValueError) as err:
                raise ValueError(
                    f".name: {self.name!r} is not a template over the axes {list(point)} ({err})"
                ) from None
        if not VARIANT_NAME.match(name):
            raise ValueError(f".name: {name!r} is not a usable variant name (letters, digits, '_', '-', '.')")
        return name


def _token(value: Any) -> str:
    """A non-string axis value in a variant name: ``4``, ``0.1``, ``1e-06``, ``True``, ``None``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


class Resources(_Section):
    cpu: Annotated[float, Field(gt=0.0)] = 1.0
    gpu: Annotated[float, Field(ge=0.0)] = 0.0
    # A trial Ray gave a GPU that finds no CUDA (a CPU-only torch build, a driver missing on the node) fails with one
    # line; true lets it train on the CPU instead (and say so), e.g. to test GPU scheduling on a machine without one.
    cpu_fallback: bool = False


class AshaConfig(_Section):
    enabled: bool = False
    grace_period: PositiveInt = 1
    reduction_factor: Annotated[int, Field(ge=2)] = 2


# ``sweep.checkpoint_interval_s: auto`` (``SweepConfig.checkpoint_interval``). Ray Tune's experiment snapshot costs
# about 0.3 ms of driver CPU per trial in it (benchmarks/README.md: 0.335 CPU s more per trial over 1000 trials of 5
# checkpoints each, about 2500 snapshots of 500 trials on average); Tune keeps its periodic snapshots under 5 % of the
# driver's time, and so does the interval for the snapshots checkpoints force.
SNAPSHOT_S_PER_TRIAL = 0.0003
SNAPSHOT_SHARE = 0.05
AUTO_INTERVAL_MAX_S = 600.0  # a crash costs a trial at most 10 minutes of training (a drain notice: seconds)


class SweepConfig(_Section):
    """Which variants x seeds run as Ray Tune trials, and how."""

    variants: list[str] = Field(default_factory=lambda: list(PAPER_VARIANTS))
    seeds: list[Seed] = Field(default_factory=lambda: [0])
    resources: Resources = Resources()
    max_concurrent_trials: PositiveInt = 2
    max_failures: Annotated[int, Field(ge=-1)] = 2
    asha: AshaConfig = AshaConfig()
    # false: a trial whose identity (model, train config with seed, data, trial code) already has a finished run in
    # the tracking store is reused, an unfinished one continues from its checkpoint. true: every trial trains anew.
    retrain: bool = False
    # None: RAY_ADDRESS if set, else a local Ray. "auto" or "host:port": attach to that cluster.
    ray_address: str | None = None
    # Ray results (checkpoints to restore from): a path (relative paths resolve against the project root) or a
    # pyarrow file-system URI, e.g. s3://bucket/ray?endpoint_override=host:9000&scheme=http (credentials: environment).
    storage_path: Annotated[str, Field(min_length=1)] = "results/ray"
    # Least seconds between a trial's checkpoints, taken at an epoch's end (its last epoch always has one); 0: every
    # epoch. Past CheckpointConfig(num_to_keep=2), every second checkpoint of a trial makes Ray Tune snapshot the
    # whole experiment, every trial in it, so with hundreds of short trials the driver's CPU per trial grows with their
    # count (benchmarks.sweep_at_scale). A crash then costs a trial up to this much training more; a drain notice none.
    # "auto": the driver chooses it from the sweep's size (``checkpoint_interval``).
    checkpoint_interval_s: Annotated[float, Field(ge=0)] | Literal["auto"] = "auto"
    # Tests only: each trial raises once, right after reporting this epoch, on its first attempt (not when resumed
    # from a checkpoint), to exercise retries. Part of the trial config and of its MLflow params, never a hidden switch.
    fail_once_after_epoch: PositiveInt | None = None

    @field_validator("variants", "seeds")
    @classmethod
    def _some_and_distinct(cls, values: list, info: Any) -> list:
        if not values:
            raise ValueError(f"at least one {info.field_name.removesuffix('s')} is required")
        if repeated := sorted({v for v in values if values.count(v) > 1}):
            raise ValueError(f"listed more than once: {repeated} (each would run as an identical trial)")
        return values

    def checkpoint_interval(self, trials: int) -> float:
        """``checkpoint_interval_s`` for a sweep of ``trials`` trials, ``auto`` resolved by Tune's own rule for its
        snapshots (at most 5 % of the driver's time): a trial checkpointing every T seconds forces a snapshot every 2T,
        so ``max_concurrent_trials`` of them force C / 2T a second, each costing ``SNAPSHOT_S_PER_TRIAL`` per trial of
        the sweep; T is the least interval that keeps that share at 5 %, 0 (every epoch) below a second (a sweep of
        C x trials < 333: the study's, a test's), at most ``AUTO_INTERVAL_MAX_S``."""
        if self.checkpoint_interval_s != "auto":
            return self.checkpoint_interval_s
        least = self.max_concurrent_trials * trials * SNAPSHOT_S_PER_TRIAL / (2 * SNAPSHOT_SHARE)
        return 0.0 if least < 1 else min(AUTO_INTERVAL_MAX_S, float(math.ceil(least)))

    @field_validator("storage_path")
    @classmethod
    def _a_path_or_file_system_uri(cls, path: str) -> str:
        """A URI must name a file system pyarrow opens, without credentials in it (it is recorded in MLflow and the
        manifests). Nothing is contacted here: the tune stage's preflight writes and reads a marker there."""
        if "://" not in path:
            return path
        parts = urlsplit(path)
        if parts.scheme not in FILE_SYSTEM_SCHEMES:
            raise ValueError(
                f"{path!r}: {parts.scheme}:// is not a file system pyarrow opens; give a path or a URI "
                f"with one of {', '.join(FILE_SYSTEM_SCHEMES)}"
            )
        if parts.password or (parts.username and parts.scheme in ("s3", "gs", "gcs")):
            raise ValueError(
                f"{parts.scheme}://...: credentials do not belong in the URI (it is recorded in MLflow "
                "and the manifests); give them through the environment of every node "
                "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, an instance role, "
                "GOOGLE_APPLICATION_CREDENTIALS)"
            )
        if not (parts.netloc if parts.scheme != "file" else parts.path.startswith("/")):
            raise ValueError(f"{path!r}: name the bucket (or host), e.g. s3://bucket/ray, or file:///absolute/path")
        return path


class PruneConfig(_Section):
    """Pruning degenerate heads of trained Gaussian-attention models, then fine-tuning them (App. A.1).

    ``mode: threshold`` is the paper's rule: cut a head whose ``Sigma^-1`` has largest eigenvalue < ``min_eigenvalue``
    (it attends uniformly) or condition number > ``max_condition`` (a thin stripe; the authors' code used 1000, the
    paper's text says 1e5). ``mode: fraction`` is ours: per layer, cut the ``fraction`` most degenerate heads (at
    least one), ranked by the same criteria.
    """

    # null: every variant of the sweep with the generalized quadratic encoding (the paper pruned that model).
    variants: list[str] | None = None
    mode: Literal["threshold", "fraction"] = "threshold"
    min_eigenvalue: Annotated[float, Field(gt=0.0)] = 1e-5
    max_condition: Annotated[float, Field(gt=1.0)] = 1000.0
    fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.25
    # Fine-tuning: the sweep's train section with lr x lr_factor (paper: 1/10) for `epochs` epochs (authors: 100).
    lr_factor: Annotated[float, Field(gt=0.0)] = 0.1
    epochs: Epochs = 100


class TransformConfig(_Section):
    """Theorem 1 on a trained network (beyond the paper): a trained ResNet18 of the sweep rebuilt as an exactly equal
    attention network (every 3x3 convolution a 9-head quadratic attention layer), checked equal before any training,
    then fine-tuned as attention (``pipeline.finetune.transform``)."""

    # name -> the sweep's ResNet18 variant it is built from, seed by seed (the default study: {t_resnet18: resnet18}).
    variants: dict[str, str] = Field(default_factory=dict)
    # Fine-tuning: the sweep's train section with lr x lr_factor for `epochs` epochs; centres and spreads train too.
    lr_factor: Annotated[float, Field(gt=0.0)] = 0.1
    epochs: Epochs = 3

    @field_validator("variants")
    @classmethod
    def _names(cls, variants: dict[str, str]) -> dict[str, str]:
        for name in variants:
            if not VARIANT_NAME.match(name):
                raise ValueError(f".{name}: not a usable variant name (letters, digits, '_', '-', '.')")
        return variants


class TrackingConfig(_Section):
    """MLflow. ``uri`` None means an sqlite store at ``<project>/mlflow.db`` (never ``file:`` / ``./mlruns``)."""

    uri: str | None = None
    experiment: str = "attention-cnn"
    # An sqlite uri with a multi-node Ray cluster is refused (its runs would live on the driver's disk only) unless true
    sqlite_on_cluster: bool = False
    # Projects sharing one store never train a trial at once (``pipeline.sweep.tracking.claims``): a claim whose
    # driver sent no heartbeat for this long (or whose process is gone, on the same host) is taken over.
    claim_timeout_s: Annotated[float, Field(ge=5.0, le=86400.0)] = 120.0
    # Each trial's run gets its machine's CPU, memory (and GPU) use, sampled in the Ray worker by MLflow's own monitor
    # (``pipeline.sweep.tracking.system_metrics``). Off: the workers never import MLflow (0.4-1.1 CPU-s per worker)
    # and write nothing to the store; MLflow's own default is off, for the same reasons.
    system_metrics: bool = True

    @field_validator("experiment")
    @classmethod
    def _named(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("the experiment needs a name (it is blank)")
        return name

    @field_validator("uri")
    @classmethod
    def _supported_store(cls, uri: str | None) -> str | None:
        if uri is None:
            return uri
        if uri.startswith("file:") or "://" not in uri:
            raise ValueError("use an sqlite:/// or http(s):// URI; file stores are removed in MLflow >= 3.13")
        scheme = uri.split("://", 1)[0].split("+", 1)[0]  # postgresql+psycopg2:// is postgresql
        if scheme not in TRACKING_SCHEMES:
            raise ValueError(f"unsupported scheme {scheme!r}; use one of {sorted(TRACKING_SCHEMES)}")
        return uri


# What pyarrow.fs.FileSystem.from_uri opens (and so Ray Tune's storage_path): S3 and S3-compatible stores, Google Cloud
# Storage, HDFS, Azure (ADLS Gen2), local files.
FILE_SYSTEM_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "file")
# Tracking stores MLflow 3 accepts: a tracking server, or a database it migrates itself.
TRACKING_SCHEMES = {"http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks"}


# The paper's models (Figure 5 / Figure 9), declared beside the encodings they use. params.yaml may define more
# under ``variants``.
PAPER_VARIANTS: dict[str, VariantConfig] = {
    name: VariantConfig.model_validate(fields) for name, fields in PAPER_VARIANT_FIELDS.items()
}


class Params(_Section):
    """The whole of ``params.yaml``."""

    seed: Seed = 0
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    # Declared before ``variants`` and ``sweep``: their validators read the validated grids (``info.data``).
    grid: dict[str, GridConfig] = Field(default_factory=dict)
    # Every variant: the ones written out and each grid's, expanded (a grid is shorthand for writing them out).
    variants: dict[str, VariantConfig] = Field(default_factory=lambda: dict(PAPER_VARIANTS), validate_default=True)
    sweep: SweepConfig = Field(default_factory=SweepConfig, validate_default=True)
    prune: PruneConfig = PruneConfig()
    transform: TransformConfig = TransformConfig()
    tracking: TrackingConfig = TrackingConfig()

    @field_validator("grid")
    @classmethod
    def _grid_names(cls, grids: dict[str, GridConfig]) -> dict[str, GridConfig]:
        for name, grid in grids.items():
            if not VARIANT_NAME.match(name):
                raise ValueError(f".{name}: not a usable grid name (letters, digits, '_', '-', '.')")
            try:
                grid.expand(name)
            except ValueError as err:
                raise ValueError(f".{name}{err}") from None
        return grids

    @field_validator("variants")
    @classmethod
    def _with_grid_variants(cls, variants: dict[str, VariantConfig], info: ValidationInfo) -> dict[str, VariantConfig]:
        """The written variants, then each grid's. A grid's variant may also be written out only with the same fields:
        that is what a dumped and re-read ``Params`` holds (the trial rebuilds its config that way)."""
        for name in variants:
            if not VARIANT_NAME.match(name):
                raise ValueError(f".{name}: not a usable variant name (letters, digits, '_', '-', '.')")
        grids: dict[str, GridConfig] = info.data.get("grid", {})  # absent when the grid itself is invalid
        merged = dict(variants)
        for grid_name, grid in grids.items():
            if grid_name in variants:
                raise ValueError(f".{grid_name}: also the name of grid.{grid_name}; a name means one thing")
            for name, variant in grid.expand(grid_name).items():
                if merged.setdefault(name, variant) != variant:
                    raise ValueError(f".{name}: also a variant of grid.{grid_name}, with other fields")
        return merged

    @field_validator("sweep")
    @classmethod
    def _grids_expanded(cls, sweep: SweepConfig, info: ValidationInfo) -> SweepConfig:
        """``sweep.variants`` may name a grid: it stands for the grid's variants, in the grid's order."""
        grids: dict[str, GridConfig] = info.data.get("grid", {})
        if not any(name in grids for name in sweep.variants):
            return sweep
        expanded = [v for name in sweep.variants for v in (grids[name].expand(name) if name in grids else [name])]
        if repeated := sorted({v for v in expanded if expanded.count(v) > 1}):
            raise ValueError(f".variants: {repeated} listed more than once (by name and by its grid)")
        return sweep.model_copy(update={"variants": expanded})

    @model_validator(mode="after")
    def _sweep_names_known(self) -> Params:
        for name in self.sweep.variants:
            if name not in self.variants:
                known = f"defined: {sorted(self.variants)}" + (f", grids: {sorted(self.grid)}" if self.grid else "")
                raise ValueError(f"sweep.variants: unknown variant {name!r}; {known}")
        for name in self.prune.variants or []:
            if name not in self.sweep.variants or name not in self.variants:
                raise ValueError(f"prune.variants: {name!r} is not a variant of the sweep ({self.sweep.variants})")
            model = self.model_for(name)
            if model.arch != "sa" or not spec_for(model.encoding).gaussian:
                what = (
                    "ResNet18 has no attention heads"
                    if model.arch != "sa"
                    else (f"its {model.encoding!r} encoding has no covariance to prune by")
                )
                raise ValueError(
                    f"prune.variants: cannot prune {name!r}: {what}; prunable encodings: {gaussian_encodings()}"
                )
        for name, source in self.transform.variants.items():
            where = f"transform.variants.{name}"
            if name in self.variants:
                raise ValueError(f"{where}: also the name of variants.{name}; a name means one thing")
            if source not in self.variants or self.variants[source].arch != "resnet18":
                resnets = sorted(v for v, cfg in self.variants.items() if cfg.arch == "resnet18")
                raise ValueError(f"{where}: {source!r} is not a resnet18 variant; defined: {resnets}")
        if self.train.device == "cuda" and self.sweep.resources.gpu == 0:
            raise ValueError("train.device: 'cuda' needs sweep.resources.gpu > 0 (a trial gets only the GPUs it asks)")
        for name in self.sweep.variants:
            if self.train_for(name).device == "cuda" and self.sweep.resources.gpu == 0:
                raise ValueError(
                    f"variants.{name}.train.device: 'cuda' needs sweep.resources.gpu > 0 "
                    "(a trial gets only the GPUs it asks)"
                )
        asha = self.sweep.asha
        if asha.enabled and asha.grace_period > self.train.epochs:
            raise ValueError(
                f"sweep.asha.grace_period: {asha.grace_period} is more than train.epochs ({self.train.epochs}); "
                "ASHA needs to compare trials before their end"
            )
        for downsample in sorted({self.model_for(name).downsample for name in self.attention_variants()}):
            if self.data.image_size % downsample:
                needing = [name for name in self.attention_variants() if self.model_for(name).downsample == downsample]
                raise ValueError(
                    f"data.image_size: {self.data.image_size} is not divisible by model.downsample "
                    f"({downsample}), which the attention variants {needing} need"
                )
        return self

    def prune_variants(self) -> list[str]:
        """The sweep variants the prune stage prunes: ``prune.variants``, else those whose encoding's declaration says
        the paper pruned it (``pruned_by_default``: the generalized quadratic one)."""
        if self.prune.variants is not None:
            return list(self.prune.variants)
        return [v for v in self.attention_variants() if spec_for(self.model_for(v).encoding).pruned_by_default]

    def attention_variants(self) -> list[str]:
        """The sweep's self-attention variants, in sweep order."""
        return [v for v in self.sweep.variants if self.variants[v].arch == "sa"]

    def model_for(self, variant: str) -> ModelConfig:
        """The shared ``model`` section with the named variant's fields applied; a ``transform`` variant is its
        source's model as ``t_resnet18`` (the architecture its fine-tuning trials build)."""
        if variant in self.transform.variants:
            return self.model_for(self.transform.variants[variant]).model_copy(update={"arch": "t_resnet18"})
        if variant not in self.variants:
            raise KeyError(f"unknown variant {variant!r}; defined: {sorted(self.variants)}")
        return self.variants[variant].apply(self.model)

    def train_for(self, variant: str) -> TrainConfig:
        """The shared ``train`` section with the named variant's ``train.<field>`` overrides (the section itself for a
        variant without any); a ``transform`` variant trains as its source does. What a trial of ``variant`` trains
        with, before its seed is set."""
        if variant in self.transform.variants:
            return self.train_for(self.transform.variants[variant])
        if variant not in self.variants:
            raise KeyError(f"unknown variant {variant!r}; defined: {sorted(self.variants)}")
        return self.variants[variant].apply_train(self.train)


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid parameters"]
    for problem in err.errors():
        key = ".".join(str(part) for part in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see params.yaml for the valid keys)"
        if message.startswith("."):  # a validator naming a key below its own: ".heads: ..." -> variants.x.heads: ...
            relative, _, message = message[1:].partition(": ")
            key = f"{key}.{relative}" if key else relative
        # Cross-field validators already name their dotted key at the start of the message.
        lines.append(f"  {message}" if not key or message.startswith(f"{key}.") else f"  {key}: {message}")
    return "\n".join(lines)


def parse_params(raw: Any, source: str = "<params>") -> Params:
    """Validate an already-loaded mapping; ``source`` names where it came from in error messages."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        # Strict types: no string is coerced to a number or a boolean (an int is accepted where a float is expected).
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-4`` (no dot) as a string; researchers write it that way, so read it as a float.

    A key written twice is an error: YAML would keep the last value silently (``epochs: 4`` ... ``epochs: 300``).
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark, f"found the key {key!r} twice", key_node.start_mark
                    )
                seen.add(key)
            except TypeError:  # an unhashable key: let the base class report it
                break
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)$"),
    list("-+0123456789."),
)


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate a params file. Raises ``ConfigError`` naming the file and the offending key."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a params file")
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if raw is None:  # an empty file would silently be the paper's full configuration
        raise ConfigError(f"{path}: the params file is empty")
    return parse_params(raw, str(path))


def params_hash(section: BaseModel | dict) -> str:
    """Short stable hash of a config (section), used for experiment names and MLflow tags."""
    data = section.model_dump(mode="json") if isinstance(section, BaseModel) else section
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
