"""``multilora-studio gui --smoke-test``: open the window, run one compare with the embedded model, exit.

Exit status 0 when every column of the run finished without an error; 1 otherwise
(engine failure, a column error, or no result in time). Prints what it saw.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, QTimer

from multilora_studio.adapters.registry import Registry
from multilora_studio.gui.app import application, checked_application
from multilora_studio.gui.latency import EventLoopProbe
from multilora_studio.gui.main_window import MainWindow
from multilora_studio.gui.preferences import EngineChoice, Preferences
from multilora_studio.gui.workflows.compare_inputs import DEFAULT_PROMPT

log = logging.getLogger(__name__)

SMOKE_PROMPT = DEFAULT_PROMPT  # the window's own prompt: the demo adapters are checked on it
SMOKE_TOKENS = 24


class SmokeTest(QObject):
    """Drives the window: wait for the engine, tick base + every served adapter, run, check, quit."""

    def __init__(self, window: MainWindow, screenshot: Path | None, timeout_s: float) -> None:
        super().__init__(window)
        self.window = window
        self.screenshot = screenshot
        self.exit_code = 1
        self.probe = EventLoopProbe(parent=self)
        window.host.ready.connect(self._run)
        window.host.failed.connect(lambda message: self._finish(f"engine failed to start: {message}"))
        window.compare.runFinished.connect(self._check)
        QTimer.singleShot(int(timeout_s * 1000), lambda: self._finish(f"no result within {timeout_s:g} s"))

    def _run(self) -> None:
        compare = self.window.compare
        self.window.show_page("Compare")
        compare.prompt.setPlainText(SMOKE_PROMPT)
        compare.raw.setChecked(False)
        compare.max_tokens.setValue(SMOKE_TOKENS)
        compare.temperature.setValue(0.0)
        compare.tick_all(True)
        self.probe.start()
        if not compare.start():
            self._finish(f"the compare did not start: {compare.banner.text}")

    def _check(self) -> None:
        self.probe.stop()
        compare = self.window.compare
        if compare.banner.text:
            self._finish(f"compare failed: {compare.banner.text}")
            return
        errors = [f"{c.name}: {c.error}" for c in compare.columns if c.error or c.finish_reason is None]
        for column in compare.columns:
            print(f"[{column.name}] {column.tokens} tokens, {column.finish_reason}: {column.text.strip()!r}")
        print(f"GUI event loop during the run: max stall {self.probe.max_ms:.1f} ms")
        if self.screenshot is not None:
            self.screenshot.parent.mkdir(parents=True, exist_ok=True)
            self.window.grab().save(str(self.screenshot))
            print(f"screenshot: {self.screenshot}")
        if errors or not compare.columns:
            self._finish("; ".join(errors) or "no columns")
            return
        self._finish(None)

    def _finish(self, problem: str | None) -> None:
        if problem is not None:
            print(f"smoke test failed: {problem}", file=sys.stderr)
            self.exit_code = 1
        else:
            print(f"smoke test passed: {len(self.window.compare.columns)} columns in one batched run")
            self.exit_code = 0
        self.window.close()
        application().exit(self.exit_code)


def run_smoke_test(
    screenshot: Path | None = None,
    timeout_s: float = 600.0,
    device: str = "auto",
    demo_adapters: bool = True,
    cpu_threads: int = 0,
) -> int:
    """See the module docstring; the user's settings are left untouched (a temporary INI file is used).
    ``cpu_threads``: the engine's CPU threads (0: automatic)."""
    app = checked_application()
    with tempfile.TemporaryDirectory(prefix="multilora-smoke-") as folder:
        prefs = Preferences(QSettings(str(Path(folder) / "settings.ini"), QSettings.Format.IniFormat))
        prefs.set_engine_choice(replace(EngineChoice(), device=device, cpu_threads=cpu_threads))
        window = MainWindow(prefs, Registry(), demo_adapters=demo_adapters)
        smoke = SmokeTest(window, screenshot, timeout_s)
        window.show()
        app.exec()
        return smoke.exit_code
