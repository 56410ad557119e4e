"""Print the MLflow UI address of the last sweep: its trials' runs, in the model-training view, best test_acc first,
with the test_acc column.

Reads results/tune/manifest.json (the experiment and the trials' runs); without one (no sweep yet), the experiments
list. The columns travel as the UI's shared view, an experiment tag written here into the sweep's store; a store it
cannot write (no sqlite file here, a server that does not answer) gets the address without the column. A sweep
tracked on an MLflow server (tracking.uri: http://...) gets that server's address. `make ui PORT=5001` prints this
address and serves the project's store on that port.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.config import Params
from pipeline.sweep.tracking import Store
from pipeline.sweep.tracking import ui as addresses
from stages._cli import main_for, make_parser

MANIFEST = Path("results/tune/manifest.json")


def ui(args: argparse.Namespace, params: Params) -> int:
    base = f"http://{args.host}:{args.port}"
    if not args.manifest.is_file():
        print(f"MLflow UI: {addresses.experiments_url(base)} (no sweep yet: {args.manifest} is missing)")
        return 0
    manifest = json.loads(args.manifest.read_text())
    server = str(manifest.get("tracking_uri", ""))
    if server.startswith(("http://", "https://")):  # the sweep's runs are on that server, not in the local store
        base = server
    run_ids = [trial["run_id"] for trial in manifest.get("trials", []) if trial.get("run_id")]
    url = addresses.runs_url(base, manifest["experiment_id"], run_ids, manifest.get("parent_run_id"))
    store = Store(server)
    if server and store.reachable() and store.answers():
        try:
            key = store.share_view(manifest["experiment_id"], run_ids, manifest.get("parent_run_id"))
            url = addresses.shared_view_url(base, manifest["experiment_id"], key)
        except Exception as err:  # noqa: BLE001 - the address without the column still opens the sweep
            print(f"(the test_acc column not preset: {err})")
    print(f"MLflow UI, the sweep's {len(run_ids)} trial runs: {url}")
    return 0


parser = make_parser(__doc__)
parser.add_argument("--host", default="127.0.0.1", help="the server's host (default: %(default)s)")
parser.add_argument("--port", type=int, default=5000, help="the server's port (default: %(default)s)")
parser.add_argument("--manifest", type=Path, default=MANIFEST, help="the tune manifest (default: %(default)s)")
main = main_for(ui, parser)

if __name__ == "__main__":
    raise SystemExit(main())
