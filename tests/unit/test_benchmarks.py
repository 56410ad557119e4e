"""The benchmark scripts run end to end at their smallest sizes and print what they promise (nothing is timed here).

A benchmark that breaks silently is found only on the day someone rents a GPU to run it; these runs catch that on
the CPU. They check the tables' content (rows, finite positive rates, FLOPs saved), never a speed.
"""

from __future__ import annotations

import importlib
import math
import re
from pathlib import Path

import pytest
import yaml

from benchmarks import finding, gpsa_cost, gpu_profile, gpu_sharing, train_speed, train_throughput, truncation
from benchmarks.gpu_sharing import WorkerResult, aggregate_images_per_s

PARAMS = str(Path(__file__).resolve().parents[2] / "params.yaml")
BENCHMARKS = (
    "train_speed",
    "train_throughput",
    "truncation",
    "gpu_sharing",
    "finding",
    "sweep_scale",
    "trial_fixed_cost",
    "tracking_load",
    "gpu_evidence",
    "sweep_at_scale",
    "sweep_concurrency",
    "mlflow_ui_load",
    "gpsa_cost",
    "gpu_profile",
    "analysis_at_scale",
)
# The first expensive call of each script: bad input must be refused before it.
FIRST_WORK = {
    "train_speed": "prepare_dataset",
    "train_throughput": "matmul_peak_flops",
    "truncation": "error_table",
    "gpu_sharing": "run",
    "finding": "prepare_dataset",
    "sweep_scale": "fill_store",
    "trial_fixed_cost": "trial_rows",
    "tracking_load": "MlflowServer",
    "gpu_evidence": "Evidence",
    "sweep_at_scale": "prepare_dataset",
    "sweep_concurrency": "prepare_dataset",
    "mlflow_ui_load": "populate",
    "gpsa_cost": "timed_epochs",
    "gpu_profile": "profile_case",
    "analysis_at_scale": "build_store",
}
_no_cuda = pytest.mark.skipif("__import__('torch').cuda.is_available()", reason="needs a machine without CUDA")


