"""Claims on trial keys in a shared store (a real sqlite MLflow store): the order decides, a training claim wins, a
loser waits then plans again, and a dead driver's claim is taken over instead of blocking forever."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from pipeline.sweep.reuse import REUSE, TRAIN, TrialDecision
from pipeline.sweep.tracking.claims import (
    CLAIMS_SUFFIX,
    ENDED_TAG,
    HEARTBEAT_TAG,
    HOST_TAG,
    PID_TAG,
    STATE_TAG,
    TRAINING,
    Claim,
    TrialClaims,
    key_tags,
)
from pipeline.sweep.tracking.store import prepare_store

KEYS = ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
EXPERIMENT: dict[str, str] = {}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = f"sqlite:///{tmp_path_factory.mktemp('claims') / 'mlflow.db'}"
    prepare_store(uri)  # once: building a fresh store's schema takes seconds
    return uri


@pytest.fixture
def uri(store: str, request: pytest.FixtureRequest) -> str:
    """The module's store; each test claims in its own experiment (``EXPERIMENT[uri]``)."""
    EXPERIMENT[store] = request.node.name
    return store


def plan(action: str = TRAIN) -> list[TrialDecision]:
    return [TrialDecision("resnet18", seed, key, action) for seed, key in enumerate(KEYS)]


def claims(uri: str, name: str, timeout_s: float = 60.0) -> TrialClaims:
    return TrialClaims(uri, EXPERIMENT[uri], f"parent-{name}", name, timeout_s)


def claim_run(uri: str, **tags: str) -> str:
    """A claim run written as another driver would: both keys, ``tags`` on top."""
    client = MlflowClient(uri)
    name = f"{EXPERIMENT[uri]}{CLAIMS_SUFFIX}"
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    base = {**key_tags(frozenset(KEYS)), HEARTBEAT_TAG: str(int(time.time() * 1000)), HOST_TAG: "elsewhere"}
    return client.create_run(experiment_id, tags={**base, **tags}).info.run_id


def status(uri: str, run_id: str) -> str:
    return MlflowClient(uri).get_run(run_id).info.status


def test_keys_round_trip_through_tags() -> None:
    keys = frozenset(f"{i:012x}" for i in range(1200))
    tags = key_tags(keys)
    assert len(tags) == 3 and all(len(v) <= 8000 for v in tags.values())
    run = type("R", (), {})()
    run.info = type("I", (), {"run_id": "r", "start_time": 1})()
    run.data = type("D", (), {"tags": tags})()
    assert Claim.of(run).keys == keys


def test_an_unopposed_claim_trains_and_is_released(uri: str) -> None:
    mine = claims(uri, "a")
    assert [d.action for d in mine.decide(plan)] == [TRAIN, TRAIN]
    run_id = str(mine.run_id)
    assert MlflowClient(uri).get_run(run_id).data.tags[STATE_TAG] == TRAINING
    mine.release()
    assert status(uri, run_id) == "FINISHED" and MlflowClient(uri).get_run(run_id).data.tags[ENDED_TAG] == "released"


def test_a_loser_waits_for_the_earlier_claim_then_reuses(uri: str) -> None:
    """The earlier claim wins; the later one waits without a claim marked training, then plans again and reuses."""
    first = claims(uri, "first")
    first.decide(plan)
    finished = threading.Event()

    def winner_finishes() -> None:
        time.sleep(2)
        finished.set()
        first.release()

    threading.Thread(target=winner_finishes).start()
    second = claims(uri, "second", timeout_s=6)  # polls every 0.5 s
    decisions = second.decide(lambda: plan(REUSE if finished.is_set() else TRAIN))
    assert [d.action for d in decisions] == [REUSE, REUSE]
    assert second.run_id is None  # nothing to train: its claim ended at once


def test_a_claim_already_training_wins_whatever_the_order(uri: str) -> None:
    """A driver whose clock runs behind creates an 'earlier' claim after another started training: it still waits."""
    training = claim_run(uri, **{STATE_TAG: TRAINING})
    MlflowClient(uri).set_tag(training, HEARTBEAT_TAG, str(int(time.time() * 1000)))
    mine = claims(uri, "late", timeout_s=6)
    mine._start = 0  # noqa: SLF001 - the earliest possible start time
    done = threading.Event()
    threading.Thread(target=lambda: (time.sleep(1.5), MlflowClient(uri).set_terminated(training), done.set())).start()
    mine.decide(plan)
    assert done.is_set()  # it waited for the training claim to end
    mine.release()


def test_a_claim_whose_process_is_gone_is_taken_over_at_once(uri: str) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    stale = claim_run(uri, **{HOST_TAG: socket.gethostname(), PID_TAG: dead.stdout.strip(), STATE_TAG: TRAINING})
    mine = claims(uri, "b", timeout_s=3600)
    started = time.monotonic()
    assert [d.action for d in mine.decide(plan)] == [TRAIN, TRAIN]
    assert time.monotonic() - started < 10
    assert status(uri, stale) == "KILLED"
    assert MlflowClient(uri).get_run(stale).data.tags[ENDED_TAG].startswith("taken_over")
    mine.release()


def test_a_claim_without_heartbeat_is_taken_over_after_the_timeout(uri: str) -> None:
    old = str(int((time.time() - 30) * 1000))
    stale = claim_run(uri, **{HEARTBEAT_TAG: old, STATE_TAG: TRAINING})  # another host: only the heartbeat tells
    mine = claims(uri, "c", timeout_s=5)
    assert [d.action for d in mine.decide(plan)] == [TRAIN, TRAIN]
    assert status(uri, stale) == "KILLED"
    mine.release()


def test_a_live_claim_on_other_keys_does_not_block(uri: str) -> None:
    client = MlflowClient(uri)
    other = claim_run(uri, **{STATE_TAG: TRAINING})
    client.set_tag(other, "claim.keys.0", "cccccccccccc")
    mine = claims(uri, "d")
    assert [d.action for d in mine.decide(plan)] == [TRAIN, TRAIN]
    mine.release()
