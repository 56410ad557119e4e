#!/usr/bin/env bash
# The GPU evidence on a lent GPU machine as it is (its own Python and torch, no network): installs the wheels carried
# in .whl/ (`make gpu-wheels`, done beforehand where pip works) into a private folder put first on the path, then runs
# `python -m benchmarks.gpu_evidence OUTDIR [options]` (its --help says what it measures). PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: benchmarks/gpu_evidence.sh OUTDIR [options of python -m benchmarks.gpu_evidence]" >&2
    exit 2
fi
python=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    site=$(mktemp -d)
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
PYTHONUNBUFFERED=1 exec "$python" -m benchmarks.gpu_evidence "$@"