def _table(text: str, header_start: str) -> list[list[str]]:
    """The whitespace-split rows under the header line that starts with ``header_start`` and its rule."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def _number(cell: str) -> float:
    return float(cell.rstrip("%").replace(",", ""))


def test_gpsa_cost_prints_both_variants_paired(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpsa_cost.main(["--params", PARAMS, "--pairs", "1", "--images", "16"]) == 0
    rows = _table(capsys.readouterr().out, "variant")
    assert [row[0] for row in rows] == ["sa_quadratic_9", "sa_gpsa_9"]
    assert rows[0][-1] == "1.00" and all(float(row[1]) > 0 for row in rows)


def test_gpu_profile_prints_each_case_with_its_top_operators(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--params", PARAMS, "--variants", "sa_quadratic_9", "resnet18", "--paths", "plain"]
    assert gpu_profile.main([*argv, "--batch-sizes", "2", "--steps", "1", "--profiled-steps", "1", "--top", "3"]) == 0
    out = capsys.readouterr().out
    cases = re.findall(
        r"^(\S+) / (\S+) / batch (\d+): ([\d,.]+) images/s, .* MFU ([\d.]+) %, device busy (\d+) %", out, re.M
    )
    assert [case[:3] for case in cases] == [("sa_quadratic_9", "plain", "2"), ("resnet18", "plain", "2")]
    assert all(_number(case[3]) > 0 and float(case[4]) > 0 and 0 < int(case[5]) <= 100 for case in cases)
    shares = [float(share) for share in re.findall(r"^ +([\d.]+)% +[\d.]+  \S", out, re.M)]
    assert len(shares) == 6 and all(0 < share <= 100 for share in shares)


def test_train_throughput_prints_every_model_and_path(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--device",
        "cpu",
        "--models",
        "sa_quadratic_9,resnet18",
        "--paths",
        "plain,optimised,channels_last,truncated,authors",
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--eval-batch-size",
        "4",
        "--head-alpha",
        "1",
        "10",
    ]
    assert train_throughput.main(argv) == 0
    out = capsys.readouterr().out
    assert "REDUCED SIZE" in out  # the CPU says its figures are not the paper's
    rows = {(r[0], r[1]): r for r in _table(out, "model")}
    # the truncated path and the authors' pattern apply to Gaussian encodings only
    assert set(rows) == {(m, p) for m in ("sa_quadratic_9", "resnet18") for p in ("plain", "optimised")} | {
        ("sa_quadratic_9", "truncated"),
        ("sa_quadratic_9", "authors"),
        ("resnet18", "channels_last"),  # a layout for convolutions: the SA model has none
    }
    for row in rows.values():
        train_ips, eval_ips, step_ms, _, memory, gflop, mfu, epoch_s = (row[i] for i in range(2, 10))
        assert memory == "-"  # not tracked on the CPU
        for value in (train_ips, eval_ips, step_ms, gflop, mfu, epoch_s):
            assert math.isfinite(_number(value)) and _number(value) > 0
    # trained-like heads: the truncated path executes fewer FLOPs than the dense one
    assert _number(rows["sa_quadratic_9", "truncated"][7]) < _number(rows["sa_quadratic_9", "plain"][7])


def test_truncation_reports_savings_within_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert truncation.main(["--eps", "1e-2", "--batch-size", "1"]) == 0
    out = capsys.readouterr().out
    exact = float(re.search(r"exact attention: ([\d.]+) GFLOP", out).group(1))
    (row,) = _table(out, "eps")
    eps, gflop, saved, head_error = float(row[0]), float(row[1]), _number(row[2]), float(row[-1])
    assert eps == 1e-2 and gflop < exact and saved > 0
    assert head_error <= eps * 1.01  # the guarantee, up to float32 rounding


@pytest.mark.slow
@pytest.mark.browser
def test_mlflow_ui_load_times_both_pages(capsys: pytest.CaptureFixture[str]) -> None:
    """A real server, two small sweeps and headless Chromium: both pages of each show the run that belongs on top."""
    from benchmarks import mlflow_ui_load

    if not mlflow_ui_load.CHROMIUM.is_file():
        pytest.skip(f"headless Chromium not installed ({mlflow_ui_load.CHROMIUM})")
    assert mlflow_ui_load.main(["--runs", "4", "--baseline-runs", "2", "--epochs", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert set(rows) == {("2", "runs"), ("2", "sweep"), ("4", "runs"), ("4", "sweep")}, out
    assert rows["4", "runs"][4] == "sweep-of-4" and rows["4", "sweep"][4].endswith(".seed3"), out  # the best test_acc
    assert rows["2", "runs"][4] == "sweep-of-2", out
    times = [float(row[column]) for row in rows.values() for column in (2, 3)]
    assert all(0 < seconds < mlflow_ui_load.SHOWN_WITHIN_S for seconds in times), out


def test_aggregate_rate_spans_the_common_window() -> None:
    results = [WorkerResult(100, 0.0, 1.0, None), WorkerResult(100, 0.5, 1.5, None)]
    assert aggregate_images_per_s(results) == pytest.approx(200 / 1.5)
    assert results[0].images_per_s == pytest.approx(100.0)


def test_gpu_sharing_runs_its_protocol_on_cpu_workers(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--device", "cpu", "--counts", "1,2", "--steps", "2", "--batch-size", "4", "--model", "resnet18"]
    assert gpu_sharing.main(argv) == 0
    rows = _table(capsys.readouterr().out, "processes")
    assert [row[0] for row in rows] == ["1", "2"]
    for row in rows:
        assert _number(row[2]) > 0  # aggregate images/s


def test_gpu_sharing_without_cuda_skips_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the benchmark would run")
    assert gpu_sharing.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_train_speed_writes_history_and_curves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    params["model"].update(hidden=8, layers=1, ffn=8, learned_dim=4, resnet_width=2)
    params["data"].update(image_size=8, prepared_dir=str(tmp_path / "prepared"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out_dir = tmp_path / "short_run"
    argv = [
        "--params",
        str(tmp_path / "params.yaml"),
        "--epochs",
        "2",
        "--devices",
        "cpu",
        "--variants",
        "sa_quadratic_9",
        "resnet18",
        "--history",
        str(out_dir),
    ]
    assert train_speed.main(argv) == 0
    assert "history.csv" in capsys.readouterr().out

    import matplotlib.image
    import pandas as pd

    history = pd.read_csv(out_dir / "history.csv")
    assert sorted(history.groupby("model")["epoch"].apply(list).to_dict().items()) == [
        ("resnet18", [1, 2]),
        ("sa_quadratic_9", [1, 2]),
    ]
    assert history[["train_loss", "test_loss", "test_acc", "images_per_s"]].notna().all().all()
    image = matplotlib.image.imread(out_dir / "curves.png")
    assert image.shape[0] > 300 and image.shape[1] > 800
    assert image[..., :3].std() > 0.05  # something is drawn, not a blank canvas


def test_finding_prints_head_motion_and_the_gap_to_resnet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--params", PARAMS, "--smoke", "--variants", "sa_quadratic_9", "resnet18", "--csv", str(tmp_path / "m.csv"),
            "--set", "train.positional_lr_factor=2", "--set", "model.centre_init_std=1.5"]  # fmt: skip
    assert finding.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("SMOKE SIZE")  # never mistaken for a measurement
    assert "positional lr x2," in out and "centre init std 1.5;" in out  # the overrides were trained with
    heads_part, accuracy_part = out.split("accuracy after")
    assert "at_distinct_shifts" in heads_part  # the report's count of heads on shifts of their own
    heads = _table(heads_part, "variant")
    assert [(row[0], row[1]) for row in heads] == [("sa_quadratic_9", "1"), ("sa_quadratic_9", "2")]
    for row in heads:
        assert _number(row[2]) > 0  # displacement: the centres trained
        assert all("->" in cell for cell in row[3:])  # init->end
    accuracy = {row[0]: row for row in _table(accuracy_part, "variant")}
    assert set(accuracy) == {"sa_quadratic_9", "resnet18"}
    assert accuracy["resnet18"][2] == "-"  # the baseline has no gap to itself
    gap = 100 * (float(accuracy["resnet18"][1]) - float(accuracy["sa_quadratic_9"][1]))
    assert _number(accuracy["sa_quadratic_9"][2].removesuffix("pt")) == pytest.approx(gap, abs=0.11)  # base - variant
    assert all(_number(row[3]) > 0 for row in accuracy.values())  # CPU seconds

    import pandas as pd

    frame = pd.read_csv(tmp_path / "m.csv")
    assert sorted(frame.groupby("layer")["epoch"].apply(list).to_dict().items()) == [(0, [0, 1, 2]), (1, [0, 1, 2])]
    assert (frame[frame.epoch == 0].displacement == 0).all()


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_has_help_naming_how_it_is_run(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"benchmarks.{name}").main(["--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m benchmarks.{name} ")


@pytest.mark.parametrize(
    ("name", "argv", "named"),
    [
        ("train_speed", ["--params", "missing.yaml"], "missing.yaml: params file not found"),
        ("train_speed", ["--params", "{typo}"], "train.epoch: unknown key"),
        ("train_speed", ["--params", PARAMS, "--variants", "sa_quadratic_9", "nonsense"], "--variants: unknown ['nons"),
        ("train_speed", ["--threads", "0"], "--threads"),
        ("sweep_scale", ["--trials", "0"], "--trials"),
        ("sweep_scale", ["--params", "{typo}"], "train.epoch: unknown key"),
        ("train_speed", ["--threads", "-2"], "--threads"),
        ("train_speed", ["--epochs", "0"], "--epochs"),
        ("train_speed", ["--params", PARAMS, "--history", "{file}"], "--history"),
        pytest.param("train_speed", ["--params", PARAMS, "--devices", "cuda"], "--devices cuda", marks=_no_cuda),
        ("gpsa_cost", ["--params", PARAMS, "--variants", "sa_gpsa_9", "nonsense"], "--variants: unknown ['nonsense']"),
        ("gpsa_cost", ["--params", PARAMS, "--variants", "sa_gpsa_9"], "--variants: name at least two"),
        ("gpsa_cost", ["--pairs", "0"], "--pairs"),
        ("gpu_profile", ["--params", PARAMS, "--variants", "sa_quadratic_9", "nonsense"], "--variants: unknown ['nons"),
        ("gpu_profile", ["--params", "{typo}"], "train.epoch: unknown key"),
        ("gpu_profile", ["--params", PARAMS, "--paths", "fast"], "--paths"),
        ("gpu_profile", ["--params", PARAMS, "--batch-sizes", "100", "0"], "--batch-sizes"),
        ("gpsa_cost", ["--params", "{typo}"], "train.epoch: unknown key"),
        ("train_throughput", ["--steps", "0"], "--steps"),
        ("train_throughput", ["--batch-size", "0"], "--batch-size"),
        ("train_throughput", ["--eval-batch-size", "-3"], "--eval-batch-size"),
        ("train_throughput", ["--eps", "1"], "--eps"),
        ("train_throughput", ["--eps", "-1e-4"], "--eps"),
        ("train_throughput", ["--head-alpha", "10", "1"], "--head-alpha"),
        ("train_throughput", ["--head-alpha", "0", "1"], "--head-alpha"),
        ("train_throughput", ["--device", "cpu", "--paths", "plain,fast"], "--paths: unknown ['fast']"),
        ("train_throughput", ["--device", "cpu", "--models", "sa_nope"], "--models: unknown ['sa_nope']"),
        pytest.param("train_throughput", ["--device", "cuda"], "--device cuda", marks=_no_cuda),
        ("truncation", ["--eps", "1e-2,abc"], "--eps"),
        ("truncation", ["--eps", "1e-2,1.5"], "--eps"),
        ("truncation", ["--alpha", "10", "1"], "--alpha"),
        ("truncation", ["--batch-size", "0"], "--batch-size"),
        ("truncation", ["--jitter", "nan"], "--jitter"),
        ("truncation", ["--jitter", "-1"], "--jitter"),
        ("truncation", ["--train-epochs", "-1"], "--train-epochs"),
        ("truncation", ["--train-eps", "1"], "--train-eps"),
        ("truncation", ["--train-epochs", "1", "--params", "missing.yaml"], "missing.yaml: params file not found"),
        ("truncation", ["--train-epochs", "1", "--params", "{typo}"], "train.epoch: unknown key"),
        ("gpu_sharing", ["--counts", "1,0"], "--counts"),
        ("trial_fixed_cost", [], "--tracking-uri sqlite:///"),
        ("trial_fixed_cost", ["--tracking-uri", "sqlite:///{file}.db"], "no such sqlite store"),
        ("tracking_load", ["--concurrent", "0"], "--concurrent"),
        ("tracking_load", ["--epoch-s", "-1"], "--epoch-s"),
        ("sweep_at_scale", ["--trials", "0"], "--trials"),
        ("sweep_at_scale", ["--trials", "3", "--sizes", "1,5"], "--sizes must be smaller than --trials 3"),
        ("sweep_at_scale", ["--params", "{typo}"], "train.epoch: unknown key"),
        ("sweep_at_scale", ["--lab-store", "{file}"], "not a running store (start one with examples/lab_store.sh)"),
        ("sweep_concurrency", ["--concurrency", "0"], "--concurrency"),
        ("sweep_concurrency", ["--concurrency", "2", "--nodes", "3"], "--nodes 3: more nodes than --concurrency 2"),
        ("sweep_concurrency", ["--params", "{typo}"], "train.epoch: unknown key"),
        ("sweep_concurrency", ["--lab-store", "{file}"], "not a running store (start one with examples/lab_store.sh)"),
        ("mlflow_ui_load", ["--runs", "0"], "--runs"),
        ("analysis_at_scale", ["--runs", "0"], "--runs"),
        ("analysis_at_scale", ["--lab-store", "{file}"], "not a running store (start one with examples/lab_store.sh)"),
        ("analysis_at_scale", ["--tracking-uri", "sqlite:///x.db"], "not an mlflow server's http(s) address"),
        ("mlflow_ui_load", ["--lab-store", "{file}"], "not a running store (start one with examples/lab_store.sh)"),
        ("finding", ["--params", "missing.yaml"], "missing.yaml: params file not found"),
        ("finding", ["--params", "{typo}"], "train.epoch: unknown key"),
        ("finding", ["--params", PARAMS, "--variants", "sa_quadratic_9", "nonsense"], "--variants: unknown ['nonsense"),
        ("finding", ["--params", PARAMS, "--variants", "resnet18", "resnet18"], "--variants: listed more than once"),
        ("finding", ["--params", PARAMS, "--epochs", "0"], "--epochs"),
        ("finding", ["--params", PARAMS, "--seed", "-1"], "--seed"),
        ("finding", ["--params", PARAMS, "--csv", "{file}/m.csv"], "--csv"),
        ("finding", ["--params", PARAMS, "--set", "train.positional_lr_factor"], "expected KEY=VALUE"),
        ("finding", ["--params", PARAMS, "--set", "trian.lr=0.2"], "--set trian.lr: 'trian' is not a section"),
        ("finding", ["--params", PARAMS, "--set", "train.lr_factor=3"], "train.lr_factor: unknown key"),
        ("finding", ["--params", PARAMS, "--set", "model.layers=0"], "model.layers: Input should be greater than 0"),
        ("gpu_evidence", ["out", "--sections", "logits,nope"], "--sections: unknown ['nope']"),
        ("gpu_evidence", ["{file}"], "exists and is not a directory"),
        ("gpu_evidence", ["out", "--budget-s", "0"], "--budget-s"),
        ("gpu_evidence", [], "OUTDIR"),
    ],
)
def test_bad_input_is_refused_before_any_work(
    name: str,
    argv: list[str],
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Exit code 2 (argparse's parser.error) with one error line naming the flag or key, and nothing measured."""
    module = importlib.import_module(f"benchmarks.{name}")

    def work(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{name} started {FIRST_WORK[name]} on bad input")

    monkeypatch.setattr(module, FIRST_WORK[name], work)
    (tmp_path / "typo.yaml").write_text("train:\n  epoch: 3\n")
    (tmp_path / "file").write_text("kept")
    argv = [arg.format(typo=tmp_path / "typo.yaml", file=tmp_path / "file") for arg in argv]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        module.main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing printed, e.g. no part 1 of truncation
    assert f"python -m benchmarks.{name}: error: " in err and named in err, err
    assert "Traceback" not in err
    assert (tmp_path / "file").read_text() == "kept"


def test_sweep_scale_plans_in_one_store_request(capsys: pytest.CaptureFixture[str]) -> None:
    """At a small size (the figures for 1000 trials and 10,000 runs are in benchmarks/README.md): one search."""
    from benchmarks import sweep_scale

    assert sweep_scale.main(["--trials", "12", "--runs", "60"]) == 0
    out = capsys.readouterr().out
    assert "plan (sqlite): 1 store request(s) (search_runs 1) for 12 trials" in out, out
    assert "6 reuse, 0 resume, 6 train" in out


def test_trial_fixed_cost_splits_a_run_into_start_up_epochs_and_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """benchmarks/trial_fixed_cost.py on a real sqlite store holding one trial run with a known timeline: started at
    1000 s, 5 s of start-up, 3 epochs of 2 s training and 0.5 s between-report overhead, ended 3 s after its last
    report."""
    from mlflow.tracking import MlflowClient

    from benchmarks import trial_fixed_cost

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("sweep"), start_time=1_000_000, run_name="sa seed 0")
    reported = 1000 + 5
    for epoch in (1, 2, 3):
        reported += 2 + 0.5
        client.log_metric(run.info.run_id, "epoch_time_s", 2.0, timestamp=int(reported * 1000), step=epoch)
    client.set_terminated(run.info.run_id, end_time=int((reported + 3) * 1000))
    client.create_run(client.get_experiment_by_name("sweep").experiment_id, run_name="a parent, no epochs")
    assert trial_fixed_cost.main(["--tracking-uri", uri]) == 0
    rows = _table(capsys.readouterr().out, "run")
    assert rows == [["sa", "seed", "0", "FINISHED", "3", "15.5", "6.0", "9.5", "5.0", "0.50", "3.0"]]


ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "benchmarks" / "README.md"
# Where the docs and the code name benchmarks; benchmarks/results/ holds what past runs printed, left as it was.
NAMING = ("*.md", "docs/*.md", "benchmarks/*.md", "examples/*", "params.yaml", "params/*.yaml", "Makefile", ".ci/run",
          "benchmarks/*.py", "pipeline/**/*.py", "stages/*.py", "analysis/**/*.py", "tests/**/*.py")  # fmt: skip


