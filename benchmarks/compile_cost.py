"""Does ``train.compile`` pay on the CPU default? One whole trial per variant, eager and compiled, paired in one run.

Each side is one whole trial of the params file (all its ``train.epochs``, the params' model, data and schedule) run
through ``pipeline.trial.loop.run_trial`` on the CPU in a fresh Python process, single-threaded as a Ray trial with
one CPU runs (``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``). The process's CPU time counts everything the
trial costs: imports, data loading, compilation (Inductor compiles in the process, ``TORCHINDUCTOR_COMPILE_THREADS=1``,
so every C++ compiler it starts is a waited-for child and counted), training, evaluation, the per-epoch locality
measurements and checkpoints. Inductor's on-disk cache starts empty for every compiled trial (a private
``TORCHINDUCTOR_CACHE_DIR``), as on a new machine or for a new model; ``--warm-cache`` reuses one cache for the
compiled trials of a variant (a second compiled trial of the same model, e.g. another seed). The sides alternate
(eager, compiled, eager, compiled, ...) so that a change of machine load hits both. Nothing is asserted.

    python -m benchmarks.compile_cost                              # params.yaml, every sweep variant, 1 pair each
    python -m benchmarks.compile_cost --variants sa_quadratic_9 --epochs 5 --pairs 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import bad_input_is_a_usage_error, make_parser, positive_int, progress, text_table

NUMERIC = {"epochs", "CPU s", "wall s", "compile s", "epochs s", "test_acc", "compiled/eager CPU"}


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("compile_cost", __doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: %(default)s)")
    parser.add_argument("--variants", nargs="+", help="variants to time (default: the params' sweep.variants)")
    parser.add_argument("--epochs", type=positive_int, help="epochs per trial (default: the params' train.epochs)")
    parser.add_argument("--pairs", type=positive_int, default=1, help="eager/compiled pairs per variant (default: 1)")
    parser.add_argument("--warm-cache", action="store_true", help="share Inductor's cache between a variant's trials")
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "SIDE"), help=argparse.SUPPRESS)  # a child process
    return parser


def one_trial(params_path: Path, variant: str, compiled: bool, epochs: int | None) -> dict[str, float]:
    """The child: one whole trial on the CPU, one thread; returns its own figures (the parent adds the CPU time)."""
    import torch

    torch.set_num_threads(1)
    from pipeline.config import load_params
    from pipeline.data.sources import prepare_dataset
    from pipeline.trial import loop

    params = load_params(params_path)
    update = {"device": "cpu", "compile": compiled} | ({"epochs": epochs} if epochs else {})
    train_cfg = params.train.model_copy(update=update)
    compile_seconds = []
    real_compile = loop._compile

    def timed_compile(*args: object, **kwargs: object) -> float:
        compile_seconds.append(real_compile(*args, **kwargs))
        return compile_seconds[-1]

    epoch_seconds = []
    started = time.perf_counter()
    data = prepare_dataset(params.data, params_path.resolve().parent)
    loop._compile = timed_compile  # run_trial logs the compile time; the benchmark keeps it
    try:
        final = loop.run_trial(
            params.model_for(variant), train_cfg, data, lambda metrics, _: epoch_seconds.append(metrics["epoch_time_s"])
        )
    finally:
        loop._compile = real_compile
    return {
        "epochs": train_cfg.epochs,
        "trial_wall_s": time.perf_counter() - started,
        "compile_s": sum(compile_seconds),
        "epochs_s": sum(epoch_seconds),
        "test_acc": final["test_acc"],
    }


def run_side(args: argparse.Namespace, variant: str, side: str, cache_dir: str) -> dict[str, float]:
    """One trial in a fresh process; its CPU time (user + system, with the compilers it waited for) from rusage."""
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "TORCHINDUCTOR_CACHE_DIR": cache_dir,
    }
    command = [sys.executable, "-m", "benchmarks.compile_cost", "--params", str(args.params), "--one", variant, side]
    if args.epochs:
        command += ["--epochs", str(args.epochs)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} {side} trial failed:\n{done.stderr[-4000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return figures | {"cpu_s": cpu, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.one is not None:
        variant, side = args.one
        print(json.dumps(one_trial(args.params, variant, side == "compiled", args.epochs)))
        return 0
    from pipeline.config import load_params

    with bad_input_is_a_usage_error(parser):
        params = load_params(args.params)
    unknown = [name for name in args.variants or [] if name not in params.variants]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; defined in {args.params}: {sorted(params.variants)}")
    rows, totals = [], {"eager": 0.0, "compiled": 0.0}
    for variant in args.variants or params.sweep.variants:
        with tempfile.TemporaryDirectory(prefix="inductor-cache-") as shared_cache:
            cpu = {"eager": [], "compiled": []}
            for pair in range(args.pairs):
                for side in ("eager", "compiled"):
                    progress(f"{variant}: {side} trial (pair {pair + 1}/{args.pairs})")
                    with tempfile.TemporaryDirectory(prefix="inductor-cache-") as own_cache:
                        figures = run_side(args, variant, side, shared_cache if args.warm_cache else own_cache)
                    progress(f"  {side}: {json.dumps(figures)}")  # each trial's figures as soon as it ends
                    cpu[side].append(figures["cpu_s"])
                    totals[side] += figures["cpu_s"]
                    rows.append(
                        {
                            "model": variant,
                            "side": side,
                            "epochs": str(figures["epochs"]),
                            "CPU s": f"{figures['cpu_s']:.1f}",
                            "wall s": f"{figures['wall_s']:.1f}",
                            "compile s": f"{figures['compile_s']:.1f}" if side == "compiled" else "-",
                            "epochs s": f"{figures['epochs_s']:.1f}",
                            "test_acc": f"{figures['test_acc']:.3f}",
                            "compiled/eager CPU": (
                                f"{figures['cpu_s'] / cpu['eager'][-1]:.2f}" if side == "compiled" else ""
                            ),
                        }
                    )
    cache = "warm (shared per variant)" if args.warm_cache else "cold (empty per compiled trial)"
    print(f"{args.params}: one whole trial per row on the CPU, 1 thread; Inductor cache {cache}")
    print(text_table(rows, numeric=NUMERIC))
    ratio = totals["compiled"] / totals["eager"]
    print(f"all trials: eager {totals['eager']:.1f} CPU s, compiled {totals['compiled']:.1f} CPU s (ratio {ratio:.2f})")
    print("CPU s: the trial's whole process (imports, data, compilation, epochs, evaluation, checkpoints); compile s:")
    print("train.compile's warm-up (excluded from epochs s, the sum of the timed training passes).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
