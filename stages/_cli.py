"""What every stage entry point shares: argument parsing conventions, logging set-up, and clean failures.

Library code raises; a stage turns the expected failures (bad params, missing or corrupt input files) into one
clear line on stderr and exit code 2, so `dvc repro` stops before expensive work with a message naming the key or
file. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.config import Params, load_params
from pipeline.io import (  # a bug that raises ValueError still shows its traceback with -v
    EXPECTED_FAILURES,
    LASTING_OS_ERRORS,
    StorageFaultError,
)

EXIT_TRACKING_BUFFERED = 75  # sysexits' EX_TEMPFAIL: the work is done, its MLflow writes wait for the server


def make_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose --help shows the stage's docstring, with the --params option every stage takes."""
    script = Path(sys.argv[0])
    prog = f"python -m stages.{script.stem}" if script.parent.name == "stages" else None  # how stages are run
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def setup_logging(verbose: bool = False) -> None:
    """One line per log record on stderr; when stderr is not a terminal (a log file, `dvc repro` piped, CI), no
    progress bars: MLflow's artifact download bars and other tqdm bars would write a line per refresh."""
    if not sys.stderr.isatty():
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        os.environ.setdefault("TQDM_DISABLE", "1")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def _terminate_like_interrupt(signum: int, frame: object) -> None:
    """SIGTERM (a scheduler preempting the job, ``kill``) stops the stage as Ctrl-C does: Ray Tune then saves its
    state and closes the MLflow runs, and the next run resumes instead of finding runs left RUNNING."""
    signal.raise_signal(signal.SIGINT)


def run(stage: Callable[[argparse.Namespace, Params], int], args: argparse.Namespace) -> int:
    """Set up logging, load and validate params, run the stage; expected failures become exit code 2.

    Ctrl-C (SIGINT) and SIGTERM stop every stage the same way, even one started with SIGINT ignored: a shell without
    job control starts its background jobs so (``dvc repro &`` in a script, a CI step), and such a stage would
    otherwise ignore ``kill -INT`` and, through ``_terminate_like_interrupt``, SIGTERM too."""
    setup_logging(args.verbose)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate_like_interrupt)
    log = logging.getLogger(f"stages.{Path(sys.argv[0]).stem}")
    try:
        params = load_params(args.params)
        return stage(args, params)
    except EXPECTED_FAILURES as err:
        log.error("%s", err)
        log.debug("traceback (a bug rather than bad input? please report it)", exc_info=True)
        if not args.verbose:
            log.error("(run with -v for the traceback)")
        return 2
    except StorageFaultError as err:  # the storage full, read-only...: the runs are closed with the reason
        log.error("%s", err)
        return 1
    except OSError as err:
        if err.filename is not None and err.errno in LASTING_OS_ERRORS:  # a full results disk...: what to do
            log.error("%s", StorageFaultError(err.filename, err, key=None))
            return 1
        if err.filename is None:  # not a file the stage could not write (a lost connection...): a bug, keep it
            raise
        # An output path that became unwritable during the run (permissions, a full or read-only disk): the runs are
        # already closed in MLflow and the Ray results kept, so a re-run restores instead of training again.
        log.error(
            "cannot write %s (%s); fix it and re-run: the finished work is restored, not redone",
            err.filename,
            err.strerror or type(err).__name__,
        )
        return 1
    except KeyboardInterrupt:
        log.error("interrupted; outputs written so far are complete, re-run to continue")
        return 130


def say_buffered(outcome: Any) -> bool:
    """One line when a tracked run (``pipeline.sweep.tracked.TrackedOutcome``) ended with MLflow writes still buffered
    (the server did not come back): which server, how many, where; the stage then exits ``EXIT_TRACKING_BUFFERED``."""
    if outcome.buffered:
        logging.getLogger(f"stages.{Path(sys.argv[0]).stem}").error(
            "the MLflow server at %s does not answer: %d write(s) are buffered in %s; the next run of this stage "
            "flushes them first",
            outcome.parent.tracking_uri,
            outcome.buffered,
            outcome.buffer_file,
        )
    return bool(outcome.buffered)


def main_for(stage: Callable[[argparse.Namespace, Params], int], parser: argparse.ArgumentParser) -> Callable:
    def main(argv: Sequence[str] | None = None) -> int:
        return run(stage, parser.parse_args(argv))

    return main
