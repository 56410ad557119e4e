"""One node of the test cluster, in its own process, started through Ray's own node API (real GCS, raylet, workers).

``python ray_node.py head PORT AGENT_PORT METRICS_PORT DASHBOARD_PORT [CPUS GPUS]`` starts a head whose GCS listens
on 127.0.0.1:PORT; ``python ray_node.py worker ADDRESS AGENT_PORT METRICS_PORT DASHBOARD_PORT [CPUS GPUS]`` joins the
cluster at ADDRESS. The node declares CPUS logical CPUs (default 1) and GPUS GPUs (default 0: declared GPUs need no
real ones, Ray only counts them and sets ``CUDA_VISIBLE_DEVICES``). Every fixed port is
explicit (free ports chosen by the test), the others are picked by the OS. The head serves the dashboard (and with it
the Jobs API) on 127.0.0.1:DASHBOARD_PORT. ``ray start --address`` refuses a second
node on one machine while Ray is kept on the loopback interface; this API does not. The node prints ``READY`` once it
is up and stops exactly its own processes on SIGTERM (never ``ray stop``, which stops every Ray on the machine).
Settings come from the environment the test gives it: ``RAY_TMPDIR`` (private session folder), ``RAY_AUTH_MODE`` /
``RAY_AUTH_TOKEN_PATH`` (token auth).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import ray._private.node
import ray._private.parameter
import ray._private.utils


def main(
    role: str, where: str, agent_port: str, metrics_port: str, dashboard_port: str, cpus: str = "1", gpus: str = "0"
) -> None:
    common = {
        "node_ip_address": "127.0.0.1",
        "num_cpus": int(cpus),
        "num_gpus": int(gpus),
        "object_store_memory": 150 * 1024**2,
        "temp_dir": os.environ["RAY_TMPDIR"],
        "min_worker_port": 0,
        "max_worker_port": 0,
        "dashboard_agent_listen_port": int(agent_port),
        "metrics_export_port": int(metrics_port),
        "dashboard_port": int(dashboard_port),
    }
    if role == "head":
        # The dashboard serves the Jobs API (`ray job submit`, the stage's --submit), on 127.0.0.1 like the rest.
        params = ray._private.parameter.RayParams(
            gcs_server_port=int(where), include_dashboard=True, dashboard_host="127.0.0.1", **common
        )
    else:
        params = ray._private.parameter.RayParams(gcs_address=where, include_log_monitor=False, **common)
    node = ray._private.node.Node(params, head=role == "head", shutdown_at_exit=True, spawn_reaper=True)
    if role == "head":  # as `ray start --head` does: a job's driver finds its cluster ("auto") by this file, else it
        ray._private.utils.write_ray_address(node.gcs_address, os.environ["RAY_TMPDIR"])  # scans for any GCS process
    print(f"READY {node.gcs_address} {node.node_id}", flush=True)
    # A Python handler, set after Ray set up the node, and a main thread that wakes up to run it: the OS may deliver
    # SIGTERM to one of Ray's threads (a blocked mask would be inherited by every Ray process started from here).
    stop = threading.Event()
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)


if __name__ == "__main__":
    main(*sys.argv[1:8])
