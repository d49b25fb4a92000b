"""Session fixtures: an isolated user data directory, the tiny model and its adapters."""

from __future__ import annotations

import os
import signal

from tests.cores import worker_thread_pools

# Triton reads TRITON_INTERPRET when a kernel is defined, so it is set here, before any test
# module imports the kernels; a GPU machine runs the same tests natively with TRITON_INTERPRET=0.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Each pytest-xdist worker, and every process a test starts, gets its share of the cores for
# OpenMP's (torch's) and Numba's thread pools, set before torch is imported: two workers with a
# pool of every core each spin at each other's barriers (docs/dev/testing.md, "Two worker processes").
os.environ.update(worker_thread_pools())
from pathlib import Path

import pytest

from tests.fixtures import FAMILY_VARIANTS, TINY_ADAPTERS, build_adapter, build_tiny_model, extract_tokenizer

pytest_plugins = ["tests.server_fixtures", "tests.adapter_fixtures", "tests.token_table_fixtures"]


def pytest_configure(config: pytest.Config) -> None:
    # An exception that ends any thread during a test fails that test instead of printing a
    # warning (tests/threads.py hands a helper thread's failure to the test thread itself).
    config.addinivalue_line("filterwarnings", "error::pytest.PytestUnhandledThreadExceptionWarning")
    # Tests stop `serve` processes with Ctrl+C (SIGINT). A run started with SIGINT ignored (a
    # background job of a shell without job control) would hand that to every child, whose
    # Python then never raises KeyboardInterrupt: take SIGINT back so children start with it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with slow tests first, the slowest (``slow(seconds=N)``: about N seconds on two
    cores; 60 when not given) first of all: pytest-xdist hands out files in this order
    (``--dist loadfile``), so the long ones start at once and the workers end together."""
    seconds: dict[Path, float] = {}
    for item in items:
        for mark in item.iter_markers("slow"):
            seconds[item.path] = max(seconds.get(item.path, 0.0), mark.kwargs.get("seconds", 60.0))
    items.sort(key=lambda item: -seconds.get(item.path, 0.0))  # stable: each file keeps its order


@pytest.fixture(scope="session", autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every test session gets its own user data directory.

    The demo adapters are not offered at start-up (``MULTILORA_STUDIO_NO_DEMO_ADAPTERS``),
    so every test sees only the library it builds; the first-start tests clear the variable.
    """
    home = tmp_path_factory.mktemp("studio-home")
    os.environ["MULTILORA_STUDIO_HOME"] = str(home)
    os.environ["MULTILORA_STUDIO_NO_DEMO_ADAPTERS"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # no test (nor a window it starts) reaches the user's keyring; the key-store tests set their own
    os.environ["PYTHON_KEYRING_BACKEND"] = "keyring.backends.fail.Keyring"
    return home


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's tokenizer (``$MULTILORA_TEST_TOKENIZER_DIR`` where the GGUF is absent)."""
    given = os.environ.get("MULTILORA_TEST_TOKENIZER_DIR")
    if given:
        return Path(given)
    from multilora_studio.default_model import gguf_path

    return extract_tokenizer(gguf_path(), tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def engine_device() -> str:
    """Device the engine tests run on: cpu in CI, ``$MULTILORA_TEST_DEVICE`` (e.g. cuda) on a GPU host."""
    return os.environ.get("MULTILORA_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """Random-weight Llama model (hidden 64, 3 layers, GQA 4/2) with the default tokenizer."""
    return build_tiny_model(tokenizer_dir, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_adapters(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    """PEFT adapters for the tiny model: ranks 4..32 over different target modules."""
    root = tmp_path_factory.mktemp("tiny-adapters")
    return {spec.name: build_adapter(tiny_model_dir, spec, root / spec.name) for spec in TINY_ADAPTERS}


@pytest.fixture(scope="session")
def default_model():
    """The embedded default model, converted once per test session.

    A GPU host without the model's package skips its tests, saying so; the
    test extras install it everywhere else (CI runs them).
    """
    from multilora_studio.default_model import DefaultModelMissing, ensure_default_model

    if os.environ.get("MULTILORA_TEST_DEVICE") == "cuda":
        try:
            return ensure_default_model()
        except DefaultModelMissing as missing:
            pytest.skip(f"not installed on this GPU host: {missing}")
    return ensure_default_model()


class TinyFamilyModels:
    """``FAMILY_VARIANTS`` name -> its tiny checkpoint folder, each built the first time it is asked for."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> None:
        self._factory = tmp_path_factory
        self._tokenizer_dir = tokenizer_dir
        self._built: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in self._built:
            self._built[name] = build_tiny_model(
                self._tokenizer_dir, self._factory.mktemp(f"tiny-{name}"), variant=FAMILY_VARIANTS[name]
            )
        return self._built[name]


@pytest.fixture(scope="session")
def tiny_family_models(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> TinyFamilyModels:
    """Tiny models of every ``FAMILY_VARIANTS`` entry (qwen2 with attention bias, mistral, qwen3,
    yarn and longrope RoPE, a tied Llama 3.2, a sharded tokenizer-less bf16 checkpoint)."""
    return TinyFamilyModels(tmp_path_factory, tokenizer_dir)


@pytest.fixture
def new_user_home(default_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A new user's empty data directory (the embedded model already converted), demo adapters on."""
    home = tmp_path / "new-user-home"
    home.mkdir()
    (home / "models").symlink_to(default_model.path.parent, target_is_directory=True)
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(home))
    monkeypatch.delenv("MULTILORA_STUDIO_NO_DEMO_ADAPTERS")
    return home
