"""How long the MLflow UI takes to show a sweep of many runs, measured in headless Chromium.

    python -m benchmarks.mlflow_ui_load [--runs 1000] [--baseline-runs 10] [--epochs 30] [--repeats 3] [--lab-store DIR]

A lab's sweep puts hundreds to thousands of trial runs in one experiment; the page researchers open first is its runs
table. This writes ``--runs`` trial-like runs under one parent (a trial's params, tags and per-epoch metrics: 7
training metrics and 3 locality metrics per layer of a 6-layer model, ``--epochs`` points each, in MLflow's own
``log_batch`` requests) into a fresh ``mlflow server`` on sqlite, or into the running PostgreSQL + bucket store that
``examples/lab_store.sh`` started (``--lab-store``). Then it opens two pages in headless Chromium, each in a fresh
browser profile (``cold``: the UI's code is fetched too) and once more in the same browser (``warm``):

- ``runs``: the experiment's plain runs page (the trials nested under their parent's row);
- ``sweep``: the page ``make ui`` prints, the sweep's runs filtered on the parent and sorted by ``test_acc`` with its
  column (``pipeline.sweep.tracking.ui``'s shared view).

It does the same for a small sweep (``--baseline-runs``), alternating the two: a page's time on a loaded machine
says little alone, its growth from 10 runs to 1000 measured under the same load says whether the store scales.
It times each from navigation to the moment the page shows the run that belongs on top (the parent's row, or the
best ``test_acc``), through Chromium's DevTools protocol, and prints the median of ``--repeats`` loads per page. The
bar a lab's store must clear: the runs page in under 2 s with 1000 runs in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from benchmarks.common import bad_input_is_a_usage_error, make_parser, positive_int, progress, text_table
from pipeline.sweep.tracking.server import MlflowServer, free_port

CHROMIUM = Path("/usr/bin/chromium")
LAYERS = 6
TRAINING_METRICS = ("train_loss", "train_acc", "test_loss", "test_acc", "lr", "epoch_time_s", "images_per_s")
LOCALITY_METRICS = ("attention_distance", "attention_peak", "attention_entropy")  # per layer, as a trial logs them
VARIANTS = ("sa_quadratic_9", "sa_quadratic_16", "sa_gaussian_9", "sa_learned_9", "resnet18")
BATCH = 1000  # MLflow's log_batch limit on metrics per request
PAGES = ("runs", "sweep")
SHOWN_WITHIN_S = 60.0  # a page that has not shown its top run by then failed


def final_test_acc(run: int) -> float:
    """A value per run, distinct for up to 100,003 runs (a prime modulus): the best run is unambiguous."""
    return run * 7919 % 100_003 / 100_003


def trial_metrics(run: int, epochs: int) -> list:
    """A trial's per-epoch metric points, with values that differ from run to run (so sorting means something)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    keys = [*TRAINING_METRICS, *(f"{name}.layer{layer}" for layer in range(LAYERS) for name in LOCALITY_METRICS)]
    points = []
    for epoch, key in itertools.product(range(epochs), keys):
        value = final_test_acc(run) * (epoch + 1) / epochs
        points.append(Metric(key, value, now + epoch, epoch))
    return points


