"""Run the seed band: the study of params.yaml with the keys of an overlay (default params/band.yaml: five paired
seeds of the paper's variants) set through `dvc exp run -S`, so the band is one named DVC experiment.

Reads:  params.yaml (checked with the overlay applied before DVC runs anything) and the overlay.
Runs:   dvc exp run --name <name> -S <key>=<value> ... (every stage whose inputs the overlay changes; the report then
        shows each variant's mean and 95 % interval across seeds and the claims pair their variants by seed).
Leaves: params.yaml as DVC's -S edit left it (`git checkout params.yaml` goes back to the default); the experiment in
        `dvc exp show`.
--dry-run prints the command without running it; --set key=value adds a key after the overlay's (a smaller band).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import subprocess
import sys
from pathlib import Path

from pipeline.config import Params
from pipeline.overlay import overlay_overrides
from stages._cli import main_for, make_parser

log = logging.getLogger("stages.band")
OVERLAY = Path("params/band.yaml")


def band(args: argparse.Namespace, params: Params) -> int:
    overrides, merged = overlay_overrides(args.overlay, args.params, args.set)
    command = ["dvc", "exp", "run", "--name", args.name, *(arg for o in overrides for arg in ("-S", o))]
    trials = len(merged.sweep.variants) * len(merged.sweep.seeds)
    log.info("band: %d seeds, %d trials: %s", len(merged.sweep.seeds), trials, shlex.join(command))
    if args.dry_run:
        print(shlex.join(command))
        return 0
    return subprocess.run(command, check=False).returncode


parser = make_parser(__doc__)
parser.add_argument("--overlay", type=Path, default=OVERLAY, help="the keys to set (default: %(default)s)")
parser.add_argument("--name", default="band", help="the DVC experiment's name (default: %(default)s)")
parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a key after the overlay's")
parser.add_argument("--dry-run", action="store_true", help="print the dvc command, run nothing")
main = main_for(band, parser)

if __name__ == "__main__":
    sys.exit(main())
