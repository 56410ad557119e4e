"""Turn a cloud's spot/preemption notice into a Ray drain of this node, so its trials checkpoint mid-epoch in time.

Run it on every preemptible worker node beside ``ray start`` (a systemd unit, a sidecar container, a line in the
node's start-up script)::

    python examples/spot_notice.py --provider aws --address <head>:6379 --ray-token-file /etc/ray/auth_token

It polls the instance metadata service every ``--poll-s`` seconds. On a notice it drains this node for preemption with
the notice's deadline (``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds N``), which
is what the trials watch for (``pipeline/trial/preemption.py``, docs/cluster.md "Preemptible nodes"), and exits.

- **aws**: ``GET /latest/meta-data/spot/instance-action`` answers 404 until a notice, then
  ``{"action": "terminate", "time": "2026-01-01T12:00:00Z"}`` (two minutes ahead). IMDSv2 needs a session token
  first (``PUT /latest/api/token``), sent back as ``X-aws-ec2-metadata-token``: the handler asks for one and asks again
  when it expires (401).
- **gcp**: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google`` answers ``FALSE`` until
  the instance is preempted, then ``TRUE``; Compute Engine gives 30 s from then (``--notice-s``).

The drain is a request to the cluster's GCS, which needs the cluster's auth token when token auth is on (Ray 2.60's
default for ``ray start``): ``--ray-token-file`` names the token file every node was started with, passed to ``ray
drain-node`` as ``RAY_AUTH_TOKEN_PATH``. Without ``--node-id`` the node drained is the Ray node on this machine.
``--url`` / ``--token-url`` point at another metadata endpoint (a proxy, or a test's fake one). Standard library only,
besides the ``ray`` command of the environment it runs in.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime

log = logging.getLogger("spot_notice")

AWS_METADATA = "http://169.254.169.254"
GCP_METADATA = "http://metadata.google.internal"
TIMEOUT_S = 2.0  # per metadata request: the service is local to the instance and answers in milliseconds
TOKEN_TTL_S = 21600  # an IMDSv2 token's lifetime asked for (AWS's maximum)


@dataclass
class Provider:
    """Where a cloud says the instance is being taken, and how to ask."""

    name: str
    url: str
    token_url: str | None = None  # IMDSv2: a PUT here returns the token each request carries
    headers: dict[str, str] = field(default_factory=dict)
    notice_s: float = 30.0  # the notice a cloud gives when its answer carries no time of its own
    token: str | None = None

    def deadline(self, now: float) -> float | None:
        """The time (``time.time()``) the instance goes, when the cloud has announced it; None when it has not."""
        body = self._get()
        if body is None:
            return None
        if self.name == "gcp":
            return now + self.notice_s if body.strip().upper() == "TRUE" else None
        notice = json.loads(body)  # aws: {"action": "terminate" | "stop" | "hibernate", "time": ISO 8601, UTC}
        return datetime.fromisoformat(notice["time"].replace("Z", "+00:00")).timestamp()

    def _get(self) -> str | None:
        """The notice's text; None on 404 (AWS: no notice yet). A 401 (the IMDSv2 token expired) fetches a new token
        and asks once more."""
        for attempt in range(2):
            if self.token_url and (self.token is None or attempt):
                self.token = self._new_token()
            headers = {**self.headers, **({"X-aws-ec2-metadata-token": self.token} if self.token else {})}
            try:
                with urllib.request.urlopen(urllib.request.Request(self.url, headers=headers), timeout=TIMEOUT_S) as r:
                    return r.read().decode()
            except urllib.error.HTTPError as err:
                if err.code == 404:
                    return None
                if err.code != 401 or not self.token_url or attempt:
                    raise
        return None

    def _new_token(self) -> str:
        assert self.token_url is not None
        request = urllib.request.Request(
            self.token_url, method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)}
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.read().decode()


def provider(name: str, url: str | None = None, token_url: str | None = None, notice_s: float = 30.0) -> Provider:
    """The metadata endpoint of ``name`` (aws, gcp), or ``url`` / ``token_url`` in its place."""
    if name == "aws":
        return Provider(
            "aws",
            url or f"{AWS_METADATA}/latest/meta-data/spot/instance-action",
            token_url or f"{AWS_METADATA}/latest/api/token",
            notice_s=notice_s,
        )
    if name == "gcp":
        return Provider(
            "gcp",
            url or f"{GCP_METADATA}/computeMetadata/v1/instance/preempted",
            headers={"Metadata-Flavor": "Google"},
            notice_s=notice_s,
        )
    raise ValueError(f"--provider: {name!r} is not one of aws, gcp")


def drain_command(address: str, deadline: float, now: float, node_id: str | None, reason: str) -> list[str]:
    """``ray drain-node`` for this node (or ``node_id``), for preemption, with the seconds left to ``deadline``."""
    seconds = max(1, math.floor(deadline - now))  # never later than the cloud's deadline
    command = ["ray", "drain-node", "--address", address, "--reason", "DRAIN_NODE_REASON_PREEMPTION"]
    command += ["--reason-message", reason, "--deadline-remaining-seconds", str(seconds)]
    return command + (["--node-id", node_id] if node_id else [])


def watch(
    cloud: Provider,
    address: str,
    *,
    poll_s: float = 5.0,
    node_id: str | None = None,
    ray_token_file: str | None = None,
    clock=time.time,  # noqa: ANN001  # a test's
) -> float:
    """Poll until a notice, then drain the node; returns the deadline. A metadata request that fails (the service
    restarting) is logged and asked again at the next poll: only a notice ends the watch."""
    while True:
        try:
            deadline = cloud.deadline(clock())
        except (OSError, ValueError, KeyError) as err:  # URLError is an OSError; a malformed answer a ValueError
            log.warning("metadata %s: %s; asking again in %g s", cloud.url, err, poll_s)
            deadline = None
        if deadline is not None:
            break
        time.sleep(poll_s)
    now = clock()
    command = drain_command(address, deadline, now, node_id, f"{cloud.name} preemption notice")
    env = dict(os.environ)
    if ray_token_file:  # the cluster's auth token: the GCS refuses a drain request without it
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=ray_token_file)
    log.warning("%s preemption notice: the node goes in %.0f s; draining it: %s", cloud.name, deadline - now, command)
    subprocess.run(command, env=env, check=True, timeout=60)
    return deadline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", choices=["aws", "gcp"], required=True)
    parser.add_argument("--address", required=True, help="the cluster's GCS address, <head>:6379")
    parser.add_argument("--ray-token-file", help="the cluster's auth token file (token auth)")
    parser.add_argument("--node-id", help="the Ray node to drain (default: the one on this machine)")
    parser.add_argument("--poll-s", type=float, default=5.0, help="seconds between two looks (default 5)")
    parser.add_argument("--url", help="the notice's URL, instead of the provider's metadata service")
    parser.add_argument("--token-url", help="aws: the IMDSv2 token URL, instead of the metadata service's")
    parser.add_argument("--notice-s", type=float, default=30.0, help="gcp: seconds from the notice to the end")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cloud = provider(args.provider, args.url, args.token_url, args.notice_s)
    watch(cloud, args.address, poll_s=args.poll_s, node_id=args.node_id, ray_token_file=args.ray_token_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
