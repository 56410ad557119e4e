"""The benchmark scripts run end to end at their smallest sizes and print what they promise (nothing is timed here).

A benchmark that breaks silently is found only on the day someone rents a GPU to run it; these runs catch that on
the CPU. They check the tables' content (rows, finite positive rates, FLOPs saved), never a speed.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from benchmarks import gpu_sharing, train_speed, train_throughput, truncation
from benchmarks.gpu_sharing import WorkerResult, aggregate_images_per_s


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


def test_train_throughput_prints_every_model_and_path(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--device", "cpu", "--models", "sa_quadratic_9,resnet18", "--paths", "plain,optimised,truncated",
            "--steps", "1", "--batch-size", "2", "--eval-batch-size", "4", "--head-alpha", "1", "10"]  # fmt: skip
    assert train_throughput.main(argv) == 0
    out = capsys.readouterr().out
    assert "REDUCED SIZE" in out  # the CPU says its figures are not the paper's
    rows = {(r[0], r[1]): r for r in _table(out, "model")}
    # the truncated path applies to Gaussian encodings only
    assert set(rows) == {(m, p) for m in ("sa_quadratic_9", "resnet18") for p in ("plain", "optimised")} | {
        ("sa_quadratic_9", "truncated")
    }
    for row in rows.values():
        train_ips, eval_ips, step_ms, _, memory, gflop, mfu, epoch_s = (row[i] for i in range(2, 10))
        assert memory == "-"  # not tracked on the CPU
        for value in (train_ips, eval_ips, step_ms, gflop, mfu, epoch_s):
            assert math.isfinite(_number(value)) and _number(value) > 0
    # trained-like heads: the truncated path executes fewer FLOPs than the dense one
    assert _number(rows["sa_quadratic_9", "truncated"][7]) < _number(rows["sa_quadratic_9", "plain"][7])


def test_train_throughput_rejects_unknown_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert train_throughput.main(["--device", "cpu", "--models", "sa_nope"]) == 1
    assert "sa_nope" in capsys.readouterr().out


def test_truncation_reports_savings_within_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert truncation.main(["--eps", "1e-2", "--batch-size", "1"]) == 0
    out = capsys.readouterr().out
    exact = float(re.search(r"exact attention: ([\d.]+) GFLOP", out).group(1))
    (row,) = _table(out, "eps")
    eps, gflop, saved, head_error = float(row[0]), float(row[1]), _number(row[2]), float(row[-1])
    assert eps == 1e-2 and gflop < exact and saved > 0
    assert head_error <= eps * 1.01  # the guarantee, up to float32 rounding


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
    argv = ["--params", str(tmp_path / "params.yaml"), "--epochs", "2", "--devices", "cpu",
            "--variants", "sa_quadratic_9", "resnet18", "--history", str(out_dir)]  # fmt: skip
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
