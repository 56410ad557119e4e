"""Where the Ray results live: a local folder, or a bucket named by a pyarrow file-system URI.

``sweep.storage_path`` is a path (one machine, or a file system every node mounts at the same path) or a URI that
``pyarrow.fs.FileSystem.from_uri`` resolves (``s3://bucket/ray?endpoint_override=host:9000&scheme=http``,
``gs://...``, ``hdfs://...``, ``abfs://...``): the call Ray Tune opens it with, so the driver reads exactly what Tune
writes (why not fsspec: docs/design.md). Credentials come from every node's environment, never the URI (it is
recorded in MLflow and the manifests). What an object store cannot do (the outage buffer, appended and fsync'd line
by line) stays on the driver's disk (``driver_dir``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs

from pipeline.config import Params
from pipeline.io import check_creatable_dir, write_text_atomic

log = logging.getLogger(__name__)

DRIVER_DIR = "results/ray-driver"  # in the project, with a URI storage: files only the driver writes, never shared


def is_uri(location: str) -> bool:
    return "://" in location


class StoragePath:
    """A folder or file under ``sweep.storage_path``: an absolute local path, or a URI (its query kept on every
    child, so a child's text alone opens it again: it is what MLflow tags and the manifests record)."""

    def __init__(self, location: str | Path) -> None:
        self.text = str(location)
        self.remote = is_uri(self.text)  # a URI (a bucket; a file:// URI too): its text names it, not a local path

    @cached_property
    def _fs(self) -> tuple[pafs.FileSystem, str]:
        if not self.remote:
            return pafs.LocalFileSystem(), self.text
        return pafs.FileSystem.from_uri(self.text)

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self._fs[0]

    @property
    def fs_path(self) -> str:
        """The path on ``filesystem`` (a URI without scheme and query, e.g. ``bucket/ray``), as Ray names its trials."""
        return self._fs[1]

    @property
    def local(self) -> Path:
        if self.remote:
            raise ValueError(f"{self.text} is not on this machine's file system")
        return Path(self.text)

    @property
    def name(self) -> str:
        return PurePosixPath(urlsplit(self.text).path if self.remote else self.text).name

    @property
    def parent(self) -> StoragePath:
        if not self.remote:
            return StoragePath(Path(self.text).parent)
        parts = urlsplit(self.text)
        return StoragePath(urlunsplit(parts._replace(path=str(PurePosixPath(parts.path).parent))))

    def __truediv__(self, name: str) -> StoragePath:
        if not self.remote:
            return StoragePath(Path(self.text) / name)
        parts = urlsplit(self.text)
        child = StoragePath(urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name.strip('/')}")))
        if "_fs" in self.__dict__:  # the parent's client: no second from_uri (which may look up the bucket's region)
            child.__dict__["_fs"] = (self.filesystem, f"{self.fs_path.rstrip('/')}/{name.strip('/')}")
        return child

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"StoragePath({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoragePath) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __getstate__(self) -> dict[str, Any]:  # pickled into Tune's state and Ray tasks: the text, never a client
        return {"text": self.text, "remote": self.remote}

    def child_of_fs_path(self, fs_path: str) -> StoragePath:
        """The location of ``fs_path`` (a path on this storage's file system under it, as Ray reports trial and
        checkpoint paths), e.g. ``bucket/ray/tune-x/trial_1`` -> ``s3://bucket/ray/tune-x/trial_1?<query>``."""
        if not self.remote:
            return StoragePath(fs_path)
        relative = PurePosixPath(fs_path).relative_to(self.fs_path)
        return self / str(relative) if str(relative) != "." else self

    def _type(self) -> pafs.FileType:
        return self.filesystem.get_file_info(self.fs_path).type

    def is_file(self) -> bool:
        return self._type() == pafs.FileType.File

    def is_dir(self) -> bool:
        return self._type() == pafs.FileType.Directory

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def read_bytes(self) -> bytes:
        with self.filesystem.open_input_stream(self.fs_path) as stream:
            return stream.readall()

    def write_text(self, text: str) -> None:
        """Written whole or not at all: a local file through a temporary file and a rename; an object store's put
        is atomic by itself."""
        if not self.remote:
            write_text_atomic(Path(self.text), text)
            return
        self.filesystem.create_dir(str(PurePosixPath(self.fs_path).parent))
        with self.filesystem.open_output_stream(self.fs_path) as stream:
            stream.write(text.encode())

    def delete(self) -> None:
        """Remove this file (nothing when it does not exist)."""
        if self.is_file():
            self.filesystem.delete_file(self.fs_path)

    def mkdir(self) -> None:
        self.filesystem.create_dir(self.fs_path)

    def subdirs(self, prefix: str = "") -> list[StoragePath]:
        """The folders directly under this one whose name starts with ``prefix``, by name."""
        listed = self.filesystem.get_file_info(pafs.FileSelector(self.fs_path, allow_not_found=True))
        names = sorted(i.base_name for i in listed if i.type == pafs.FileType.Directory)
        return [self / name for name in names if name.startswith(prefix)]

    def _checkpoint(self) -> Any:
        """This folder as a Tune checkpoint, whose download Tune already does (imported here: the stages' early
        checks and a cluster node's probe never download)."""
        from ray import tune

        return tune.Checkpoint(self.fs_path, filesystem=self.filesystem)

    @contextmanager
    def as_local(self) -> Iterator[Path]:
        """This checkpoint folder on the local disk: itself, or a temporary download of it removed afterwards."""
        with self._checkpoint().as_directory() as local:
            yield Path(local)

    def download(self, into: Path) -> Path:
        """A copy of this checkpoint folder at ``into`` (a local one is copied too: the copy outlives its source)."""
        return Path(self._checkpoint().to_directory(str(into)))

    def upload(self, local: Path) -> None:
        """The local folder ``local`` copied to this location (which it becomes)."""
        self.filesystem.create_dir(self.fs_path)
        pafs.copy_files(
            str(local), self.fs_path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.filesystem
        )


def found_file(path: StoragePath) -> bool:
    """Whether ``path`` is a file; False, with a warning, when its file system cannot be reached (a location an earlier
    run recorded may name a bucket that is gone): the caller falls back as for a deleted file."""
    try:
        return path.is_file()
    except OSError as err:
        log.warning("cannot read %s, treated as missing: %s", path, str(err).splitlines()[0][:200])
        return False


def storage_dir(params: Params, project_root: Path) -> StoragePath:
    """The Ray results folder: a URI as given, a relative ``sweep.storage_path`` resolved against the project root."""
    if is_uri(params.sweep.storage_path):
        return StoragePath(params.sweep.storage_path)
    path = Path(params.sweep.storage_path).expanduser()
    return StoragePath((path if path.is_absolute() else project_root / path).resolve())


def driver_dir(storage: StoragePath, project_root: Path) -> Path:
    """The local folder for the driver's files that must stay on its disk (the outage buffer): the storage itself when
    it is local, else ``DRIVER_DIR`` in the project."""
    return project_root / DRIVER_DIR if storage.remote else storage.local


def check_storage(storage: StoragePath) -> None:
    """Raise ``ValueError`` unless the driver can write, read back and remove a marker at ``storage``: a local folder
    that can be created, or a bucket that exists, answers and accepts these credentials. Seconds, before any run."""
    if not storage.remote:
        check_creatable_dir(storage.local)
        return
    marker = storage / f".write-test-{uuid.uuid4().hex}"
    try:
        marker.write_text("probe")
        if marker.read_text() != "probe":
            raise ValueError(f"{storage}: a marker written there read back different")
        marker.delete()
    except (OSError, ValueError) as err:  # pyarrow's errors name the bucket and the cause (no bucket, denied, refused)
        raise ValueError(f"cannot write and read back a marker in {storage}: {err}") from None
