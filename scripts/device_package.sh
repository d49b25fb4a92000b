#!/usr/bin/env bash
# Build .device_pkg/ (gitignored), what a GPU host is given: the embedded model's tokenizer and
# wheels the device lacks (pure Python, or built for its Python 3.12 on x86-64 Linux).
# Usage: scripts/device_package.sh [python]   (the project's virtual environment by default)
set -eu
PY=${1:-.venv/bin/python}
rm -rf .device_pkg && mkdir -p .device_pkg/whl
"$PY" - <<'PYEOF'
from pathlib import Path

from multilora_studio.default_model import gguf_path
from tests.fixtures import extract_tokenizer

extract_tokenizer(gguf_path(), Path(".device_pkg/tokenizer"))
PYEOF
# what the engine imports beyond torch/transformers/peft, and what the engine and server tests
# need, with their dependencies, at the versions this environment tests with
wanted=$("$PY" - <<'PYEOF'
import re
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement

# what the device has (torch's image with transformers and peft, and pytest)
ON_DEVICE = set("""torch triton transformers peft numpy safetensors tokenizers huggingface-hub jinja2
markupsafe pyyaml packaging filelock fsspec tqdm requests urllib3 idna certifi charset-normalizer regex
sympy networkx mpmath pytest pluggy iniconfig setuptools accelerate psutil typing-extensions
hf-xet""".split())
# what the engine imports beyond those, and what the engine and server tests need
WANTED = """platformdirs gguf openai fastapi starlette uvicorn httpx llguidance jsonschema
prometheus-client pytest-timeout pytest-xdist hypothesis compressed-tensors""".split()
closure: dict[str, str] = {}


def add(name: str) -> None:
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in closure or key in ON_DEVICE or key.startswith("nvidia-"):
        return
    try:
        found = distribution(key)
    except PackageNotFoundError:
        return  # an optional dependency this environment does not use
    closure[key] = found.version
    for line in found.requires or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": "", "python_version": "3.12"}):
            add(requirement.name)


for name in WANTED:
    add(name)
print(" ".join(f"{name}=={version}" for name, version in sorted(closure.items())))
PYEOF
)
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 -d .device_pkg/whl $wanted
# gemlite (pure Python over Triton, published as a source archive) for the low-bit GEMM comparison
"$PY" -m pip wheel -q --no-deps gemlite==0.6.0.post2 -w .device_pkg/whl
du -sh .device_pkg
