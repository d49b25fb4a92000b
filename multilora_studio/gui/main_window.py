"""The main window: a sidebar of views (Library, Compare, Evaluate, Arena, Runs, Monitor, Server,
Settings)."""

from __future__ import annotations

import logging

from PySide6.QtCore import QTimer
from PySide6.QtGui import QCloseEvent, QKeySequence, QMoveEvent, QResizeEvent, QShortcut
from PySide6.QtWidgets import QApplication, QHBoxLayout, QListWidget, QMainWindow, QStackedWidget, QWidget

from multilora_studio.adapters.registry import Registry
from multilora_studio.deploy.combined_metrics import combine_metrics
from multilora_studio.gui.arena_view import ArenaView
from multilora_studio.gui.base_states import base_states
from multilora_studio.gui.compare_view import CompareView
from multilora_studio.gui.engine_host import READY, EngineHost
from multilora_studio.gui.evaluate_view import EvaluateView
from multilora_studio.gui.library_view import LibraryView
from multilora_studio.gui.monitor_view import MonitorView
from multilora_studio.gui.preferences import EngineChoice, Preferences
from multilora_studio.gui.pull_dialog import PullDialog
from multilora_studio.gui.runs_view import RunsView
from multilora_studio.gui.server_control import ON, ServerControl
from multilora_studio.gui.server_view import ServerView
from multilora_studio.gui.settings_view import SettingsView
from multilora_studio.gui.status_bar import StudioStatusBar
from multilora_studio.gui.theme import set_theme
from multilora_studio.gui.widgets import on_any_edit

log = logging.getLogger(__name__)

METRICS_INTERVAL_MS = 200  # 5 Hz
AUTOSAVE_MS = 1000  # window state, prompt and choices are saved this long after the last change
PAGES = ("Library", "Compare", "Evaluate", "Arena", "Runs", "Monitor", "Server", "Settings")
DEFAULT_SIZE = (1280, 820)  # the window's width and height until a person resizes it


