"""One base model of the window's pool as the Monitor shows it: its state (loaded, swapped out,
loading with progress), memory and KV cache, and its replicas' GPU slots and CPU RAM tiers."""

from __future__ import annotations

from PySide6.QtWidgets import QGroupBox, QLabel, QProgressBar, QVBoxLayout, QWidget

from multilora_studio.gui.base_states import LOADED, LOADING, PARKED, BaseState
from multilora_studio.gui.replica_panel import ReplicaPanel, replica_title
from multilora_studio.gui.widgets import format_bytes


def base_title(base: BaseState) -> str:
    """The panel's heading: the base, its state and, while loaded, how full it is."""
    metrics = base.metrics
    if base.state != LOADED or metrics is None:
        return f"{base.name}: {base.state}"
    held = sum(1 for slot in metrics.slots if slot.adapter is not None)
    used = metrics.kv_blocks_total - metrics.kv_blocks_free
    on_gpu = not metrics.device.startswith("cpu")
    memory = f"device memory {format_bytes(metrics.device_memory_bytes)} · " if on_gpu else ""
    return (
        f"{base.name}: loaded on {metrics.device} · {held} / {len(metrics.slots)} slots held · "
        f"{len(metrics.cpu_adapters)} adapters in CPU RAM · "
        f"KV {used} / {metrics.kv_blocks_total} blocks · {memory}{metrics.running} running, "
        f"{metrics.waiting} waiting"
    )


def base_note(base: BaseState) -> str:
    """What a base that is not loaded is doing, and why it may have failed."""
    served = f"{len(base.adapters)} adapters"
    if base.state == LOADING:
        message = base.progress[1] if base.progress else "loading"
        return f"{message} ({served} wait for it)"
    if base.state == LOADED:
        return ""
    if base.state == PARKED:
        in_ram = len(base.metrics.cpu_adapters) if base.metrics is not None else 0
        return (
            f"Swapped out to host memory with its engine: {served} ({in_ram} in CPU RAM) wait; "
            "its weights are copied back on its next request."
        )
    failed = f" Its last load failed: {base.error}" if base.error else ""
    return f"Swapped out: {served} wait on disk; the base loads on its next request.{failed}"


class BasePanel(QGroupBox):
    """See the module docstring; ``replicas`` holds one panel per replica while it is loaded."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.replicas: list[ReplicaPanel] = []
        self.replica_layout = QVBoxLayout()
        self.replica_layout.setContentsMargins(0, 0, 0, 0)
        layout = QVBoxLayout(self)
        layout.addWidget(self.note)
        layout.addWidget(self.progress)
        layout.addLayout(self.replica_layout)
        self.state = ""

    def show_base(self, base: BaseState, bases: int) -> None:
        """Show ``base`` (one of ``bases``: a lone base keeps the plain slot panels' title)."""
        self.state = base.state
        self.setTitle(base_title(base) if bases > 1 else "")
        self.setFlat(bases == 1)
        note = base_note(base)
        self.note.setText(note)
        self.note.setVisible(bool(note))
        loading = base.state == LOADING
        self.progress.setVisible(loading)
        if loading:
            self.progress.setValue(int(1000 * (base.progress[0] if base.progress else 0.0)))
        snaps = base.replicas if base.state == LOADED else ()
        while len(self.replicas) < len(snaps):
            panel = ReplicaPanel()
            self.replica_layout.addWidget(panel)
            self.replicas.append(panel)
        while len(self.replicas) > len(snaps):
            self.replicas.pop().deleteLater()
        for panel, (label, snap) in zip(self.replicas, snaps, strict=True):
            panel.show_metrics(replica_title(label, snap, len(snaps)), snap)
