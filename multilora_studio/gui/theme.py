"""Light and dark palettes: follow the operating system's color scheme, or a choice made in Settings."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle, QStyleOption, QWidget

DARK = {
    QPalette.ColorRole.Window: "#202124",
    QPalette.ColorRole.WindowText: "#e8eaed",
    QPalette.ColorRole.Base: "#171717",
    QPalette.ColorRole.AlternateBase: "#26282b",
    QPalette.ColorRole.ToolTipBase: "#303134",
    QPalette.ColorRole.ToolTipText: "#e8eaed",
    QPalette.ColorRole.PlaceholderText: "#9aa0a6",
    QPalette.ColorRole.Text: "#e8eaed",
    QPalette.ColorRole.Button: "#2d2f31",
    QPalette.ColorRole.ButtonText: "#e8eaed",
    QPalette.ColorRole.BrightText: "#ff5252",
    QPalette.ColorRole.Highlight: "#2f6fd6",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Link: "#8ab4f8",
    QPalette.ColorRole.Mid: "#5f6368",
    QPalette.ColorRole.Light: "#4a4d51",
    QPalette.ColorRole.Midlight: "#3c4043",
    QPalette.ColorRole.Dark: "#141414",
    QPalette.ColorRole.Shadow: "#000000",
}
FRAMED_INDICATORS = (
    QStyle.PrimitiveElement.PE_IndicatorCheckBox,
    QStyle.PrimitiveElement.PE_IndicatorRadioButton,
)


class StudioStyle(QProxyStyle):
    """Fusion, with a visible frame around check boxes and radio buttons on dark palettes.

    Fusion outlines indicators in a shade of the window color, which vanishes against a dark base.
    """

    def drawPrimitive(
        self,
        element: QStyle.PrimitiveElement,
        option: QStyleOption,
        painter: QPainter,
        widget: QWidget | None = None,
    ) -> None:
        super().drawPrimitive(element, option, painter, widget)
        light = option.palette.color(QPalette.ColorRole.Window).lightness() > 128
        if element not in FRAMED_INDICATORS or light:
            return
        painter.save()
        round_indicator = element == QStyle.PrimitiveElement.PE_IndicatorRadioButton
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, round_indicator)
        painter.setPen(option.palette.color(QPalette.ColorRole.PlaceholderText))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        box = option.rect.adjusted(0, 0, -1, -1)
        if round_indicator:
            painter.drawEllipse(box)
        else:
            painter.drawRect(box)
        painter.restore()


THEMES = ("system", "light", "dark")
THEME_PROPERTY = "studioTheme"


def is_dark(app: QApplication) -> bool:
    """Whether the theme chosen (``system`` by default: the OS scheme) is dark."""
    mode = app.property(THEME_PROPERTY) or "system"
    if mode == "system":
        return app.styleHints().colorScheme() == Qt.ColorScheme.Dark
    return mode == "dark"


def set_theme(app: QApplication, mode: str) -> bool:
    """Choose ``system``, ``light`` or ``dark`` and apply it; returns True for dark."""
    app.setProperty(THEME_PROPERTY, mode if mode in THEMES else "system")
    return apply_theme(app)


def apply_theme(app: QApplication) -> bool:
    """Fusion style with the chosen palette, applied to every open widget and plot; True for dark."""
    if not isinstance(app.style(), StudioStyle):
        app.setStyle(StudioStyle("Fusion"))
    dark = is_dark(app)
    palette = app.style().standardPalette()
    if dark:
        for role, color in DARK.items():
            palette.setColor(role, QColor(color))
        palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#6f7378"))
        palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#6f7378"))
    app.setPalette(palette)
    pg.setConfigOptions(
        antialias=True, background=plot_background(palette), foreground=plot_foreground(palette)
    )
    for widget in app.allWidgets():  # style sheets resolve palette(...) colors when they are set
        sheet = widget.styleSheet()
        if sheet:
            widget.setStyleSheet(sheet)
    return dark


def follow_os_theme(app: QApplication) -> None:
    """Apply the theme now and again whenever the OS switches between light and dark."""
    apply_theme(app)
    app.styleHints().colorSchemeChanged.connect(lambda scheme: apply_theme(app))


def plot_background(palette: QPalette) -> QColor:
    return palette.color(QPalette.ColorRole.Base)


def plot_foreground(palette: QPalette) -> QColor:
    return palette.color(QPalette.ColorRole.Text)
