"""Start the desktop application: the QApplication, its theme and the main window."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from multilora_studio.adapters.registry import Registry
from multilora_studio.gui.binding_check import binding_problem
from multilora_studio.gui.main_window import MainWindow
from multilora_studio.gui.preferences import Preferences
from multilora_studio.gui.qt_platform import platform_problem
from multilora_studio.gui.theme import follow_os_theme
from multilora_studio.resources import resource_path

ORGANIZATION = "MultiLoRA Studio"
APPLICATION = "multilora-studio"


def application(argv: list[str] | None = None) -> QApplication:
    """The process's QApplication (created once), themed after the OS color scheme."""
    existing = QApplication.instance()
    if isinstance(existing, QApplication):
        return existing
    app = QApplication(argv or [sys.argv[0]])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("MultiLoRA Studio")
    app.setWindowIcon(QIcon(str(resource_path("icons", "multilora-studio.svg"))))
    follow_os_theme(app)
    return app


def checked_application() -> QApplication:
    """``application()`` after checking what would otherwise abort the process (RuntimeError naming the fix).

    Qt aborts with a generic message when its platform plugin's libraries are missing, and a Qt
    binding that loses references to None aborts the window within minutes.
    """
    problem = platform_problem()
    if problem is not None:
        raise RuntimeError(problem)
    app = application()
    problem = binding_problem()
    if problem is not None:
        raise RuntimeError(problem)
    return app


def preferences(settings_file: Path | None) -> Preferences:
    if settings_file is None:
        return Preferences(QSettings())
    return Preferences(QSettings(str(settings_file), QSettings.Format.IniFormat))


def run(settings_file: Path | None = None, demo_adapters: bool = True) -> int:
    """Open the window and run until it is closed (``demo_adapters``: offer them at engine starts)."""
    app = checked_application()
    window = MainWindow(preferences(settings_file), Registry(), demo_adapters=demo_adapters)
    window.show()
    return app.exec()
