"""The trial's check that it trains the driver's code: on a cluster a node could import another copy of the project
(an old install, another checkout) instead of the code shipped with the job, and train something else under the
sweep's name."""

from __future__ import annotations

from pathlib import Path


class TrialCodeMismatch(RuntimeError):
    """This worker imports other trial code than the driver that named the sweep."""


def check_trial_code(expected: str | None) -> None:
    """Raise when the trial code this worker imports hashes differently from the driver's (``expected``)."""
    if expected is None:
        return
    # Imported here, in the trial only: it hashes source files and imports nothing that trains.
    from pipeline.sweep.identity import PROJECT_ROOT, code_hash

    if (found := code_hash()) != expected:
        import ray

        raise TrialCodeMismatch(
            f"trial code {found} (from {Path(PROJECT_ROOT)}) on node {ray.util.get_node_ip_address()}, but the driver "
            f"runs {expected}: this node does not import the code shipped with the job (runtime_env working_dir); "
            "check its PYTHONPATH and installed packages"
        )