def _scripts() -> set[str]:
    """The modules of benchmarks/ that run as ``python -m benchmarks.<name>`` (they have a ``main``); the others are
    helpers the scripts share."""
    folder = ROOT / "benchmarks"
    return {path.stem for path in folder.glob("*.py") if re.search(r"^def main\(", path.read_text(), re.M)}


def _questions() -> dict[str, tuple[str, str]]:
    """benchmarks/README.md's first table: script -> (the question it answers, the figure it holds)."""
    section = README.read_text().split("\n## What each script answers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `benchmarks\.(\w+)` \| ([^|]*) \| (.*) \|$", section, re.M)
    return {name: (question, figure) for name, question, figure in rows}


def test_every_script_answers_a_question_the_readme_states_with_its_figure() -> None:
    """A script is kept while it answers a standing question: each has its row, a question and a measured figure; a
    removed one has none (its figure moves to the README's removed scripts, with the commit that measured it)."""
    questions = _questions()
    assert set(questions) == _scripts() == set(BENCHMARKS), sorted(set(questions) ^ _scripts())
    for name, (question, figure) in questions.items():
        assert question.endswith("?"), f"{name}: its question does not end in '?': {question!r}"
        assert re.search(r"\d", figure), f"{name}: no figure in {figure!r}"
    helpers = {path.stem for path in (ROOT / "benchmarks").glob("*.py")} - _scripts() - {"__init__"}
    assert helpers and all(f"`benchmarks/{name}.py`" in README.read_text() for name in helpers), helpers
    assert all(f"benchmarks/{path.name}" in README.read_text() for path in (ROOT / "benchmarks").glob("*.sh"))


