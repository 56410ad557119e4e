"""Keep a single-machine Ray on the loopback interface.

On Linux Ray advertises the machine's routable address even for a local, single-node cluster: it rewrites
``127.0.0.1`` (``_node_ip_address``) to that address, so all of its internal gRPC traffic (GCS, raylet, workers)
leaves through the network interface. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` it uses the loopback address,
as it does on macOS. Ray reads that variable once, when it is imported, so this must run before ``import ray``.
It changes where Ray listens and connects, never a result. Only for a local Ray: a driver that attaches to a
multi-node cluster has to advertise an address the other nodes can reach.

This module must not import Ray.
"""

from __future__ import annotations

import logging
import os
import sys

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