class MainWindow(QMainWindow):
    """Owns the engine host and the server control; views only read them and ask for work."""

    def __init__(
        self, prefs: Preferences, registry: Registry, start_engine: bool = True, demo_adapters: bool = True
    ) -> None:
        super().__init__()
        self.autosave = QTimer(self)  # started by every change worth remembering; saves when it fires
        self.autosave.setSingleShot(True)
        self.autosave.setInterval(AUTOSAVE_MS)
        self.setWindowTitle("MultiLoRA Studio")
        self.prefs = prefs
        self.host = EngineHost(registry, self, demo_adapters=demo_adapters)
        self.control = ServerControl(self)
        self.library = LibraryView(self.host)
        self.compare = CompareView(self.host)
        self.evaluate = EvaluateView(self.host)
        self.arena = ArenaView(self.host)
        self.runs = RunsView(self.host)
        self.monitor = MonitorView(self.host, self.control.usage, self.prefs)
        self.server = ServerView(self.host, self.control)
        self.settings = SettingsView(self.host, prefs)
        self.pull_dialog: PullDialog | None = None
        self._serve_after_restart = False
        self._lay_out()
        self.status = StudioStatusBar(self.host, self.control)
        self.setStatusBar(self.status)
        self.library.pullRequested.connect(self.open_pull_dialog)
        self.runs.compareRequested.connect(self.open_compare)
        self.settings.applied.connect(self.restart_engine)
        self.monitor.advice.applyRequested.connect(self.apply_advice)
        self.host.ready.connect(self._engine_ready)
        self.metrics_timer = QTimer(self)
        self.metrics_timer.setInterval(METRICS_INTERVAL_MS)
        self.metrics_timer.timeout.connect(self.poll_metrics)
        self.metrics_timer.start()
        self._shortcuts()
        self._restore()
        self.autosave.timeout.connect(self.save_state)
        saved = self.compare.saved_widgets() + self.evaluate.saved_widgets() + self.server.saved_widgets()
        on_any_edit(self.autosave.start, saved)
        self.sidebar.currentRowChanged.connect(lambda *_: self.autosave.start())
        if start_engine:
            self.host.start(prefs.engine_choice())

    def _lay_out(self) -> None:
        """The sidebar of views beside the view shown."""
        self.sidebar = QListWidget()
        self.sidebar.addItems(list(PAGES))
        self.sidebar.setFixedWidth(140)
        self.sidebar.setObjectName("sidebar")
        self.sidebar.setStyleSheet(
            "#sidebar { font-size: 11pt; border: none; background: transparent; outline: 0; }"
            "#sidebar::item { padding: 9px 10px; border-radius: 6px; }"
            "#sidebar::item:selected { background: palette(highlight); color: palette(highlighted-text); }"
        )
        self.stack = QStackedWidget()
        for view in (
            self.library,
            self.compare,
            self.evaluate,
            self.arena,
            self.runs,
            self.monitor,
            self.server,
            self.settings,
        ):
            self.stack.addWidget(view)
        self.sidebar.currentRowChanged.connect(self.stack.setCurrentIndex)
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.sidebar)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)

    def show_page(self, name: str) -> None:
        self.sidebar.setCurrentRow(PAGES.index(name))

    @property
    def page(self) -> str:
        return PAGES[self.stack.currentIndex()]

    def poll_metrics(self) -> None:
        """Read each loaded base's latest snapshot (no call into the workers) and hand them to
        the views: the Monitor's counters sum the loaded bases, the status bar shows the first."""
        pool = self.host.pool
        bases = base_states(pool, self.host.load_progress) if pool is not None else []
        loaded = [base.metrics for base in bases if base.metrics is not None]
        first = bases[0].metrics if bases else None
        self.monitor.update_metrics(combine_metrics(loaded) if len(bases) > 1 and loaded else first, bases)
        self.library.update_metrics(bases)
        self.status.refresh(first)

    def open_compare(self, columns: list[str]) -> None:
        """Compare with exactly ``columns`` ticked (the Runs view's best, latest and base)."""
        self.compare.pick_base(None)
        self.compare.set_checked(columns)
        self.show_page("Compare")

    def apply_advice(self, max_loras: int, max_cpu_loras: int) -> None:
        """The Monitor's advice into Settings, applied (the engine restarts with it)."""
        self.settings.max_loras.setValue(max_loras)
        self.settings.max_cpu_loras.setValue(max_cpu_loras)
        self.settings.apply()

    def restart_engine(self, choice: EngineChoice) -> None:
        """Restart with new settings; a compare run, an evaluation and a pull stop, a running
        server restarts on the new engine."""
        self.compare.stop()
        self.evaluate.stop()
        self.arena.stop()
        if self.pull_dialog is not None:
            self.pull_dialog.cancel()
        self._serve_after_restart = self.control.state == ON
        self.control.stop()
        self.host.start(choice)

    def open_pull_dialog(self) -> None:
        """The pull dialog, on the base the Library's base filter shows (else the first)."""
        if self.pull_dialog is None:
            self.pull_dialog = PullDialog(self.host, self)
            self.pull_dialog.pulled.connect(lambda name: self.host.reload_adapters())
        self.pull_dialog.show_bases(self.library.filtered_base())
        self.pull_dialog.show()
        self.pull_dialog.raise_()

    def _engine_ready(self) -> None:
        if self.host.choice is not None:
            self.prefs.set_engine_choice(self.host.choice)  # saved only once they worked
        if self._serve_after_restart and self.host.state == READY:
            self._serve_after_restart = False
            self.server.start()

    def _shortcuts(self) -> None:
        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(keys), self, self._run_shortcut)
        QShortcut(QKeySequence("Escape"), self, self.compare.stop)
        for index, name in enumerate(PAGES):
            QShortcut(QKeySequence(f"Ctrl+{index + 1}"), self, lambda n=name: self.show_page(n))

    def _run_shortcut(self) -> None:
        self.show_page("Compare")
        self.compare.start()

    def _restore(self) -> None:
        geometry = self.prefs.geometry("window/geometry")
        if geometry is None or not self.restoreGeometry(geometry):
            self.resize(*DEFAULT_SIZE)
        page = self.prefs.get("window/page", "Compare")
        self.show_page(page if page in PAGES else "Compare")
        self.compare.restore_state(self.prefs)
        self.evaluate.restore_state(self.prefs)
        self.server.restore_state(self.prefs)
        app = QApplication.instance()
        if isinstance(app, QApplication):
            set_theme(app, self.prefs.get("window/theme", "system"))

    def save_state(self) -> None:
        self.prefs.set("window/geometry", self.saveGeometry())
        self.prefs.set("window/page", self.page)
        self.compare.save_state(self.prefs)
        self.evaluate.save_state(self.prefs)
        self.server.save_state(self.prefs)
        self.prefs.sync()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.autosave.start()

    def moveEvent(self, event: QMoveEvent) -> None:
        super().moveEvent(event)
        self.autosave.start()

    def closeEvent(self, event: QCloseEvent) -> None:
        self.autosave.stop()
        self.save_state()
        self.metrics_timer.stop()
        if self.pull_dialog is not None:
            self.pull_dialog.cancel()
        self.compare.stop()
        self.evaluate.stop()
        self.arena.stop()
        self.control.shutdown()
        self.host.shutdown()
        super().closeEvent(event)
