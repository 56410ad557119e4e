"""Shared fixtures. ``tiny_cifar10`` writes a few images in the real CIFAR-10 python format for the real loader.

Every Ray a test starts (and every stage subprocess attaching to it) talks over 127.0.0.1 only: set up here, before
any test module imports Ray (see ``pipeline.sweep.session``).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

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

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class _Python2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 ``str`` opcodes, as the real batches (pickled by Python 2) hold them.

    torchvision unpickles with ``encoding="latin1"``, which turns those into ``str`` keys (``entry["data"]``); Python
    3's own pickler would write bytes objects that stay ``b"data"`` and the real loader would not find them.
    """

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def _py2_pickle(obj: object) -> bytes:
    buffer = io.BytesIO()
    _Python2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


@dataclass(frozen=True)
class TinyCifar10:
    archive: Path  # cifar-10-python.tar.gz with top folder cifar-10-batches-py/
    folder: Path  # the same batches, extracted
    train_rows: np.ndarray  # uint8 (N, 3072): R plane, G plane, B plane, each 32x32 row-major
    train_labels: list[int]
    test_rows: np.ndarray
    test_labels: list[int]
    classes: list[str]


def write_tiny_cifar10(directory: Path, per_batch: int = 4, seed: int = 0) -> TinyCifar10:
    """data_batch_1..5, test_batch and batches.meta as Python 2 pickles of byte-keyed dicts, like the download."""
    rng = np.random.default_rng(seed)
    folder = directory / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {f"data_batch_{i}": f"training batch {i} of 5" for i in range(1, 6)}
    batches["test_batch"] = "testing batch 1 of 1"
    rows, labels = {}, {}
    for name, batch_label in batches.items():
        rows[name] = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels[name] = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        entry = {
            b"batch_label": batch_label.encode(),
            b"labels": labels[name],
            b"data": rows[name],
            b"filenames": [f"{name}_{i}.png".encode() for i in range(per_batch)],
        }
        (folder / name).write_bytes(_py2_pickle(entry))
    meta = {b"num_cases_per_batch": per_batch, b"label_names": [c.encode() for c in CIFAR10_CLASSES], b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(_py2_pickle(meta))
    archive = directory / "archive" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    train_names = [f"data_batch_{i}" for i in range(1, 6)]
    return TinyCifar10(
        archive=archive,
        folder=folder,
        train_rows=np.concatenate([rows[n] for n in train_names]),
        train_labels=[label for n in train_names for label in labels[n]],
        test_rows=rows["test_batch"],
        test_labels=labels["test_batch"],
        classes=CIFAR10_CLASSES,
    )


@pytest.fixture
def tiny_cifar10(tmp_path: Path) -> TinyCifar10:
    return write_tiny_cifar10(tmp_path / "cifar")


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
# MLflow server and project copy: the tools cost seconds, the two halves minutes each), the two-node cluster's tests in
# one; the other tests go by module, so a module's fixtures are built once. The groups go out first, the costliest
# first, and the short modules fill in around them. (xdist's own `--dist loadgroup` marks do not take on pytest 9: it
# renames items through an attribute pytest no longer reads.)
INTEGRATION = "tests/integration/"
# The fault-tolerance half of the integration tests (storage, outages, deaths, restores); the rest of tests/integration
# (the pipeline, its views, scheduling) is the other half. A new module joins the second unless it is listed here.
FAULT_MODULES = {
    f"{INTEGRATION}{name}.py"
    for name in (
        "test_incremental_sweep",
        "test_shared_store",
        "test_bucket_storage",
        "test_tracking_outage",
        "test_reliability",
        "test_storage_faults",
        "test_trial_deaths",
        "test_truncated_checkpoint",
        "test_orphans",
    )
}
GROUP_ORDER = ("local-ray", "local-ray-faults", "two-node-cluster")  # costliest first


def xdist_scope(nodeid: str) -> str:
    """The unit a worker runs whole, by the test's id: its group, else its module."""
    module = nodeid.split("::", 1)[0]
    if module in FAULT_MODULES:
        return "local-ray-faults"
    if module.startswith(INTEGRATION):
        return "local-ray"
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
