"""Test-only: paper-like batch times on a tiny model, and a record of every batch a trial trains, in the Ray workers
of the nodes a test starts with this folder on ``PYTHONPATH`` (Python imports ``sitecustomize`` at start-up). Never
part of the project's code, params or MLflow runs.

It wraps ``pipeline.trial.preemption.DrainWatch.noticed``, which the training loop asks once before every batch, when
a worker imports that module. Settings come from the JSON file named by ``$PACED_BATCHES``, read at each trial's
first batch (a test changes them between sweeps): ``sleep_s`` added to every batch; ``log``, a file every batch appends
``batch <trial id> <node id> <noticed> <time.time()>`` to (noticed: the drain notice was seen instead, no batch
trained); ``start_together``, how many trials must have started before any trains
its first batch (waiting at most ``wait_s``): a test of concurrency then cannot pass by luck of start times.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time

TARGET = "pipeline.trial.preemption"


def _settings() -> dict:
    with open(os.environ["PACED_BATCHES"]) as file:
        return json.load(file)


def _append(path: str, line: str) -> None:
    with open(path, "a") as file:  # one short O_APPEND write: lines of concurrent workers never interleave
        file.write(line + "\n")


def _started(path: str) -> int:
    with open(path) as file:
        return len({line.split()[1] for line in file if line.startswith("start ")})


def _pace(watch_class: type) -> None:
    noticed = watch_class.noticed
    known: dict[str, dict] = {}  # trial id -> settings, read at its first batch in this process

    def paced(self: object) -> bool:
        from ray import tune

        trial = tune.get_context().get_trial_id()
        if trial not in known:
            known[trial] = settings = _settings()
            _append(settings["log"], f"start {trial} {self.node_id}")
            deadline = time.monotonic() + settings.get("wait_s", 120)
            while _started(settings["log"]) < settings.get("start_together", 1) and time.monotonic() < deadline:
                time.sleep(0.2)
        settings = known[trial]
        answer = noticed(self)
        if not answer:
            time.sleep(settings["sleep_s"])
        _append(settings["log"], f"batch {trial} {self.node_id} {int(answer)} {time.time():.3f}")
        return answer

    watch_class.noticed = paced


class _PaceOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object, target: object = None) -> object:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # find the real module once, then wrap its loading
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module: object) -> None:
            run(module)
            _pace(module.DrainWatch)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("PACED_BATCHES"):
    sys.meta_path.insert(0, _PaceOnImport())
