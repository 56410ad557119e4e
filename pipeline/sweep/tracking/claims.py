"""Claims on trial identities in a tracking store that several projects share: one trains a trial, the others wait and
reuse it.

Two projects (or users) pointing at one store (a lab's ``mlflow server``, one sqlite file) plan the same trial
identities (``trial_key``); the stage lock is per project, so without this both train every shared trial. Here each
driver that is about to train holds one **claim run** in the experiment ``<experiment>.claims`` (kept out of the
experiment researchers browse), RUNNING while it lives, whose tags list the trial keys it trains (``claim.keys.<i>``,
comma-separated), its order (start time, then run id), a heartbeat and whether it is ``training`` or ``waiting``.

The protocol (``TrialClaims.decide``), each step one search of the live (RUNNING) claims, whatever the sweep's size:
1. plan (reuse, resume or train per trial, ``stage.decide``) and claim the keys to train (create or update the run);
2. a live claim of another driver on one of those keys that is ``training``, or that is earlier in the order, wins:
   wait until the winners' claims end (polling only the live claims, the own claim's heartbeat refreshed), then plan
   again: a trial a winner finished is reused, one it left unfinished is resumed or trained;
3. otherwise mark the claim ``training`` and look once more: another claim marked ``training`` meanwhile (two drivers
   that did not see each other's claim at step 2) makes this driver step back to ``waiting`` and start over; at the
   second look both claims are visible, so the order decides. Nothing has been trained before this point.
Waits only go to earlier claims or to claims already training, which wait for no one: no deadlock.
A claim ends when its driver's Tune run ends (FINISHED, or KILLED when it failed or was interrupted). A claim whose
driver is dead is **taken over** (closed KILLED, tagged ``claim.ended=taken_over``): on the same host at once when its
process is gone, elsewhere when its heartbeat (refreshed every ``timeout_s / 4``) is older than ``timeout_s``
(``tracking.claim_timeout_s``). The order assumes the drivers' clocks agree to well under that timeout.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
from mlflow.entities import Run, RunTag

from pipeline.sweep.tracking.store import all_runs, ensure_experiment, mlflow_client, server_answers

log = logging.getLogger(__name__)

CLAIMS_SUFFIX = ".claims"  # the claims' experiment: <experiment>.claims
KEYS_TAG = "claim.keys"  # claim.keys.0, claim.keys.1, ...: the claimed trial keys, comma-separated
HEARTBEAT_TAG = "claim.heartbeat"  # ms since the epoch, refreshed while the driver lives
STATE_TAG = "claim.state"  # waiting | training
OWNER_TAG = "claim.owner"  # the parent run (tune-<hash> / prune-<hash>) of the driver
HOST_TAG, PID_TAG, WHERE_TAG = "claim.host", "claim.pid", "claim.where"
ENDED_TAG = "claim.ended"  # released | taken_over
TRAINING, WAITING = "training", "waiting"
KEYS_PER_TAG = 500  # 12-character keys: ~6.5 KB per tag, under MLflow's 8000-character tag values


@dataclass(frozen=True)
class Claim:
    """A live claim run as one search returns it."""

    run_id: str
    start_time: int
    keys: frozenset[str]
    heartbeat_ms: int
    training: bool
    host: str
    pid: int
    where: str

    @property
    def order(self) -> tuple[int, str]:
        return (self.start_time, self.run_id)

    @classmethod
    def of(cls, run: Run) -> Claim:
        tags = run.data.tags
        chunks = (value for name, value in tags.items() if name.startswith(f"{KEYS_TAG}."))
        keys = frozenset(key for chunk in chunks for key in chunk.split(",") if key)
        return cls(
            run.info.run_id,
            int(run.info.start_time or 0),
            keys,
            int(tags.get(HEARTBEAT_TAG) or run.info.start_time or 0),
            tags.get(STATE_TAG) == TRAINING,
            tags.get(HOST_TAG, ""),
            int(tags.get(PID_TAG) or 0),
            tags.get(WHERE_TAG, "?"),
        )


def key_tags(keys: set[str] | frozenset[str]) -> dict[str, str]:
    ordered = sorted(keys)
    chunks = [ordered[i : i + KEYS_PER_TAG] for i in range(0, max(len(ordered), 1), KEYS_PER_TAG)]
    return {f"{KEYS_TAG}.{i}": ",".join(chunk) for i, chunk in enumerate(chunks)}


class TrialClaims:
    """This driver's claim in the store at ``uri`` (see the module docstring). ``owner``: its parent run;
    ``where``: what a waiting driver is told about it (host and project)."""

    def __init__(self, uri: str, experiment: str, owner: str, where: str, timeout_s: float) -> None:
        self.uri, self.owner, self.where, self.timeout_s = uri, owner, where, timeout_s
        self.experiment = f"{experiment}{CLAIMS_SUFFIX}"
        self.client = mlflow_client(uri)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.poll_s = min(max(timeout_s / 12, 0.5), 10.0)
        self.run_id: str | None = None
        self.keys: frozenset[str] = frozenset()
        self._experiment_id: str | None = None
        self._start = 0  # the claim run's start time: its place in the order
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None

    # -- the protocol -------------------------------------------------------------------------------------------
    def decide(self, plan: Callable[[], list[Any]]) -> list[Any]:
        """``plan()``'s decisions once this driver holds every key it trains (waiting for, then re-planning after,
        claims that win); the claim then stays ``training`` until ``release``."""
        said: set[str] = set()
        while True:
            decisions = plan()
            keys = frozenset(d.key for d in decisions if d.trains)
            if not keys:
                self.release()
                return decisions
            self._hold(keys, WAITING)
            winners = self._winners()
            if not winners:
                self._set(STATE_TAG, TRAINING)
                if not any(c.training for c in self._others()):
                    self._start_heartbeat()
                    return decisions
                self._set(STATE_TAG, WAITING)  # another driver marked its claim meanwhile: the order decides
                time.sleep(random.uniform(0, self.poll_s))
                continue
            for claim in winners:
                if claim.run_id not in said:
                    said.add(claim.run_id)
                    shared = len(claim.keys & keys)
                    log.info(
                        "waiting for %d trial(s) that %s is %s (claim run %s); they are reused when it ends",
                        shared,
                        claim.where,
                        "training" if claim.training else "about to train",
                        claim.run_id,
                    )
            self._wait_until_ended(keys, {claim.run_id for claim in winners})

    def _wait_until_ended(self, keys: frozenset[str], winners: set[str]) -> None:
        """Poll the live claims (one search, cheap: only RUNNING claims) until none of ``winners`` is live; the
        own claim's heartbeat goes with each poll. Planning again (a search of the trial runs) waits until then."""
        while True:
            time.sleep(self.poll_s)
            self._hold(keys, WAITING)
            if not winners & {claim.run_id for claim in self.live()}:
                return

    def release(self, status: str = "FINISHED") -> None:
        """End the claim (others waiting for its keys plan again); idempotent, never raises."""
        self._stop.set()
        if self._heart is not None:
            self._heart.join(timeout=5)
        run_id, self.run_id = self.run_id, None
        if run_id is None:
            return
        if not server_answers(self.uri):  # never the client's minutes of retries at the end of an outage
            log.warning(
                "MLflow: claim run %s not released (the server does not answer); others take it over after %.0f s",
                run_id,
                self.timeout_s,
            )
            return
        try:
            self.client.set_tag(run_id, ENDED_TAG, "released")
            self.client.set_terminated(run_id, status)
        except Exception as err:  # noqa: BLE001 - an unreleased claim is taken over once its heartbeat is stale
            log.warning(
                "MLflow: could not release claim run %s (%s); others take it over after %.0f s",
                run_id,
                err,
                self.timeout_s,
            )

    # -- the store ----------------------------------------------------------------------------------------------
    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = ensure_experiment(self.client, self.experiment, None)
        return self._experiment_id

    def _hold(self, keys: frozenset[str], state: str) -> None:
        """Create the claim run, or update its keys (and heartbeat)."""
        now = str(int(time.time() * 1000))
        if self.run_id is None:
            tags = {
                **key_tags(keys),
                HEARTBEAT_TAG: now,
                STATE_TAG: state,
                OWNER_TAG: self.owner,
                HOST_TAG: self.host,
                PID_TAG: str(self.pid),
                WHERE_TAG: self.where,
            }
            run = self.client.create_run(self.experiment_id, run_name=f"claim-{self.owner}", tags=tags)
            self.run_id, self._start, self.keys = run.info.run_id, int(run.info.start_time), keys
            return
        update = {HEARTBEAT_TAG: now}
        if keys != self.keys:
            stale = {f"{KEYS_TAG}.{i}": "" for i in range(len(key_tags(self.keys)))}
            update |= stale | key_tags(keys)
            self.keys = keys
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in update.items()])

    def _set(self, tag: str, value: str) -> None:
        self.client.set_tag(str(self.run_id), tag, value)

    def live(self) -> list[Claim]:
        """Every live claim in one paged search; dead drivers' claims are taken over (closed) on the way."""
        runs = list(all_runs(self.client, self.experiment_id, "attributes.status = 'RUNNING'"))  # before any take-over
        claims = []
        for claim in map(Claim.of, runs):
            if claim.run_id != self.run_id and self._dead(claim):
                self._take_over(claim)
            else:
                claims.append(claim)
        return claims

    def _others(self) -> list[Claim]:
        """Live claims of other drivers on a key this driver claims."""
        return [c for c in self.live() if c.run_id != self.run_id and c.keys & self.keys]

    def _winners(self) -> list[Claim]:
        """The claims this driver waits for: training already, or earlier in the order."""
        mine = (self._start, str(self.run_id))
        return [c for c in self._others() if c.training or c.order < mine]

    def _dead(self, claim: Claim) -> bool:
        if claim.host == self.host and claim.pid and not psutil.pid_exists(claim.pid):
            return True
        return time.time() * 1000 - claim.heartbeat_ms > self.timeout_s * 1000

    def _take_over(self, claim: Claim) -> None:
        log.warning(
            "MLflow: claim run %s of %s is dead (no process, or no heartbeat for %.0f s): taking its trials over",
            claim.run_id,
            claim.where,
            self.timeout_s,
        )
        self.client.set_tag(claim.run_id, ENDED_TAG, f"taken_over by {self.where}")
        self.client.set_terminated(claim.run_id, "KILLED")

    def _start_heartbeat(self) -> None:
        """Refresh the heartbeat every ``timeout_s / 4`` from a daemon thread until ``release``; a failed write (the
        server down) is retried at the next beat."""
        self._stop.clear()
        run_id, every = str(self.run_id), self.timeout_s / 4

        def beat() -> None:
            client = mlflow_client(self.uri)
            while not self._stop.wait(every):
                try:
                    client.set_tag(run_id, HEARTBEAT_TAG, str(int(time.time() * 1000)))
                except Exception as err:  # noqa: BLE001 - never stop the sweep for a heartbeat
                    log.debug("claim heartbeat failed: %s", err)

        self._heart = threading.Thread(target=beat, name="claim-heartbeat", daemon=True)
        self._heart.start()
