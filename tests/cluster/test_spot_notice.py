"""examples/spot_notice.py drains a real node: a fake GCP metadata service on 127.0.0.1 says the instance is
preempted, the handler (run as a lab runs it, with the cluster's token file) drains the node for preemption with the
notice's deadline, and the GCS records the node's end as a preemption drain."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cluster.conftest import LocalCluster, wait_for_alive_nodes

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


class Preempted(BaseHTTPRequestHandler):
    def log_message(self, *_: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        google = self.headers.get("Metadata-Flavor") == "Google"
        self.send_response(200 if google else 403)
        self.end_headers()
        self.wfile.write(b"TRUE" if google else b"")


@pytest.fixture
def gcp_metadata() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Preempted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1/instance/preempted"
    finally:
        server.shutdown()
        server.server_close()


def node_entry(cluster: LocalCluster, node_id: str) -> dict:
    """The node as the GCS lists it (``ray.nodes()``), alive or gone."""
    code = (
        "import json, sys, ray\n"
        "ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "print(json.dumps([n for n in ray.nodes() if n['NodeID'] == sys.argv[2]], default=str))\n"
    )
    env = cluster.driver_env(RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    done = subprocess.run(
        [sys.executable, "-c", code, cluster.address, node_id], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [entry] = json.loads(done.stdout.strip().splitlines()[-1])
    return entry


AUTOSCALER_DRAIN_PREEMPTED = 3  # NodeDeathInfo.Reason in Ray 2.60's gcs.proto


def test_a_spot_notice_drains_its_node_for_preemption(cluster: LocalCluster, gcp_metadata: str) -> None:
    """An idle node drained for preemption ends at once (Ray ends a drained node with no work): the GCS records its end
    as a preemption drain, with the handler's message. (With trials on it the node stays up, draining, until the
    deadline: tests/cluster/test_gpu_nodes.py's drain tests.)"""
    node = cluster.start_node("worker", cluster.address)
    cluster.extra.append(node)
    try:
        command = [
            *(sys.executable, str(ROOT / "examples/spot_notice.py"), "--provider", "gcp", "--url", gcp_metadata),
            *("--address", cluster.address, "--node-id", node.node_id, "--ray-token-file", str(cluster.token_file)),
            *("--notice-s", "30", "--poll-s", "0.2"),
        ]
        # The handler has only what a node's unit gives it; here also the switch that keeps Ray on 127.0.0.1 (a real
        # node's address is its own), else `ray drain-node` turns 127.0.0.1 into the machine's address.
        env = cluster.driver_env(RAY_ADDRESS=None, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "gcp preemption notice: the node goes in 30 s" in done.stderr
        deadline = time.monotonic() + 30
        while (entry := node_entry(cluster, node.node_id))["Alive"] and time.monotonic() < deadline:
            time.sleep(1)
        assert not entry["Alive"], "the drained idle node is still alive"
        assert (entry["DeathReason"], entry["DeathReasonMessage"]) == (
            AUTOSCALER_DRAIN_PREEMPTED,
            "gcp preemption notice",
        )
    finally:
        node.kill()  # the cloud takes the instance
        node.stop()
        cluster.extra.remove(node)
        wait_for_alive_nodes(cluster, 2, timeout_s=120)
