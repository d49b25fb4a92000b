#!/usr/bin/env bash
# Build .device_pkg/ (gitignored), what a GPU session carries: the embedded model's tokenizer and
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
# what the engine imports beyond torch/transformers/peft, and what the server tests need, at the
# versions this environment tests with
wanted=$("$PY" - <<'PYEOF'
from importlib.metadata import version

names = """platformdirs gguf openai fastapi starlette uvicorn httpx httpcore h11 anyio sniffio
jiter pydantic pydantic-core typing-inspection annotated-types""".split()
print(" ".join(f"{name}=={version(name)}" for name in names))
PYEOF
)
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .device_pkg/whl $wanted
du -sh .device_pkg
