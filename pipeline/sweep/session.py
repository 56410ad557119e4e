"""Where the sweep's Ray runs: attach to a cluster, or start a local Ray kept on the loopback interface.

On Linux Ray advertises the machine's routable address even for a local cluster, so its internal gRPC traffic leaves
through the network interface; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read once when Ray is imported, keeps it on
127.0.0.1 as on macOS (where Ray listens, never a result). Attaching (``sweep.ray_address`` / ``RAY_ADDRESS``):
``prepare_driver_env`` sets, before Ray is imported, that variable for a cluster on 127.0.0.1 and
``RAY_AUTH_MODE=token`` when a token is available (an explicit address never turns token auth on: Ray retries ~20 s
and raises a bare ``ConnectionError``); ``check_attachable`` asks the cluster's GCS for its nodes within seconds;
``ray_session`` ships this checkout as the job's ``working_dir``. Ray is imported only inside functions.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pipeline.config import SweepConfig
from pipeline.sweep.orphans import mark_session

log = logging.getLogger(__name__)

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_FILE = Path("~/.ray/auth_token")  # where Ray itself looks last (its token loader's order)
TOKEN_HELP = f"give this driver the token: ${TOKEN_ENV}, a file named by ${TOKEN_PATH_ENV}, or {DEFAULT_TOKEN_FILE}"
ATTACH_TIMEOUT_S = 5.0
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # ray._private.runtime_env.constants: set for a submitted job's driver


def ray_address(sweep: SweepConfig) -> str | None:
    """The cluster to attach to (``sweep.ray_address``, else ``$RAY_ADDRESS``), or None for a local Ray."""
    return sweep.ray_address or os.environ.get("RAY_ADDRESS") or None


def gcs_host_port(address: str) -> tuple[str, int] | None:
    """Host and port of a ``host:port`` cluster address; None for ``auto`` or a ``ray://`` client address."""
    if address == "auto" or address.startswith("ray://"):
        return None
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise ValueError(f"sweep.ray_address: {address!r} is not host:port (the head's GCS address: 10.0.0.5:6379)")
    return parts.hostname, port


def auth_token_source() -> str | None:
    """Where Ray will read this driver's auth token from (its own order), or None when there is none."""
    if os.environ.get(TOKEN_ENV):
        return f"${TOKEN_ENV}"
    if path := os.environ.get(TOKEN_PATH_ENV):
        return f"${TOKEN_PATH_ENV} ({path})"
    return str(DEFAULT_TOKEN_FILE) if DEFAULT_TOKEN_FILE.expanduser().is_file() else None


def prepare_driver_env(sweep: SweepConfig) -> None:
    """Before Ray is imported: keep Ray on 127.0.0.1 for a local Ray or a cluster on the loopback interface, and
    send the auth token when attaching and a token is available (an explicit ``RAY_AUTH_MODE`` is the user's)."""
    address = ray_address(sweep)
    where = gcs_host_port(address) if address else None
    if address is None or (where is not None and where[0] in LOOPBACK_HOSTS):
        keep_local_ray_on_loopback()
    if address:
        send_token_if_available()


def send_token_if_available() -> None:
    """Before Ray is imported (it reads the mode once): turn on token mode for this client when a token is
    available and the user has not chosen a mode (an explicit ``RAY_AUTH_MODE`` is theirs)."""
    if AUTH_MODE_ENV not in os.environ and auth_token_source() is not None:
        if "ray" in sys.modules:
            log.warning("Ray was imported before its auth mode was set; it may not send its auth token")
        os.environ[AUTH_MODE_ENV] = "token"


def _unreachable(address: str, why: str) -> ValueError:
    return ValueError(
        f"sweep.ray_address: cannot attach to the Ray cluster at {address} ({why}); start it (ray start --head, "
        "ray up) or fix sweep.ray_address / $RAY_ADDRESS"
    )


