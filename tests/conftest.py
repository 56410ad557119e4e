"""Shared fixtures. ``tiny_cifar10`` writes a few images in the real CIFAR-10 python format for the real loader.

Every Ray a test starts (and every stage subprocess attaching to it) talks over 127.0.0.1 only: set up here, before
any test module imports Ray (see ``pipeline.sweep.session``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.cifar_archive import Cifar10Archive, write_cifar10
from pipeline.sweep.session import keep_local_ray_on_loopback

keep_local_ray_on_loopback()
# Tests send traffic to 127.0.0.1 only: no usage statistics or telemetry from the real tools they start.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
# An environment with PYTHONDONTWRITEBYTECODE set (CI images often set it) would make every stage run and Ray worker
# the tests start compile the project's modules from source again, 0.3 CPU-s each in a few hundred processes: they
# write their bytecode, as on a user's machine (the tests' own process keeps its setting).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# Buckets in tests are served by a local S3-compatible server (``s3``): credentials it accepts, set before any Ray
# starts so its workers inherit them (as a cluster's nodes get theirs), and the AWS SDK never asks a metadata service.
for _key, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ[_key] = _value


@pytest.fixture
def tiny_cifar10(tmp_path: Path) -> Cifar10Archive:
    """Four random images per batch in the real CIFAR-10 format (``benchmarks/cifar_archive.py``)."""
    return write_cifar10(tmp_path / "cifar")


@dataclass(frozen=True)
class Bucket:
    """An empty bucket on the session's S3-compatible server: ``uri(path)`` is what ``sweep.storage_path`` takes."""

    name: str
    endpoint: str  # 127.0.0.1:<port>

    def uri(self, path: str = "") -> str:
        return f"s3://{self.name}/{path}?endpoint_override={self.endpoint}&scheme=http&region=us-east-1"

    def keys(self, prefix: str = "") -> list[str]:
        """Every object under ``prefix`` (a path in the bucket), relative to the bucket."""
        import pyarrow.fs as pafs

        fs, root = pafs.FileSystem.from_uri(self.uri(prefix))
        listed = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        return sorted(i.path.removeprefix(f"{self.name}/") for i in listed if i.type == pafs.FileType.File)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3-compatible HTTP server on 127.0.0.1 (moto's): pyarrow's S3 client, and so Ray Tune's storage, talk
    to it as to AWS S3. Started once per session, stopped at its end."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def new_bucket(s3_endpoint: str) -> Callable[[], Bucket]:
    """Makes a bucket no test has used yet (for a module's fixture; a test takes ``bucket``)."""
    import pyarrow.fs as pafs

    def make() -> Bucket:
        made = Bucket(f"test-{uuid.uuid4().hex[:12]}", s3_endpoint)
        fs, _ = pafs.FileSystem.from_uri(f"{made.uri()}&allow_bucket_creation=true")
        fs.create_dir(made.name)
        return made

    return make


@pytest.fixture
def bucket(new_bucket: Callable[[], Bucket]) -> Bucket:
    """A new bucket per test, so tests never see each other's objects."""
    return new_bucket()


# With pytest-xdist (`make test`: `-n 2`), tests that share a session's real tools run in one worker, so each tool is
# started once per group: the integration tests in two groups (each worker that runs one starts its own local Ray,
# MLflow server and project copy: the tools cost seconds, the two halves minutes each), the cluster's tests in one
# (the two-node cluster and the GPU nodes a module adds to it); the other tests go by module, so a module's fixtures
# are built once. The groups go out first, the costliest first, and the short modules fill in around them. (xdist's
# own `--dist loadgroup` marks do not take on pytest 9: it renames items through an attribute pytest no longer reads.)
INTEGRATION = "tests/integration/"
# The fault-tolerance half of the integration tests (storage, outages, deaths, restores); the rest of tests/integration
# (the pipeline, its views, scheduling) is the other half. A new module joins the second unless it is listed here.
FAULT_MODULES = {
    f"{INTEGRATION}{name}.py"
    for name in (
        "test_incremental_sweep",
        "test_shared_store",
        "test_lab_store",
        "test_bucket_storage",
        "test_tracking_outage",
        "test_reliability",
        "test_storage_faults",
        "test_trial_deaths",
        "test_truncated_checkpoint",
        "test_orphans",
    )
}
# The SLURM cluster's tests (their own daemons, namespaces and Ray per job) need nothing of the two-node cluster: a
# group of their own, so the other worker can run them beside it.
SLURM_MODULE = "tests/cluster/test_slurm.py"
GROUP_ORDER = ("local-ray", "local-ray-faults", "two-node-cluster", "slurm-cluster")  # costliest first


def xdist_scope(nodeid: str) -> str:
    """The unit a worker runs whole, by the test's id: its group, else its module."""
    module = nodeid.split("::", 1)[0]
    if module in FAULT_MODULES:
        return "local-ray-faults"
    if module.startswith(INTEGRATION):
        return "local-ray"
    if module == SLURM_MODULE:
        return "slurm-cluster"
    if module.startswith("tests/cluster/"):
        return "two-node-cluster"
    return module


class _OneWorkerPerTool:
    """xdist's scope scheduler with ``xdist_scope`` as the scope and the groups handed out first (``GROUP_ORDER``);
    xdist alone orders scopes by their number of tests, which would leave the two-node cluster for the end."""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return xdist_scope(nodeid)

            def _assign_work_unit(self, node: object) -> None:
                for group in reversed(GROUP_ORDER):
                    if group in self.workqueue:
                        self.workqueue.move_to_end(group, last=False)
                super()._assign_work_unit(node)

        return Scheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist: the scheduler above (in the controller), and torch on one thread in each worker: the workers
    already keep both cores busy, and a second intra-op thread per worker only spin-waits for a core (tests of tiny
    models set one thread for that reason)."""
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_OneWorkerPerTool(), "one-worker-per-tool")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
