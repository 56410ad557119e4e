"""params.yaml -> typed config: the shipped files validate; bad input fails naming the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import ConfigError, Params, load_params, params_hash, parse_params

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(ROOT) for p in [ROOT / "params.yaml", *ROOT.glob("params/*.yaml")])
)
def test_shipped_params_files_validate(path: Path) -> None:
    params = load_params(ROOT / path)
    for name in params.sweep.variants:
        params.model_for(name)


def test_yaml_exponent_floats_are_floats(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  weight_decay: 1e-4\n  lr: 1\n")
    params = load_params(path)
    assert params.train.weight_decay == pytest.approx(1e-4) and params.train.lr == 1.0


@pytest.mark.parametrize(
    ("raw", "key", "message"),
    [
        ({"modle": {}}, "modle", "unknown key"),
        ({"model": {"heads": 0}}, "model.heads", "greater than 0"),
        ({"model": {"encoding": "cubic"}}, "model.encoding", "Input should be 'quadratic'"),
        ({"train": {"lr": "fast"}}, "train.lr", "valid number"),
        ({"train": {"augment": "yes"}}, "train.augment", "boolean"),
        ({"train": {"schedule": "linear"}}, "train.schedule", "'step' or 'epoch'"),
        ({"sweep": {"variants": ["nope"]}}, "sweep.variants", "unknown variant 'nope'"),
        ({"sweep": {"seeds": []}}, "sweep.seeds", "at least one seed"),
        ({"sweep": {"storage_path": "ftp://host/ray"}}, "sweep.storage_path", "ftp:// is not a file system"),
        ({"sweep": {"storage_path": "s3://KEY:SECRET@bucket/ray"}}, "sweep.storage_path", "credentials do not belong"),
        ({"sweep": {"storage_path": "s3:///ray"}}, "sweep.storage_path", "name the bucket"),
        ({"data": {"dataset": "cifar10"}}, "data.cifar10_path", "required"),
        ({"tracking": {"uri": "./mlruns"}}, "tracking.uri", "file stores"),
        ({"train": {"device": "cuda"}}, "train.device", "sweep.resources.gpu > 0"),
        ({"variants": {"x": {"arch": "sa"}}}, "variants.x", "needs an encoding"),
        (
            {"variants": {"x": {"arch": "sa", "encoding": "cubic"}}, "sweep": {"variants": ["x"]}},
            "variants.x.encoding",
            "Input should be 'quadratic'",
        ),
        # Found by a bad-input audit: each used to pass validation and fail (or waste compute) after Ray started.
        ({"sweep": {"variants": []}}, "sweep.variants", "at least one variant"),
        ({"sweep": {"seeds": [0, 0]}}, "sweep.seeds", "more than once: [0]"),
        ({"sweep": {"variants": ["resnet18", "resnet18"]}}, "sweep.variants", "more than once: ['resnet18']"),
        ({"sweep": {"seeds": [-1]}}, "sweep.seeds.0", "greater than or equal to 0"),
        ({"sweep": {"seeds": [2**70]}}, "sweep.seeds.0", "less than 4294967296"),
        ({"seed": -1}, "seed", "greater than or equal to 0"),
        ({"train": {"seed": -1}}, "train.seed", "greater than or equal to 0"),
        ({"data": {"image_size": 15}}, "data.image_size", "not divisible by model.downsample (2)"),
        ({"model": {"downsample": 3}, "data": {"image_size": 32}}, "data.image_size", "model.downsample (3)"),
        (
            {"train": {"epochs": 4}, "sweep": {"asha": {"enabled": True, "grace_period": 10}}},
            "sweep.asha.grace_period",
            "more than train.epochs (4)",
        ),
        ({"tracking": {"uri": "foo://bar"}}, "tracking.uri", "unsupported scheme 'foo'"),
        ({"tracking": {"experiment": ""}}, "tracking.experiment", "it is blank"),
        ({"tracking": {"experiment": "   "}}, "tracking.experiment", "it is blank"),
        ({"train": {"lr": 1e400}}, "train.lr", "finite number"),
        ({"model": {"centre_init_std": float("inf")}}, "model.centre_init_std", "finite number"),
        ({"sweep": {"storage_path": ""}}, "sweep.storage_path", "at least 1 character"),
        # A variant sets any model field; grids expand into variants. Every refusal names the key.
        (
            {"variants": {"x": {"arch": "sa", "encoding": "learned", "hiden": 64}}},
            "variants.x.hiden",
            "not a model field",
        ),
        (
            {"variants": {"x": {"arch": "sa", "encoding": "learned", "hidden": 0}}},
            "variants.x.hidden",
            "greater than 0",
        ),
        ({"variants": {"x/y": {"arch": "resnet18"}}}, "variants.x/y", "not a usable variant name"),
        ({"grid": {"g": {"arch": "sa", "axes": {"heads": [4, 0]}}}}, "grid.g.axes.heads", "value 0: Input should be"),
        ({"grid": {"g": {"arch": "sa", "axes": {"heads": [4, "9"]}}}}, "grid.g.axes.heads", "value '9': Input should"),
        ({"grid": {"g": {"arch": "sa", "axes": {"hedas": [4]}}}}, "grid.g.axes.hedas", "not a model field"),
        ({"grid": {"g": {"arch": "sa", "axes": {"heads": []}}}}, "grid.g.axes.heads", "at least one value"),
        ({"grid": {"g": {"arch": "sa", "axes": {"heads": [4, 4]}}}}, "grid.g.axes.heads", "more than once: [4]"),
        ({"grid": {"g": {"arch": "sa", "axes": {}}}}, "grid.g.axes", "at least one axis"),
        ({"grid": {"g": {"axes": {"heads": [4]}}}}, "grid.g.arch", "required"),
        (
            {"grid": {"g": {"arch": "sa", "axes": {"heads": [4]}}}},
            "grid.g",
            "'g_heads4' ({'heads': 4}): an 'sa' variant",
        ),
        ({"grid": {"g": {"arch": "sa", "hidden": -1, "axes": {"heads": [4]}}}}, "grid.g.hidden", "greater than 0"),
        ({"grid": {"g": {"arch": "sa", "heads": 4, "axes": {"heads": [4]}}}}, "grid.g.heads", "axis and as a fixed"),
        (
            {"grid": {"g": {"arch": "sa", "encoding": "learned", "axes": {"heads": [4, 9]}, "name": "g_{hidden}"}}},
            "grid.g.name",
            "not a template over the axes ['heads']",
        ),
        (
            {"grid": {"g": {"arch": "sa", "axes": {"encoding": ["learned"], "heads": [4, 9]}, "name": "g_{encoding}"}}},
            "grid.g.name",
            "'g_learned' names two variants",
        ),
        (
            {"grid": {"g": {"arch": "sa", "axes": {"encoding": ["learned"]}}}, "variants": {"g": {"arch": "resnet18"}}},
            "variants.g",
            "also the name of grid.g",
        ),
        (
            {
                "grid": {"g": {"arch": "sa", "axes": {"encoding": ["learned"]}}},
                "variants": {"g_learned": {"arch": "sa", "encoding": "quadratic"}},
            },
            "variants.g_learned",
            "also a variant of grid.g, with other fields",
        ),
        (
            {
                "grid": {"g": {"arch": "sa", "axes": {"encoding": ["learned"]}}},
                "sweep": {"variants": ["g", "g_learned"]},
            },
            "sweep.variants",
            "['g_learned'] listed more than once",
        ),
        (
            {"grid": {"g": {"arch": "sa", "axes": {"encoding": ["learned"]}}}, "sweep": {"variants": ["h"]}},
            "sweep.variants",
            "grids: ['g']",
        ),
        ({"train": {"positional_lr_factor": 0}}, "train.positional_lr_factor", "greater than 0"),
        ({"train": {"positional_lr_factor": "10"}}, "train.positional_lr_factor", "valid number"),
        # absurd values (issue 29's probe passed them to Ray): refused by their bounds, naming the key
        ({"train": {"epochs": 1000000000000}}, "train.epochs", "less than or equal to 100000"),
        ({"model": {"layers": 1000000000}}, "model.layers", "less than or equal to 1024"),
        ({"train": {"lr": 1e308}}, "train.lr", "less than or equal to 1000"),
        ({"variants": {"big": {"arch": "sa", "hidden": 10**9}}}, "variants.big.hidden", "less than or equal to 65536"),
        ({"prune": {"epochs": 10**9}}, "prune.epochs", "less than or equal to 100000"),
        # issue 39: plug-in encodings, content scores, GPSA
        ({"model": {"encoding": "cubic"}}, "model.encoding", "'gpsa'"),  # the error lists the registry's names
        ({"variants": {"r": {"arch": "resnet18", "content": True}}}, "variants.r.content", "needs self-attention"),
        ({"model": {"encoding": "gpsa", "content": True}}, "model.content", "already computes"),
        ({"model": {"content": True, "attention_window_eps": 1e-6}}, "model.attention_window_eps", "position-only"),
        ({"model": {"encoding": "gpsa", "locality_strength": 0}}, "model.locality_strength", "greater than 0"),
        ({"model": {"locality": 1.0}}, "model.locality", "unknown key"),
        # issue 39 item 4: train fields of a variant or grid axis, and the data fraction
        ({"train": {"data_fraction": 0}}, "train.data_fraction", "greater than 0"),
        ({"train": {"data_fraction": 1.5}}, "train.data_fraction", "less than or equal to 1"),
        ({"train": {"data_fraction": -0.25}}, "train.data_fraction", "greater than 0"),
        (
            {"variants": {"x": {"arch": "resnet18", "train.data_fraction": 0.0}}},
            "variants.x.train.data_fraction",
            "value 0.0: Input should be greater than 0",
        ),
        ({"variants": {"x": {"arch": "resnet18", "train.lrr": 0.01}}}, "variants.x.train.lrr", "not a train field"),
        ({"variants": {"x": {"arch": "resnet18", "train.lr": "low"}}}, "variants.x.train.lr", "valid number"),
        ({"variants": {"x": {"arch": "resnet18", "train.epochs": 3}}}, "variants.x.train.epochs", "ASHA's max_t"),
        ({"variants": {"x": {"arch": "resnet18", "train.seed": 3}}}, "variants.x.train.seed", "sweep.seeds"),
        (
            {"grid": {"g": {"arch": "resnet18", "axes": {"train.data_fraction": [0.5, 2.0]}}}},
            "grid.g.axes.train.data_fraction",
            "value 2.0: Input should be less than or equal to 1",
        ),
        ({"grid": {"g": {"arch": "resnet18", "axes": {"train.size": [1]}}}}, "grid.g.axes.train.size", "not a train"),
        ({"grid": {"g": {"arch": "resnet18", "axes": {"lr": [0.1]}}}}, "grid.g.axes.lr", "written train.<field>"),
        ({"grid": {"g": {"arch": "resnet18", "axes": {"train.epochs": [1, 2]}}}}, "grid.g.axes.train.epochs", "per"),
        (
            {"grid": {"g": {"arch": "resnet18", "train.momentum": 1.0, "axes": {"train.lr": [0.1]}}}},
            "grid.g.train.momentum",
            "less than 1",
        ),
        (
            {"variants": {"x": {"arch": "resnet18", "train.device": "cuda"}}, "sweep": {"variants": ["x"]}},
            "variants.x.train.device",
            "sweep.resources.gpu > 0",
        ),
    ],
)
def test_bad_values_name_the_file_and_key(raw: dict, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_params(raw, "my-params.yaml")
    text = str(err.value)
    assert text.startswith("my-params.yaml")
    assert key in text and message in text


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_params(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_params(listy)


def test_odd_image_sizes_are_fine_for_resnet_alone() -> None:
    assert parse_params({"data": {"image_size": 15}, "sweep": {"variants": ["resnet18"]}}).data.image_size == 15


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "the params file is empty"),  # would silently be the paper's full configuration
        (b"# only a comment\n", "the params file is empty"),
        (b"train:\n  epochs: 4\n  epochs: 300\n", "found the key 'epochs' twice"),
        (b"seed: 0\nseed: 1\n", "found the key 'seed' twice"),
        (b"model:\n  hidden: \xff\n", "not UTF-8 text"),
    ],
)
def test_params_files_that_would_be_misread(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "params.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as err:
        load_params(path)
    assert str(err.value).startswith(str(path))


def test_a_directory_is_not_a_params_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_params(tmp_path)


def test_variant_overrides_and_frozen_configs() -> None:
    params = Params()
    cfg = params.model_for("sa_learned_9")
    assert (cfg.encoding, cfg.heads, cfg.hidden) == ("learned", 9, 400)
    assert params.model_for("resnet18").arch == "resnet18"
    with pytest.raises(KeyError, match="unknown variant"):
        params.model_for("vit")
    with pytest.raises(Exception, match="frozen"):
        cfg.heads = 3


def test_params_hash_is_stable_and_sensitive() -> None:
    a, b = Params(), parse_params({"train": {"epochs": 3}})
    assert params_hash(a) == params_hash(Params()) and params_hash(a) != params_hash(b)
    assert len(params_hash(a.train)) == 12


GRID = {
    "grid": {"sa": {"arch": "sa", "hidden": 48, "axes": {"encoding": ["quadratic", "learned"], "heads": [4, 16]}}},
    "variants": {
        "sa_quadratic_9": {"arch": "sa", "encoding": "quadratic", "heads": 9},
        "resnet18": {"arch": "resnet18"},
    },
    "sweep": {"variants": ["sa_quadratic_9", "sa", "resnet18"]},
}


def test_a_grid_expands_into_named_variants_in_the_sweep() -> None:
    params = parse_params(GRID)
    grid = ["sa_quadratic_heads4", "sa_quadratic_heads16", "sa_learned_heads4", "sa_learned_heads16"]
    assert params.sweep.variants == ["sa_quadratic_9", *grid, "resnet18"]  # the grid's name stands for its variants
    assert list(params.variants) == ["sa_quadratic_9", "resnet18", *grid]
    learned = params.model_for("sa_learned_heads16")
    assert (learned.encoding, learned.heads, learned.hidden, learned.layers) == ("learned", 16, 48, 6)
    assert params.model_for("sa_quadratic_9").hidden == 400  # the grid's fixed fields are its own
    # What the trial and the prune stage rebuild from the dumped params is the same study.
    assert parse_params(params.model_dump(mode="json")) == params


def test_grid_names_are_stable_readable_and_templated() -> None:
    named = {**GRID, "grid": {"sa": {**GRID["grid"]["sa"], "name": "{encoding}-{heads}h"}}}
    assert parse_params(named).sweep.variants[1:3] == ["quadratic-4h", "quadratic-16h"]
    axes = {"encoding": ["quadratic", "learned"], "heads": [4, 9, 16]}
    grown = {**GRID, "grid": {"sa": {**GRID["grid"]["sa"], "axes": axes}}}
    before, after = parse_params(GRID).sweep.variants, parse_params(grown).sweep.variants
    assert set(before) < set(after)  # a value more adds variants and renames none
    axes = {"hidden": [32], "dropout": [0.0, 0.25], "attention_window_eps": [None, 1e-6]}
    mixed = {"grid": {"w": {"arch": "sa", "encoding": "learned", "axes": axes}}}
    assert list(parse_params(mixed).variants)[-4:] == [
        "w_hidden32_dropout0_attention_window_epsNone",
        "w_hidden32_dropout0_attention_window_eps1e-06",
        "w_hidden32_dropout0.25_attention_window_epsNone",
        "w_hidden32_dropout0.25_attention_window_eps1e-06",
    ]


def test_a_variant_overrides_any_model_field() -> None:
    deep = {"arch": "sa", "encoding": "learned", "layers": 3, "learned_dim": 8}
    params = parse_params({"variants": {"deep": deep}, "sweep": {"variants": ["deep"]}})
    deep = params.model_for("deep")
    assert (deep.layers, deep.learned_dim, deep.heads) == (3, 8, 9)
    assert params.variants["deep"].fields == {"arch": "sa", "encoding": "learned", "layers": 3, "learned_dim": 8}


def test_a_variant_sets_train_fields_and_keeps_its_model() -> None:
    gpsa = {"arch": "sa", "encoding": "gpsa", "heads": 9, "train.lr": 0.01}
    params = parse_params({"train": {"lr": 0.1, "epochs": 4}, "variants": {"g": gpsa}, "sweep": {"variants": ["g"]}})
    assert params.train_for("g") == params.train.model_copy(update={"lr": 0.01})
    assert params.variants["g"].fields == {"arch": "sa", "encoding": "gpsa", "heads": 9}  # no train key in the model
    assert params.variants["g"].train_fields == {"lr": 0.01}
    assert params.model_for("g") == parse_params({"model": {"encoding": "gpsa"}}).model
    assert Params().train_for("sa_quadratic_9") is Params().train  # no train keys: the section itself
    assert parse_params(params.model_dump(mode="json")) == params  # what the trial rebuilds is the same study


def test_a_grid_over_train_fields_names_its_variants_after_the_field() -> None:
    axes = {"train.data_fraction": [0.25, 0.5, 1.0]}
    params = parse_params({"grid": {"size": {"arch": "sa", "encoding": "quadratic", "heads": 9, "axes": axes}}})
    names = ["size_data_fraction0.25", "size_data_fraction0.5", "size_data_fraction1"]
    assert list(params.variants)[-3:] == names
    assert [params.train_for(n).data_fraction for n in names] == [0.25, 0.5, 1.0]
    assert {params.model_for(n) for n in names} == {params.model_for("sa_quadratic_9")}
    mixed = {"arch": "sa", "encoding": "gpsa", "axes": {"heads": [4], "train.lr": [0.01, 0.1]}, "train.momentum": 0.5}
    params = parse_params({"grid": {"m": mixed}})
    assert list(params.variants)[-2:] == ["m_heads4_lr0.01", "m_heads4_lr0.1"]
    assert params.train_for("m_heads4_lr0.01").momentum == 0.5  # a grid's fixed train field
    templated = {**mixed, "name": "gpsa_{heads}_lr{lr}"}  # a train axis is named in a template without its prefix
    assert list(parse_params({"grid": {"m": templated}}).variants)[-2:] == ["gpsa_4_lr0.01", "gpsa_4_lr0.1"]


def test_the_auto_checkpoint_interval_grows_with_the_sweep_and_a_given_one_stays() -> None:
    """``auto`` keeps Tune's forced snapshots under 5 % of the driver: every epoch for a study's or a test's few
    trials, seconds at a thousand, longer with more at once, capped; a number given is used as it is."""
    sweep = Params().sweep
    assert sweep.checkpoint_interval_s == "auto"
    assert [sweep.checkpoint_interval(n) for n in (1, 7, 100, 300, 1000)] == [0.0, 0.0, 0.0, 2.0, 6.0]
    wide = sweep.model_copy(update={"max_concurrent_trials": 64})
    assert wide.checkpoint_interval(1000) == 192.0 and wide.checkpoint_interval(10**6) == 600.0
    assert sweep.model_copy(update={"checkpoint_interval_s": 0.0}).checkpoint_interval(1000) == 0.0
    assert sweep.model_copy(update={"checkpoint_interval_s": 60.0}).checkpoint_interval(7) == 60.0
