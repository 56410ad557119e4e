"""Where the sweep's Ray runs: attach to a cluster, or start a local Ray kept on the loopback interface.

On Linux Ray advertises the machine's routable address even for a local, single-node cluster: it rewrites
``127.0.0.1`` (``_node_ip_address``) to that address, so all of its internal gRPC traffic (GCS, raylet, workers)
leaves through the network interface. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` it uses the loopback address,
as it does on macOS. Ray reads that variable once, when it is imported, so this must run before ``import ray``.
It changes where Ray listens and connects, never a result. Only for a local Ray: a driver that attaches to a
multi-node cluster has to advertise an address the other nodes can reach.

This module imports Ray only inside ``ray_session``: ``keep_local_ray_on_loopback`` must run before Ray is imported.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pipeline.config import SweepConfig

log = logging.getLogger(__name__)

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def ray_address(sweep: SweepConfig) -> str | None:
    """The cluster to attach to (``sweep.ray_address``, else ``$RAY_ADDRESS``), or None for a local Ray."""
    return sweep.ray_address or os.environ.get("RAY_ADDRESS") or None


def local_capacity() -> tuple[int, int]:
    """CPU cores this process may use and CUDA devices it sees: what a local Ray would offer."""
    import torch  # the driver has it anyway; imported here so that --help stays fast

    return len(os.sched_getaffinity(0)), torch.cuda.device_count()


def check_fits(sweep: SweepConfig, cores: float, gpus: float, where: str) -> None:
    """Raise naming the key when one trial asks for more than ``where`` has: Ray would wait forever (it only logs
    that it cannot schedule the trial, in case an autoscaler adds nodes)."""
    wanted = sweep.resources
    if wanted.cpu > cores:
        raise ValueError(f"sweep.resources.cpu: each trial asks for {wanted.cpu:g} CPUs, {where} has {cores:g}")
    if wanted.gpu > gpus:
        raise ValueError(
            f"sweep.resources.gpu: each trial asks for {wanted.gpu:g} GPU(s), {where} has {gpus:g} "
            "(set sweep.ray_address to run on a cluster)"
        )


def keep_local_ray_on_loopback() -> None:
    """Make a Ray started later by this process (and its workers) use 127.0.0.1 for all its traffic."""
    if "ray" in sys.modules and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
        log.warning("Ray was imported before keep_local_ray_on_loopback(); a local Ray may use the machine's address")
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)


@contextmanager
def ray_session(sweep: SweepConfig) -> Iterator[str]:
    """Attach to ``sweep.ray_address`` / ``RAY_ADDRESS``, or start a local Ray bound to 127.0.0.1; say which."""
    import ray

    if ray.is_initialized():
        log.info("ray: using the Ray already initialised in this process")
        yield "existing"
        return
    address = ray_address(sweep)
    caller_sigterm = signal.getsignal(signal.SIGTERM)
    if address:
        log.info("ray: attaching to the cluster at %s", address)
        ray.init(address=address)
    else:
        log.info("ray: starting a local Ray on this machine (127.0.0.1; token auth as configured)")
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1")
        if (node_ip := ray.util.get_node_ip_address()) != "127.0.0.1":
            log.warning("ray: the local Ray advertises %s, not 127.0.0.1 (see keep_local_ray_on_loopback)", node_ip)
    if callable(caller_sigterm) and threading.current_thread() is threading.main_thread():
        # ray.init replaces the process's SIGTERM handler with one that exits at once; keep the caller's (the
        # stages stop on SIGTERM as on Ctrl-C, so Tune saves its state and the MLflow runs are closed).
        signal.signal(signal.SIGTERM, caller_sigterm)
    try:
        yield address or "local"
    finally:
        ray.shutdown()