def populate(uri: str, runs: int, epochs: int) -> tuple[str, str, str, str]:
    """``runs`` trial runs under a new parent in a new experiment; its id, the parent's id, and the names of the run
    on top of each page: the parent on the plain runs page (the UI nests the trials under it), the best test_acc on
    the sweep's."""
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment_id = client.create_experiment(f"ui-load-{runs}-{int(time.time())}")
    client.set_experiment_tag(experiment_id, "mlflow.experimentKind", "custom_model_development")
    parent_name = f"sweep-of-{runs}"
    parent = client.create_run(experiment_id, run_name=parent_name).info.run_id
    started = int(time.time() * 1000)  # run k starts k seconds later: the newest is the last, whatever wrote first

    def write(run: int) -> str:
        variant = VARIANTS[run % len(VARIANTS)]
        name = f"{variant}.seed{run}"
        tags = {"mlflow.parentRunId": parent, "variant": variant, "seed": str(run), "trial_identity": f"{run:016x}"}
        created = client.create_run(experiment_id, start_time=started + 1000 * run, run_name=name)
        run_id = created.info.run_id
        params = [Param(f"model.{key}", str(run % 7)) for key in ("hidden", "layers", "heads", "ffn", "encoding")]
        params += [Param(f"train.{key}", str(run % 5)) for key in ("epochs", "lr", "batch_size", "weight_decay")]
        metrics = trial_metrics(run, epochs)
        client.log_batch(run_id, params=params, tags=[RunTag(k, v) for k, v in tags.items()])
        for start in range(0, len(metrics), BATCH):
            client.log_batch(run_id, metrics=metrics[start : start + BATCH])
        client.set_terminated(run_id)
        return name

    with ThreadPoolExecutor(max_workers=8) as pool:
        written = []
        for done, result in enumerate(pool.map(write, range(runs)), start=1):
            written.append(result)
            if done % 100 == 0:
                progress(f"mlflow_ui_load: {done}/{runs} runs written")
    client.set_terminated(parent)
    return experiment_id, parent, parent_name, written[max(range(runs), key=final_test_acc)]


class DevTools:
    """The few DevTools-protocol calls a load time needs, over the page's websocket."""

    def __init__(self, socket: object) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: object) -> dict:
        call_id = next(self.ids)
        await self.socket.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = await self.socket.receive_json()
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]