def test_every_script_has_a_smoke_run() -> None:
    """CI runs every script at its smallest size (here, in test_gpu_evidence.py, or with Ray in the integration
    tier), so that none rots between two runs of it."""
    tests = "\n".join(path.read_text() for path in (ROOT / "tests").rglob("test_*.py"))
    missing = sorted(name for name in _scripts() if not re.search(rf"\b{name}\.main\(|\"benchmarks\.{name}\"", tests))
    assert not missing, f"no test runs {missing}"


def test_every_benchmark_the_docs_name_exists() -> None:
    """``python -m benchmarks.<name>``, ``benchmarks.<name>`` or ``benchmarks/<name>.py`` wherever the docs, params
    or code name one: a removed script is named only by its bare name, beside the commit that measured its figure."""
    named: dict[str, set[str]] = {}
    for pattern in NAMING:
        for path in ROOT.glob(pattern):
            if not path.is_file():
                continue
            text = path.read_text(errors="replace")
            for name in re.findall(r"\bbenchmarks\.([a-z_]\w*)\b", text):
                named.setdefault(f"{name}.py", set()).add(str(path.relative_to(ROOT)))
            for name in re.findall(r"\bbenchmarks/(\w+\.(?:py|sh))\b", text):
                named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert "train_throughput.py" in named  # the scan sees the docs at all
    missing = {name: sorted(where) for name, where in named.items() if not (ROOT / "benchmarks" / name).is_file()}
    assert not missing, f"named but not in benchmarks/: {missing}"
