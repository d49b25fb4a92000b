"""Every table of every view shows its whole header texts in the window at its default size."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QStyle, QTableView, QTabWidget, QWidget

from multilora_studio.gui.main_window import DEFAULT_SIZE, PAGES


def reveal(widget: QWidget, view: QWidget) -> None:
    """Bring ``widget`` forward in every tab widget between it and ``view``."""
    child, parent = widget, widget.parentWidget()
    while parent is not None and child is not view:
        if isinstance(parent.parentWidget(), QTabWidget):  # a tab page sits in the tab widget's stack
            tabs = parent.parentWidget()
            tabs.setCurrentIndex(tabs.indexOf(child))
        child, parent = parent, parent.parentWidget()


def cut_headers(table: QTableView) -> list[str]:
    """The visible header sections narrower than their text needs (text and the style's margins)."""
    header = table.horizontalHeader()
    model = table.model()
    metrics = QFontMetrics(header.font())
    margins = 2 * header.style().pixelMetric(QStyle.PixelMetric.PM_HeaderMargin, None, header)
    cut = []
    for section in range(header.count()):
        text = model.headerData(section, Qt.Orientation.Horizontal, Qt.ItemDataRole.DisplayRole)
        if header.isSectionHidden(section) or not text:
            continue
        needs = max(metrics.horizontalAdvance(str(text)) + margins, header.sectionSizeHint(section))
        if header.sectionSize(section) < needs:
            cut.append(f"{text!r}: {header.sectionSize(section)} px of {needs}")
    return cut


def test_every_tables_headers_are_readable_at_the_default_window_size(qtbot, open_window):
    window = open_window()
    assert (window.width(), window.height()) == DEFAULT_SIZE
    checked, cut = 0, {}
    for page in PAGES:
        window.show_page(page)
        view = window.stack.currentWidget()
        for table in view.findChildren(QTableView):
            reveal(table, view)
            qtbot.wait(50)  # the layout settles
            if not (table.isVisible() and table.horizontalHeader().isVisible()):
                continue  # shown only in some states (another base's panel, a frozen column)
            checked += 1
            if found := cut_headers(table):
                cut[f"{page}: {table.objectName() or type(table).__name__}"] = found
    assert checked >= 5, checked
    assert cut == {}
