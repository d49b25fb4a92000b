"""Retake docs/screenshots/*.png from the real window on the embedded model with the demo adapters.

    apt-get install -y xvfb   # or any X display
    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/screenshots.py

The window starts on a new user's data directory (a temporary one; the embedded model is linked from
your data directory when it was converted there, else converted once), where the first start adds
the demo adapters. The script then works the window as a person would: it types a prompt, ticks the
base and the demo adapters and runs Compare (a follow-up turn, the token divergence, a strength
sweep), runs Evaluate on the demo prompt set, votes in the Arena (the base judging the last round),
follows a short LoRA training run in Runs (checkpoints written while the view watches), starts the
Server and sends it requests, lets the Monitor show that traffic live, starts two engine replicas;
each view at the window's default size. Every view the window lists gets ``<view>.png``;
``EXTRA`` names the others.
Takes about six minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"
EXTRA = (  # screenshots beyond one per view
    "compare-chat",  # after a follow-up turn: each column continues its own conversation
    "compare-divergence",  # the token view: each token tinted by how much the adapter changed it
    "compare-strength-sweep",  # one adapter at three strengths beside the base, in one batch
    "monitor-plots",  # the Monitor scrolled to its live plots of the last two minutes
    "monitor-replicas",  # two engine replicas, each with its own slots and CPU tier
)
PROMPT = "Why is the sky blue?"
FOLLOW_UP = "Say it in one sentence."
SWEEP_PROMPT = "What is a river?"
SWEPT = "demo-pirate"
BASE_NAME = "base"  # the arena's contender without an adapter
ARENA_PROMPTS = ("Why is the sky blue?", "What is a river?", "Describe a cat.")
MAX_TOKENS = 96  # long enough for each demo style to show (the sign-off comes at the end)
RUN_TEXTS = (  # what the Runs view's training run learns, and the references it is scored on
    ("The lighthouse keeper", " climbs the stairs at dusk and lights the lamp."),
    ("Gulls circle the harbour", " while the fishing boats come home."),
    ("The tide rises", " over the rocks and fills the pools."),
    ("A storm comes", " from the west and the waves grow tall."),
)
RUN_STEPS, RUN_SAVE_STEPS = 12, 3
ENGINE_S = 600.0  # bounds a hang only
RUN_S = 900.0

log = logging.getLogger("screenshots")


def view_file(view: str) -> str:
    """The screenshot of one of the window's views (``MainWindow``'s PAGES)."""
    return f"{view.lower()}.png"


def screenshot_files(views: tuple[str, ...]) -> list[str]:
    """Every file the script writes: one per view, then ``EXTRA``."""
    return [view_file(view) for view in views] + [f"{name}.png" for name in EXTRA]


def new_user_home(folder: Path) -> None:
    """A new user's data directory in ``folder`` (demo adapters offered at the first start), the
    embedded model linked from the user's own data directory when it was converted there."""
    from multilora_studio.default_model import DEFAULT_MODEL_NAME, read_marker
    from multilora_studio.demo import SKIP_ENV
    from multilora_studio.paths import HOME_ENV, data_dir_path

    converted = data_dir_path() / "models"
    if read_marker(converted / DEFAULT_MODEL_NAME) is not None:
        (folder / "models").symlink_to(converted, target_is_directory=True)
    os.environ[HOME_ENV] = str(folder)
    os.environ.pop(SKIP_ENV, None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["PYTHON_KEYRING_BACKEND"] = "keyring.backends.fail.Keyring"  # no keys of yours read


class Driver:
    """Works the real window: types into it, waits on the Qt event loop for its signals, saves
    what it shows."""

    def __init__(self, out: Path, settings: Path) -> None:
        from PySide6.QtCore import QSettings

        from multilora_studio.adapters.registry import Registry
        from multilora_studio.gui.app import checked_application
        from multilora_studio.gui.main_window import MainWindow
        from multilora_studio.gui.preferences import Preferences
        from multilora_studio.gui.theme import set_theme

        self.app = checked_application()
        set_theme(self.app, "light")
        self.out = out
        self.window = MainWindow(
            Preferences(QSettings(str(settings), QSettings.Format.IniFormat)), Registry()
        )
        self.ended = {"compare": 0, "divergence": 0, "evaluate": 0}  # runs ended, by kind
        self.saved: list[str] = []
        self.window.compare.runFinished.connect(lambda: self._ended("compare"))
        self.window.compare.divergenceFinished.connect(lambda: self._ended("divergence"))
        self.window.evaluate.runFinished.connect(lambda: self._ended("evaluate"))
        self.window.show()

    def _ended(self, kind: str) -> None:
        self.ended[kind] += 1

    def wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > end:
                raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
            self.app.processEvents()
            time.sleep(0.02)

    def settle(self, seconds: float = 0.5) -> None:
        end = time.monotonic() + seconds
        self.wait(lambda: time.monotonic() > end, seconds + 1, "the window to settle")

    def until_ended(self, kind: str, start: Callable[[], object], what: str) -> None:
        """Call ``start`` and wait until a run of ``kind`` ended."""
        before = self.ended[kind]
        if start() is False:
            raise RuntimeError(f"{what} did not start")
        self.wait(lambda: self.ended[kind] > before, RUN_S, what)

    def engine_ready(self) -> None:
        host = self.window.host
        self.wait(lambda: host.state in ("ready", "failed"), ENGINE_S, "the engine")
        if host.state != "ready":
            raise RuntimeError(f"the engine did not start: {host.error}")

    def type_into(self, widget, text: str) -> None:
        from PySide6.QtTest import QTest

        widget.clear()
        QTest.keyClicks(widget, text)

    def save(self, name: str) -> None:
        self.settle()
        path = self.out / name
        if not self.window.grab().save(str(path)):
            raise OSError(f"could not write {path}")
        self.saved.append(name)
        log.info("wrote %s", path)


def library_view(driver: Driver, demo: list[str]) -> None:
    library = driver.window.library
    driver.wait(lambda: sorted(library.names()) == demo, 60, "the demo adapters in the Library")
    driver.window.show_page("Library")
    library.select(SWEPT)
    driver.save("library.png")


def compare_runs(driver: Driver, demo: list[str]) -> None:
    from multilora_studio.gui.compare_column import MARKDOWN, TOKENS

    compare = driver.window.compare
    driver.window.show_page("Compare")
    compare.new_chat()
    driver.type_into(compare.prompt, PROMPT)
    compare.set_checked(["base", *demo])
    compare.max_tokens.setValue(MAX_TOKENS)
    compare.temperature.setValue(0.0)
    compare_run(driver, compare.start, "the Compare run")
    driver.save("compare.png")

    driver.type_into(compare.prompt, FOLLOW_UP)
    compare_run(driver, compare.follow_up, "the follow-up turn")
    driver.save("compare-chat.png")

    divergence = lambda: compare.view_mode.setCurrentIndex(compare.view_mode.findData(TOKENS))  # noqa: E731
    driver.until_ended("divergence", divergence, "the token divergence")
    driver.save("compare-divergence.png")
    compare.view_mode.setCurrentIndex(compare.view_mode.findData(MARKDOWN))

    compare.new_chat()
    driver.type_into(compare.prompt, SWEEP_PROMPT)
    compare.sweep_strength(SWEPT)
    compare_run(driver, compare.start, "the strength sweep")
    driver.save("compare-strength-sweep.png")


def compare_run(driver: Driver, start: Callable[[], bool], what: str) -> None:
    """Start a Compare run and wait until every column ended, with nothing in the banner."""
    driver.until_ended("compare", start, what)
    if driver.window.compare.banner.text:
        raise RuntimeError(f"{what}: {driver.window.compare.banner.text}")


def evaluate_demo_set(driver: Driver, runs: Path) -> None:
    view = driver.window.evaluate
    driver.window.show_page("Evaluate")
    view.results_dir = runs
    view.path.clear()
    view.prompt_set.demo_button.click()
    view.max_tokens.setValue(MAX_TOKENS)
    driver.until_ended("evaluate", view.start, "the evaluation")
    if view.results is None:
        raise RuntimeError(f"the evaluation failed: {view.banner.text}")
    view.matrix.selectRow(0)
    driver.save("evaluate.png")


def arena_votes(driver: Driver, demo: list[str]) -> None:
    """A few blind votes between the base and the demo adapters; the last one's names shown."""
    view = driver.window.arena
    driver.window.show_page("Arena")
    view.setup.tick([BASE_NAME, *demo])
    view.setup.prompts.setPlainText("\n".join(ARENA_PROMPTS))
    view.setup.max_tokens.setValue(MAX_TOKENS // 2)
    if not view.start():
        raise RuntimeError(f"the arena did not start: {view.banner.text}")
    session = view.session
    verdicts = ("a", "b", "tie", "a", "b")
    for index, verdict in enumerate(verdicts):
        if index:
            view.next_round()  # shown at once, or as soon as it is ready
        driver.wait(lambda: session is not None and session.current is not None, RUN_S, "a round")
        if index == len(verdicts) - 1:  # the base judges the last round; its verdict shows after the vote
            view.judge_pick.setCurrentText(BASE_NAME)
            view.ask_judge()
            driver.wait(lambda: session is not None and session.judge_vote is not None, RUN_S, "the judge")
        view.vote(verdict)
    driver.settle()
    driver.save("arena.png")


def train_run(base: Path, out: Path) -> None:
    """A LoRA trained on ``RUN_TEXTS``, saved as a Trainer saves it: checkpoint-N/ with the adapter
    and trainer_state.json every ``RUN_SAVE_STEPS`` steps."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32),
        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    batch = tokenizer([a + b for a, b in RUN_TEXTS], return_tensors="pt", padding=True)
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    history: list[dict] = []
    for step in range(1, RUN_STEPS + 1):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        history.append({"step": step, "loss": loss.item()})
        if step % RUN_SAVE_STEPS == 0:
            folder = out / f"checkpoint-{step}"
            model.save_pretrained(str(folder), safe_serialization=True)
            state = {"global_step": step, "log_history": history}
            (folder / "trainer_state.json").write_text(json.dumps(state))


def runs_view(driver: Driver, scratch: Path) -> None:
    """A training run followed while it writes its checkpoints: scores, losses, the best."""
    from multilora_studio.default_model import ensure_default_model

    view = driver.window.runs
    driver.window.show_page("Runs")
    view.follow.timer.setInterval(500)
    prompts = scratch / "lighthouse.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": a, "reference": b}) + "\n" for a, b in RUN_TEXTS))
    out = scratch / "lighthouse-lora"
    out.mkdir()
    trainer = threading.Thread(target=train_run, args=(ensure_default_model().path, out), daemon=True)
    trainer.start()
    driver.type_into(view.watch_form.folder, str(out))
    driver.type_into(view.watch_form.prompts, str(prompts))
    if view.watch() is None:
        raise RuntimeError(f"the run was not watched: {view.banner.text}")
    saves = RUN_STEPS // RUN_SAVE_STEPS
    registry = driver.window.host.registry

    def caught_up() -> bool:
        checkpoints = registry.checkpoints(out.name)
        scored = len(checkpoints) == saves and all(c.scores is not None for c in checkpoints)
        return not trainer.is_alive() and scored and view.table.rowCount() == saves and not view.reading

    driver.wait(caught_up, RUN_S, "the run's checkpoints")
    driver.save("runs.png")


def serve_requests(driver: Driver, demo: list[str]) -> None:
    window, view = driver.window, driver.window.server
    window.show_page("Server")
    view.port.setValue(0)  # any free port
    view.toggle.click()
    driver.wait(lambda: window.control.state == "on", ENGINE_S, "the server")
    url = view.url.text()
    models = [window.host.engine.model_name, *demo, "demo-unknown"]  # the last: a 404, never the base
    sent = threading.Thread(target=lambda: [chat(url, model) for model in models], daemon=True)
    sent.start()
    driver.wait(lambda: not sent.is_alive(), RUN_S, "the requests")
    driver.wait(lambda: len(view.log_rows()) >= len(models), 30, "the request log")
    driver.save("server.png")


def chat(url: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 48}
    request = urllib.request.Request(
        f"{url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=RUN_S) as reply:
            reply.read()
    except urllib.error.HTTPError as error:  # the unknown model's 404, shown in the log
        log.info("%s: HTTP %s", model, error.code)


def monitor_live(driver: Driver) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QScrollArea

    monitor = driver.window.monitor
    driver.window.show_page("Monitor")
    driver.settle(3.0)  # a few metric ticks
    driver.save("monitor.png")
    (page,) = monitor.findChildren(QScrollArea, options=Qt.FindChildOption.FindDirectChildrenOnly)
    page.verticalScrollBar().setValue(page.verticalScrollBar().maximum())
    driver.save("monitor-plots.png")
    page.verticalScrollBar().setValue(0)


def settings_and_replicas(driver: Driver, demo: list[str]) -> None:
    window = driver.window
    window.show_page("Settings")
    driver.save("settings.png")
    window.settings.devices.setText("cpu,cpu")
    if not window.settings.apply():
        raise RuntimeError(f"two replicas refused: {window.settings.banner.text}")
    driver.settle()
    driver.engine_ready()
    compare = window.compare
    window.show_page("Compare")
    compare.new_chat()
    compare.set_checked(["base", *demo])
    compare.max_tokens.setValue(24)
    driver.type_into(compare.prompt, PROMPT)
    compare_run(driver, compare.start, "the run on two replicas")
    window.show_page("Monitor")
    driver.wait(lambda: len(window.monitor.panels) == 2, 30, "the replicas' panels")
    driver.settle(3.0)
    driver.save("monitor-replicas.png")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder of the PNGs (default: {OUT})")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    scratch = Path(tempfile.mkdtemp(prefix="screenshots-"))
    try:
        (scratch / "home").mkdir()
        new_user_home(scratch / "home")
        from multilora_studio.demo import demo_adapter_dirs
        from multilora_studio.gui.main_window import PAGES

        args.out.mkdir(parents=True, exist_ok=True)
        driver = Driver(args.out, scratch / "settings.ini")
        demo = sorted(demo_adapter_dirs())
        driver.engine_ready()
        library_view(driver, demo)
        compare_runs(driver, demo)
        evaluate_demo_set(driver, scratch / "evaluations")
        arena_votes(driver, demo)
        runs_view(driver, scratch)
        serve_requests(driver, demo)
        monitor_live(driver)
        settings_and_replicas(driver, demo)
        driver.window.close()
        if sorted(driver.saved) != sorted(screenshot_files(PAGES)):
            raise RuntimeError(f"took {driver.saved}, not {screenshot_files(PAGES)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
