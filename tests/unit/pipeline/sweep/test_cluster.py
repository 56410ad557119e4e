"""The checks made before a sweep runs on a multi-node cluster, on their own: the messages for storage, code and
tracking problems (the real two-node cluster runs them end to end in tests/cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import parse_params
from pipeline.sweep.cluster import check_tracking_store, check_views
from pipeline.sweep.identity import trial_code
from pipeline.trial.code_version import TrialCodeMismatch, check_trial_code


def test_sqlite_with_several_nodes_is_refused_unless_insisted() -> None:
    params = parse_params({}, "test")
    with pytest.raises(ValueError, match=r"^tracking.uri: sqlite:////x/mlflow.db is a file on this machine only"):
        check_tracking_store(params, "sqlite:////x/mlflow.db", 2)
    check_tracking_store(params, "http://mlflow:5000", 2)
    check_tracking_store(parse_params({"tracking": {"sqlite_on_cluster": True}}, "test"), "sqlite:////x/m.db", 2)


def _view(**changes: object) -> dict:
    return {
        "node_id": "ab" * 28,
        "ip": "10.0.0.7",
        "seen": True,
        "wrote": "",
        "driver_sees_reply": True,
        "code": {"sa_q": "c0de"},
        **changes,
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seen": False}, r"^sweep.storage_path: /s is not shared: node 10.0.0.7 \(abababab\) does not see"),
        ({"wrote": "PermissionError: no"}, r"^sweep.storage_path: /s is not writable on node 10.0.0.7"),
        ({"driver_sees_reply": False}, r"^sweep.storage_path: /s is not shared: the driver does not see what node"),
        (
            {"code": {"sa_q": "0ther"}},
            r"^node 10.0.0.7 \(abababab\) imports trial code 0ther for sa_q, the driver runs c0de",
        ),
        ({"code": {}}, r"^node 10.0.0.7 \(abababab\) imports trial code None for sa_q, the driver runs c0de"),
    ],
)
def test_node_views_name_the_problem(changes: dict, message: str) -> None:
    check_views([_view()], Path("/s"), {"sa_q": "c0de"})
    with pytest.raises(ValueError, match=message):
        check_views([_view(), _view(**changes)], Path("/s"), {"sa_q": "c0de"})


def test_trial_refuses_other_trial_code() -> None:
    check_trial_code(None, "sa", "quadratic")
    check_trial_code(trial_code("sa", "quadratic"), "sa", "quadratic")
    with pytest.raises(TrialCodeMismatch, match=r"^trial code \w+ \(from .*\) on node .*, but the driver runs 0ther"):
        check_trial_code("0ther", "sa", "quadratic")
    with pytest.raises(TrialCodeMismatch):  # the learned encoding's trial runs other code than the quadratic one's
        check_trial_code(trial_code("sa", "quadratic"), "sa", "learned")
