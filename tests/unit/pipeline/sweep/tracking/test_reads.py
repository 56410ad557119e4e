"""Many runs read in a few requests (``pipeline.sweep.tracking.reads``), on a real sqlite store: runs found by id in
batches, a metric's history per run, named files fetched and a missing one told from a fault."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from pipeline.sweep.tracking import reads
from pipeline.sweep.tracking.store import ensure_experiment


@pytest.fixture
def client(tmp_path: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_runs_are_found_by_id_in_batches_and_unknown_ids_left_out(
    client: MlflowClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment_id = ensure_experiment(client, "reads", (tmp_path / "mlartifacts").as_uri())
    ids = [client.create_run(experiment_id).info.run_id for _ in range(5)]
    client.delete_run(ids[0])  # deleted runs are found too, as get_run finds them
    client.log_param(ids[1], "model.heads", "9")
    monkeypatch.setattr(reads, "SEARCH_IDS", 2)  # 6 ids: 3 searches
    found = reads.runs_by_id(client, [*ids, "0" * 32], [experiment_id])
    assert sorted(found) == sorted(ids) and found[ids[1]].data.params == {"model.heads": "9"}
    assert reads.runs_by_id(client, ids, []) == {}  # no experiment: the caller asks run by run
    assert reads.runs_by_id(client, ids, ["12345"]) == {}  # an experiment this store does not have


def test_a_local_store_answers_each_runs_history(client: MlflowClient, tmp_path: Path) -> None:
    experiment_id = ensure_experiment(client, "histories", (tmp_path / "mlartifacts").as_uri())
    first, second = (client.create_run(experiment_id).info.run_id for _ in range(2))
    client.log_batch(first, metrics=[Metric("test_acc", 0.1 * e, 0, e) for e in (1, 2, 3)])
    histories = reads.metric_histories(client, client.tracking_uri, "test_acc", [first, second])
    assert [m.value for m in histories[first]] == pytest.approx([0.1, 0.2, 0.3]) and histories[second] == []


def test_named_files_are_fetched_and_a_missing_one_left_out(client: MlflowClient, tmp_path: Path) -> None:
    experiment_id = ensure_experiment(client, "files", (tmp_path / "mlartifacts").as_uri())
    run_id = client.create_run(experiment_id).info.run_id
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "checkpoint.pt").write_bytes(b"weights")
    client.log_artifacts(run_id, str(folder), artifact_path="checkpoint")
    artifact_uri = client.get_run(run_id).info.artifact_uri
    names = ["checkpoint.pt", "head_history.json"]
    fetched = reads.download_files(client.tracking_uri, artifact_uri, "checkpoint", names, tmp_path / "got")
    assert fetched == ["checkpoint.pt"] and (tmp_path / "got/checkpoint.pt").read_bytes() == b"weights"
    assert not (tmp_path / "got/head_history.json").exists()


def test_only_a_404_means_absent() -> None:
    def http_error(status: int) -> requests.HTTPError:
        response = requests.Response()
        response.status_code = status
        return requests.HTTPError(response=response)

    assert reads.is_absent(http_error(404)) and reads.is_absent(FileNotFoundError("x"))
    assert not reads.is_absent(http_error(500)) and not reads.is_absent(requests.ConnectionError("refused"))
