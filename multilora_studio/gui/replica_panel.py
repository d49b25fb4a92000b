"""One engine replica's GPU adapter slots and CPU RAM tier, as the Monitor shows them (one panel
for one engine; one per replica when the engine is a replica set)."""

from __future__ import annotations

from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QListWidget, QVBoxLayout, QWidget

from multilora_studio.engine import EngineMetrics
from multilora_studio.gui.slot_grid import SlotGrid


class ReplicaPanel(QGroupBox):
    """The slots grid beside the host tier's adapters (most recent last)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.slots = SlotGrid()
        self.cpu_list = QListWidget()
        self.cpu_list.setMaximumHeight(160)
        self.cpu_list.setMaximumWidth(280)
        tier = QVBoxLayout()
        tier.addWidget(QLabel("CPU RAM tier (max_cpu_loras), most recent last"))
        tier.addWidget(self.cpu_list)
        tier.addStretch(1)
        layout = QHBoxLayout(self)
        layout.addWidget(self.slots, 3)
        layout.addLayout(tier, 1)

    def show_metrics(self, title: str, metrics: EngineMetrics | None) -> None:
        """Show one replica's snapshot (None: it reported none yet) under ``title``."""
        self.setTitle(title)
        self.slots.show_slots(metrics.slots if metrics is not None else ())
        names = list(metrics.cpu_adapters) if metrics is not None else []
        if self.cpu_names() != names:
            self.cpu_list.clear()
            self.cpu_list.addItems(names)

    def cpu_names(self) -> list[str]:
        return [self.cpu_list.item(i).text() for i in range(self.cpu_list.count())]


def replica_title(label: str, metrics: EngineMetrics | None, replicas: int) -> str:
    """The panel's heading: the slots alone for one engine; which replica, where, in what state
    and how full, for one of several."""
    if replicas == 1:
        return "GPU adapter slots (max_loras) and CPU RAM tier"
    if metrics is None:
        return f"Replica {label}: no snapshot yet"
    held = sum(1 for slot in metrics.slots if slot.adapter is not None)
    state = "" if metrics.state == "running" else f" ({metrics.state})"
    return (
        f"Replica {label} on {metrics.device}{state}: {held} / {len(metrics.slots)} slots held, "
        f"{len(metrics.cpu_adapters)} / {metrics.cpu_capacity} adapters in CPU RAM, "
        f"{metrics.running} running, {metrics.waiting} waiting"
    )
