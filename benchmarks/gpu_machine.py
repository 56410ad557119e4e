"""What a lent GPU machine has, and what ``benchmarks.gpu_evidence`` must carry to it as wheels.

The GPU machines (one H100 or H200) have their own Python 3.12 with torch 2.11 + CUDA, torchvision, numpy, pandas,
scikit-learn, matplotlib, PyYAML and pytest, but no Ray, MLflow, DVC or pydantic, and no network: ``make install``
cannot run there. The evidence command therefore imports only the trial side of the project (models, data, the trial
loop, measuring), which needs pydantic (the typed config) on top of the machine's packages. Those few pure-Python
and manylinux wheels travel with the working tree; ``make gpu-wheels`` downloads them for Python 3.12 into ``.whl/``
(git-ignored) at the versions ``requirements.lock`` pins.

``IMAGE_PACKAGES`` is the image's package list as read on a machine running it (2026-11-17); a test runs the evidence
command with every import of the project's own code outside ``IMAGE_PACKAGES``, ``CARRIED`` and the standard library
refused, so the command cannot come to need a package the machine lacks between two loans.

This module imports nothing outside the standard library: the Makefile asks it for the wheel specs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCK = REPO_ROOT / "requirements.lock"

# Distributions (as pip names them) that the evidence command needs and the image lacks: pydantic and its own needs.
# typing_extensions is on the image too, but pydantic needs a recent one: the pinned one goes first on the path.
CARRIED = ("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions")

# The image's Python packages (distribution names), as listed on a machine running it.
_IMAGE_PACKAGE_LIST = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
"""
IMAGE_PACKAGES = tuple(_IMAGE_PACKAGE_LIST.split())

# Where a distribution's import name is not its name with '-' as '_'.
_IMPORT_NAMES = {
    "absl-py": "absl",
    "opencv-python-headless": "cv2",
    "pillow": "PIL",
    "protobuf": "google",
    "py-cpuinfo": "cpuinfo",
    "python-dateutil": "dateutil",
    "pyyaml": "yaml",
    "scikit-image": "skimage",
    "scikit-learn": "sklearn",
    "nvidia-ml-py": "pynvml",
    "pytest": "_pytest",  # pytest's own package (``pytest`` is the other one)
}

# The project's own top-level packages: the checkout travels to the machine.
PROJECT_PACKAGES = ("pipeline", "benchmarks", "tests", "stages", "analysis")


def import_name(distribution: str) -> str:
    return _IMPORT_NAMES.get(distribution.lower(), distribution.replace("-", "_").lower())


def allowed_imports() -> frozenset[str]:
    """Top-level module names the project's code may import on the GPU machine."""
    names = {import_name(d) for d in (*IMAGE_PACKAGES, *CARRIED)} | {d.replace("-", "_") for d in IMAGE_PACKAGES}
    return frozenset(names | set(sys.stdlib_module_names) | set(PROJECT_PACKAGES) | {"pytest", "PIL"})


def wheel_specs(lock: Path = LOCK) -> list[str]:
    """``name==version`` of every carried distribution, as ``requirements.lock`` pins it."""
    pins = {}
    for line in lock.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if match:
            pins[_normalise(match[1])] = match[0]
    missing = [name for name in CARRIED if _normalise(name) not in pins]
    if missing:
        raise ValueError(f"{lock}: no pin for {missing}; run 'make lock'")
    return [pins[_normalise(name)] for name in CARRIED]


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


if __name__ == "__main__":  # ``make gpu-wheels``: the specs pip downloads
    print(" ".join(wheel_specs()))
