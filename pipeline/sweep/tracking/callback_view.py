"""What ``epochs`` and ``trial_end`` read of the Tune callback that owns them, as a protocol.

Why: they write through the callback's buffer and client and read its runs, but importing the callback to name its
type made an import circle (the callback imports them). The callback satisfies this protocol; they import this.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.buffer import TrackingBuffer
from pipeline.sweep.tracking.logged_model import PreparedDataset
from pipeline.sweep.tracking.parent import ParentRun


class CallbackView(Protocol):
    parent: ParentRun
    dataset: PreparedDataset | None
    buffer_file: Path | None
    last_epoch: dict[str, int]  # trial_id -> the last epoch the callback saw reported

    @property
    def buffer(self) -> TrackingBuffer: ...

    @property
    def client(self) -> Any: ...

    def read_run(self, run_id: str, read: Callable[[str], Any], fallback: Any) -> Any: ...

    def location_of(self, fs_path: str) -> StoragePath: ...