async def _open_browser(profile: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    browser = subprocess.Popen(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--remote-debugging-port={port}",
            "--window-size=1600,1000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its renderer and helper processes go with it (os.killpg)
    )
    return browser, port


async def page_load_times(url: str, top: str) -> tuple[float, float]:
    """Seconds from navigating to ``url`` until the page's text shows ``top``: in a fresh profile, then again in the
    same browser (its cache warm)."""
    import aiohttp

    # Chromium's helpers may still write to the profile for a moment after it is stopped: removal errors are ignored.
    with tempfile.TemporaryDirectory(prefix="ui-load-profile-", ignore_cleanup_errors=True) as profile:
        browser, port = await _open_browser(Path(profile))
        try:
            async with aiohttp.ClientSession() as http:
                targets = await _targets(http, port)
                page = next(target for target in targets if target["type"] == "page")
                async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as socket:
                    tools = DevTools(socket)
                    cold = await _time_navigation(tools, url, top)
                    await tools.call("Page.navigate", url="about:blank")
                    warm = await _time_navigation(tools, url, top)
        finally:
            with contextlib.suppress(ProcessLookupError):  # it may have gone already
                os.killpg(browser.pid, signal.SIGTERM)
            browser.wait(timeout=30)
    return cold, warm


async def _targets(http: object, port: int) -> list[dict]:
    deadline = time.monotonic() + 30
    while True:
        try:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as answer:
                return await answer.json()
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Chromium's DevTools did not answer on port {port} within 30 s") from None
            await asyncio.sleep(0.1)


async def _time_navigation(tools: DevTools, url: str, top: str) -> float:
    shown = f"!!document.body && document.body.innerText.includes({json.dumps(top)})"
    started = time.perf_counter()
    await tools.call("Page.navigate", url=url)
    while time.perf_counter() - started < SHOWN_WITHIN_S:
        answer = await tools.call("Runtime.evaluate", expression=shown, returnByValue=True)
        if answer["result"].get("value"):
            return time.perf_counter() - started
        await asyncio.sleep(0.02)
    text = await tools.call("Runtime.evaluate", expression="document.body.innerText", returnByValue=True)
    shows = text["result"].get("value", "")[:600]
    raise RuntimeError(f"{url} did not show {top!r} within {SHOWN_WITHIN_S:.0f} s; it shows:\n{shows}")


def sweep_page(uri: str, experiment_id: str, parent: str) -> str:
    """The page ``make ui`` prints for a sweep this large: its shared view (filter on the parent, test_acc first)."""
    from mlflow.tracking import MlflowClient

    from pipeline.sweep.tracking.ui import save_shared_view, shared_view_url

    key = save_shared_view(MlflowClient(uri), experiment_id, [], parent)
    return shared_view_url(uri, experiment_id, key)


def parse_args(argv: list[str] | None = None) -> object:
    parser = make_parser("mlflow_ui_load", __doc__.split("\n\n")[0], epilog="See the module docstring.")
    parser.add_argument("--runs", type=positive_int, default=1000, help="trial runs (default: %(default)s)")
    parser.add_argument("--epochs", type=positive_int, default=30, help="points per metric (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="loads per page (default: %(default)s)")
    parser.add_argument(
        "--baseline-runs",
        type=positive_int,
        default=10,
        help="a small sweep timed alternately with the large one, so that the machine's load cancels out of the "
        "comparison (default: %(default)s)",
    )
    parser.add_argument(
        "--lab-store", type=Path, metavar="DIR", help="write into the store 'examples/lab_store.sh start DIR' started"
    )
    args = parser.parse_args(argv)
    with bad_input_is_a_usage_error(parser):
        if not CHROMIUM.is_file() and not shutil.which("chromium"):
            raise ValueError(f"headless Chromium not found at {CHROMIUM} (apt-get install chromium)")
        if args.lab_store is not None and not (args.lab_store / "tracking_uri").is_file():
            store = f"--lab-store {args.lab_store}"
            raise ValueError(f"{store}: not a running store (start one with examples/lab_store.sh)")
    return args


def pages_of(uri: str, runs: int, epochs: int) -> dict[str, tuple[str, str]]:
    """A new sweep of ``runs`` runs; its two pages, each with the run that belongs on top."""
    experiment_id, parent, parent_row, best = populate(uri, runs, epochs)
    return {
        "runs": (f"{uri}/#/experiments/{experiment_id}/runs?workflowType=machine_learning", parent_row),
        "sweep": (sweep_page(uri, experiment_id, parent), best),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # not a "View run at" line per run
    with ExitStack() as stack:
        if args.lab_store:
            uri, store = (args.lab_store / "tracking_uri").read_text().strip(), "PostgreSQL + bucket (lab store)"
        else:
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ui-load-")))
            server = MlflowServer(home)
            server.start()
            stack.callback(server.stop)
            uri, store = server.uri, "mlflow server on sqlite"
        sizes = sorted({args.baseline_runs, args.runs})
        progress(f"mlflow_ui_load: writing sweeps of {sizes} runs x {args.epochs} epochs to {uri} ...")
        started = time.perf_counter()
        sweeps = {size: pages_of(uri, size, args.epochs) for size in sizes}
        written_s = time.perf_counter() - started
        loads: dict[tuple[int, str], list[tuple[float, float]]] = {key: [] for key in itertools.product(sizes, PAGES)}
        for repeat in range(args.repeats):  # the sizes alternate: the same load on the machine for both
            for size, page_name in itertools.product(sizes, PAGES):
                url, top = sweeps[size][page_name]
                loads[size, page_name].append(asyncio.run(page_load_times(url, top)))
            progress(f"mlflow_ui_load: round {repeat + 1}/{args.repeats} loaded")
    rows = []
    for (size, page_name), times in loads.items():
        cold, warm = statistics.median(c for c, _ in times), statistics.median(w for _, w in times)
        top = sweeps[size][page_name][1]
        rows.append(
            {"runs": str(size), "page": page_name, "cold s": f"{cold:.2f}", "warm s": f"{warm:.2f}", "shows first": top}
        )
    print(f"sweeps of {sizes} runs x {args.epochs} epochs, one experiment each, {store}; written in {written_s:.0f} s")
    print(text_table(rows, numeric={"runs", "cold s", "warm s"}))
    print(f"median of {args.repeats} loads, the sizes alternating; the time until the page shows the run on top")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