def check_attachable(address: str, timeout_s: float = ATTACH_TIMEOUT_S) -> int:
    """Ask the cluster's GCS for its nodes, within seconds; return how many are alive. Raises naming
    ``sweep.ray_address`` and the token variables instead of Ray's ~20 s of retries and bare ``ConnectionError``."""
    if address == "auto":  # the cluster last started with `ray start` on this machine (Ray's own lookup)
        from ray._private.services import canonicalize_bootstrap_address

        found = canonicalize_bootstrap_address(address)
        if found is None:
            raise ValueError(
                "sweep.ray_address: 'auto' found no Ray started on this machine (ray start --head); "
                "give the head's host:port"
            )
        address = found
    where = gcs_host_port(address)
    if where is None:
        return 0  # ray://: a Ray Client address; ray.init reports its own error
    try:  # Ray's client waits ~40 s for an address that does not answer: a plain TCP connect first
        socket.create_connection(where, timeout=timeout_s).close()
    except OSError as err:
        raise _unreachable(address, err.strerror or str(err) or type(err).__name__) from None
    from ray._raylet import GcsClient  # the client `ray health-check` uses; it sends the token in token mode
    from ray.core.generated.gcs_pb2 import GcsNodeInfo
    from ray.exceptions import AuthenticationError, RayError

    try:
        nodes = GcsClient(address=f"{where[0]}:{where[1]}").get_all_node_info(timeout=timeout_s)
    except AuthenticationError:
        source = auth_token_source()
        mode = os.environ.get(AUTH_MODE_ENV)
        sent = f"the token from {source}" if source and mode == "token" else f"no token ({AUTH_MODE_ENV}={mode})"
        raise ValueError(
            f"sweep.ray_address: the Ray cluster at {address} requires token authentication and refused {sent}: "
            f"{TOKEN_HELP} (`ray get-auth-token` on the head prints it); never switch the cluster's auth off"
        ) from None
    except RayError as err:
        raise _unreachable(address, str(err).splitlines()[0]) from None
    return sum(1 for info in nodes.values() if info.state == GcsNodeInfo.ALIVE)


def code_runtime_env(project_root: Path) -> dict[str, Any] | None:
    """The job's runtime environment on a cluster: this checkout as every worker's ``working_dir`` (Ray uploads it,
    leaving out what ``.gitignore`` and ``.rayignore`` list; the dataset goes through the object store instead).
    None in a submitted job: its own ``working_dir`` already reaches every task, and Ray refuses a second one."""
    return None if in_submitted_job() else {"working_dir": str(project_root)}


def in_submitted_job() -> bool:
    """Whether this process is a Ray job's driver (Ray's job supervisor hands it the job's runtime environment in this
    variable): its tasks get the job's ``working_dir`` already, and a new one would replace it."""
    return JOB_CONFIG_ENV in os.environ


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


DASHBOARD_ENV = "RAY_DASHBOARD"  # 1: a local Ray starts its dashboard (display only: no result depends on it)


def wants_dashboard() -> bool:
    """Whether the local Ray starts its dashboard (off by default: ~1.5 GiB and a few seconds more per start)."""
    return os.environ.get(DASHBOARD_ENV, "").strip().lower() in ("1", "true", "yes", "on")


TOKEN_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"


class TokenAdviceFilter(logging.Filter):
    """Ray 2.60's local ``ray.init`` logs "Token authentication is enabled ... Set RAY_AUTH_MODE=disabled to opt out":
    advice this project never takes (token auth stays on). The line is replaced by one that says what is true."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "opt out" not in record.getMessage():
            return True
        where = auth_token_source() or str(DEFAULT_TOKEN_FILE)
        log.info("ray: token authentication is on for the local Ray (token: %s); the pipeline keeps it on", where)
        return False


def quiet_token_advice() -> None:
    """Install ``TokenAdviceFilter`` on Ray's token-setup logger (once)."""
    logger = logging.getLogger(TOKEN_SETUP_LOGGER)
    if not any(isinstance(f, TokenAdviceFilter) for f in logger.filters):
        logger.addFilter(TokenAdviceFilter())


@contextmanager
def ray_session(sweep: SweepConfig) -> Iterator[str]:
    """Attach to ``sweep.ray_address`` / ``RAY_ADDRESS``, or start a local Ray bound to 127.0.0.1; say which."""
    import ray

    if ray.is_initialized():
        log.info("ray: using the Ray already initialised in this process")
        yield "existing"
        return
    address = ray_address(sweep)
    quiet_token_advice()
    caller_sigterm = signal.getsignal(signal.SIGTERM)
    if address:
        from pipeline.sweep.identity import PROJECT_ROOT

        if in_submitted_job():
            log.info("ray: a job on the cluster at %s; its working_dir (the submitted package) is the code", address)
        else:
            log.info("ray: attaching to the cluster at %s, shipping the code in %s", address, PROJECT_ROOT)
        ray.init(address=address, runtime_env=code_runtime_env(PROJECT_ROOT))
    else:
        log.info("ray: starting a local Ray on this machine (127.0.0.1; token auth as configured)")
        dashboard = wants_dashboard()
        context = ray.init(
            address="local", include_dashboard=dashboard, dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1"
        )
        mark_session(context.address_info["session_dir"])  # a SIGKILLed driver's Ray is ended by the next run
        if dashboard:
            log.info("ray: dashboard at http://%s (while the stage runs; token auth applies)", context.dashboard_url)
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
