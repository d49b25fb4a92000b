"""The grid of GPU adapter slots: which adapter holds each slot, pinned or not, busy or idle."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QVBoxLayout, QWidget

from multilora_studio.engine.outputs import SlotState

COLUMNS = 8
STYLES = {
    "empty": "border: 1px dashed palette(mid);",
    "loaded": "border: 1px solid #1e88e5; background: rgba(30, 136, 229, 40);",
    "pinned": "border: 2px solid #8e24aa; background: rgba(142, 36, 170, 40);",
    "busy": "border: 2px solid #43a047; background: rgba(67, 160, 71, 70);",
}


class SlotCell(QFrame):
    def __init__(self, slot: int) -> None:
        super().__init__()
        self.slot = slot
        self.state = "empty"
        self.title = QLabel(f"slot {slot}")
        self.title.setStyleSheet("color: palette(placeholder-text); border: none; background: none;")
        self.adapter = QLabel("empty")
        self.adapter.setStyleSheet("border: none; background: none;")
        self.detail = QLabel("")
        self.detail.setStyleSheet("border: none; background: none;")
        for label in (self.title, self.adapter, self.detail):
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.adapter.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.title)
        layout.addWidget(self.adapter, 1)
        layout.addWidget(self.detail)
        self.setMinimumSize(96, 72)
        self._style()

    def show_state(self, state: SlotState) -> None:
        if state.adapter is None:
            kind = "empty"
        else:
            kind = "busy" if state.in_use else "pinned" if state.pinned else "loaded"
        self.adapter.setText(state.adapter or "empty")
        details = []
        if state.pinned:
            details.append("pinned")
        if state.in_use:
            details.append(f"busy ×{state.in_use}")
        self.detail.setText("  ".join(details))
        self.setToolTip(f"slot {state.slot}: {state.adapter or 'empty'}")
        if kind != self.state:
            self.state = kind
            self._style()

    def _style(self) -> None:
        self.setStyleSheet(f"SlotCell {{ {STYLES[self.state]} border-radius: 6px; }}")


class SlotGrid(QWidget):
    """One cell per slot (``max_loras`` of them), refreshed from each metrics snapshot."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.cells: list[SlotCell] = []
        self.grid = QGridLayout(self)
        self.grid.setSpacing(6)
        self.placeholder = QLabel("no engine")
        self.grid.addWidget(self.placeholder, 0, 0)

    def show_slots(self, slots: tuple[SlotState, ...]) -> None:
        if len(slots) != len(self.cells):
            self._rebuild(len(slots))
        for cell, state in zip(self.cells, slots, strict=True):
            cell.show_state(state)

    def _rebuild(self, count: int) -> None:
        for cell in self.cells:
            cell.setParent(None)
            cell.deleteLater()
        self.cells = [SlotCell(i) for i in range(count)]
        self.placeholder.setVisible(count == 0)
        for i, cell in enumerate(self.cells):
            self.grid.addWidget(cell, 1 + i // COLUMNS, i % COLUMNS)
