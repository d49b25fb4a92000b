"""A live theme switch reaches every widget and plot; window state is saved as it changes."""

from __future__ import annotations

from pyqtgraph import mkColor
from PySide6.QtCore import QSettings
from PySide6.QtGui import QColor, QPalette

from multilora_studio.gui.main_window import AUTOSAVE_MS
from multilora_studio.gui.theme import set_theme
from tests.gui.conftest import save_screenshot


def lightness(color: QColor) -> int:
    return color.lightness()


def brightest_pixel(widget, rect) -> int:
    image = widget.grab(rect).toImage()
    width, height = image.width(), image.height()
    return max(image.pixelColor(x, y).lightness() for x in range(width) for y in range(height))


def test_switching_to_dark_restyles_open_widgets_plots_and_indicators(qtbot, qapp, open_window):
    window = open_window(wait=False)
    window.show_page("Monitor")
    set_theme(qapp, "light")
    qtbot.wait(50)
    set_theme(qapp, "dark")
    qtbot.waitUntil(lambda: window.palette().color(QPalette.ColorRole.Window).lightness() < 60, timeout=2000)
    qtbot.wait(50)
    background = window.palette().color(QPalette.ColorRole.Window)
    for plot in window.monitor.plots:
        legend = plot.plotItem.legend
        if legend is None:
            continue
        for _sample, label in legend.items:  # legend text in the new foreground, not the old one
            assert lightness(mkColor(label.opts["color"])) - lightness(background) > 100
        assert lightness(plot.backgroundBrush().color()) < 60
    # the sidebar's style sheet names palette colors: its item text must follow the new palette
    sidebar = window.sidebar
    unselected = sidebar.item(0 if sidebar.currentRow() else 1)
    assert brightest_pixel(sidebar.viewport(), sidebar.visualItemRect(unselected)) > 180
    # a check box keeps a visible frame against the dark base
    box = window.compare.ignore_eos
    window.show_page("Compare")
    qtbot.wait(50)
    image = box.grab().toImage()
    frame = max(image.pixelColor(x, image.height() // 2).lightness() for x in range(0, 6))
    base = window.palette().color(QPalette.ColorRole.Base).lightness()
    assert frame - base > 60, (frame, base)
    save_screenshot(window, "compare-dark-live")
    set_theme(qapp, "light")
    qtbot.waitUntil(lambda: window.palette().color(QPalette.ColorRole.Window).lightness() > 200, timeout=2000)
    for plot in window.monitor.plots:
        assert lightness(plot.backgroundBrush().color()) > 200


def test_prompt_ticks_and_page_are_saved_a_moment_after_each_change(qtbot, open_window, settings_file):
    window = open_window()
    window.compare.prompt.setPlainText("kept after a crash")
    window.compare.max_tokens.setValue(33)
    window.evaluate.path.setText("/data/my-prompts.jsonl")
    window.evaluate.default_check.setCurrentText("contains")
    window.show_page("Server")
    window.server.port.setValue(8765)

    def stored(key: str):
        return QSettings(str(settings_file), QSettings.Format.IniFormat).value(key)

    qtbot.waitUntil(lambda: stored("compare/prompt") == "kept after a crash", timeout=AUTOSAVE_MS * 5)
    assert int(stored("compare/max_tokens")) == 33 and int(stored("server/port")) == 8765
    assert stored("window/page") == "Server" and stored("window/geometry") is not None
    assert stored("evaluate/prompt_set") == "/data/my-prompts.jsonl"
    assert stored("evaluate/default_check") == "contains"
